// Small CUDA runtime helpers shared by the CUDA backends (host code).
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "core/problem.hpp"

namespace flashattn::cuda {

inline detail::Error runtime_error(const std::string& what, cudaError_t e) {
  return detail::backend_error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Makes `device` current for the scope and restores the caller's device after (callers' state is theirs).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Compute capability as major * 10 + minor, or an error naming why there is none.
detail::Error device_arch(int device, int* arch);

}  // namespace flashattn::cuda
