// Device workspace of a launch (plan.workspace_bytes), without an allocation per call.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "core/problem.hpp"

namespace flashattn::cuda {

// Eager calls get a buffer cached per (device, stream): the stream orders every use of it, and it is only
// replaced (the old one freed in stream order) when a call needs more. Calls captured into a CUDA graph get a
// buffer of the graph's own (cudaMallocAsync / cudaFreeAsync become the graph's memory nodes), so a replay never
// shares memory with eager calls or other graphs, whatever stream it is replayed on.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();
  detail::Error acquire(int device, cudaStream_t stream, size_t bytes);
  void* data() const { return data_; }
  // Frees a graph-owned buffer after the launch (stream-ordered); cached buffers stay.
  detail::Error release();

 private:
  void* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool transient_ = false;
};

}  // namespace flashattn::cuda
