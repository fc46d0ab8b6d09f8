// Host helpers shared by the CUDA backends: the kernel parameters of a validated Problem, pointer checks.
#pragma once

#include "core/backend.hpp"
#include "core/problem.hpp"
#include "cuda/fwd_params.hpp"

namespace flashattn::cuda {

FwdParams make_fwd_params(const detail::Problem& p);

// A tensor the kernel will read must be device memory of the device it runs on (a host pointer labelled
// CUDA would otherwise fault the context). Null pointers (absent optional tensors) pass.
detail::Error check_device_pointer(const char* name, const void* ptr, int device);

namespace sm80 {
const detail::Backend& backend();
// Whether the sm80 kernels contain code this device can run (the build's FLASHATTN_SM80_ARCHS).
cudaError_t kernels_runnable(int device);
}  // namespace sm80

namespace sm90 {
const detail::Backend& backend();
// Whether the sm90a kernels can run on this device (built only when FLASHATTN_CUDA_ARCHS lists 90a).
cudaError_t kernels_runnable(int device);
}  // namespace sm90

}  // namespace flashattn::cuda
