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
// Eager calls of the sm90 forward's dynamic schedule also get a tile counter cached per (device, stream): an int
// zeroed once when it is allocated and that every kernel taking it leaves at zero (sm90/tile_scheduler.cuh), so
// such a call needs no memset. Nothing else writes it (the buffer above holds other calls' data at any offset).
// Captured calls get none: a graph-owned workspace holds no value from one replay to the next, and two graphs
// replayed on different streams would share a cached counter; their launch zeroes the workspace's first int.
// Calls on cudaStreamPerThread (one handle, a stream per host thread) get an uncached buffer and no counter, as
// captured ones do.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();
  // `counter`: the call also wants the per-stream tile counter (eager calls only; counter() stays null otherwise).
  detail::Error acquire(int device, cudaStream_t stream, size_t bytes, bool counter = false);
  void* data() const { return data_; }
  int* counter() const { return counter_; }
  // Frees a graph-owned buffer after the launch (stream-ordered); cached buffers stay.
  detail::Error release();

 private:
  void* data_ = nullptr;
  int* counter_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool transient_ = false;
};

}  // namespace flashattn::cuda
