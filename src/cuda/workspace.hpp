// Device workspace of a launch (plan.workspace_bytes), without an allocation per call.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/problem.hpp"

namespace flashattn::cuda {

// Eager calls get a buffer cached per (device, stream): the stream orders every use of it, and it is only
// replaced (the old one freed in stream order) when a call needs more. Calls captured into a CUDA graph get a
// buffer of the graph's own (cudaMallocAsync / cudaFreeAsync become the graph's memory nodes), so a replay never
// shares memory with eager calls or other graphs, whatever stream it is replayed on.
// Eager calls of the sm90 forward that need counters (its dynamic schedule's tile counter, the fused split-KV
// merge's arrivals: FwdPlan::counter_ints) also get them cached per (device, stream): ints zeroed once when they are
// allocated (again when a call needs more) and that every kernel taking them leaves at zero
// (sm90/tile_scheduler.cuh, sm90/fwd_epilogue.cuh), so such a call needs no memset. Nothing else writes them (the
// buffer above holds other calls' data at any offset). Captured calls get none: a graph-owned workspace holds no
// value from one replay to the next, and two graphs replayed on different streams would share cached counters;
// their launch zeroes the workspace's first ints.
// Calls on cudaStreamPerThread (one handle, a stream per host thread) get an uncached buffer and no counter, as
// captured ones do.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();
  // `counter_ints`: the call also wants that many per-stream counters (eager calls only; counter() stays null
  // otherwise).
  detail::Error acquire(int device, cudaStream_t stream, size_t bytes, int64_t counter_ints = 0);
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
