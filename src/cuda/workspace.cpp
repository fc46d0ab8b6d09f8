#include "cuda/workspace.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/device.hpp"

namespace flashattn::cuda {
namespace {

struct Cached {
  void* data = nullptr;
  size_t bytes = 0;
  int* counter = nullptr;  // the counters (workspace.hpp), allocated at the first call that wants them
  int64_t counter_ints = 0;
};
constexpr size_t kMinBytes = 256;        // the smallest buffer kept: a tile counter needs 4 bytes, split-KV more
constexpr int64_t kMinCounterInts = 64;  // the fewest counters kept: a tile counter and most decode calls' arrivals

std::mutex g_mutex;
std::map<std::pair<int, cudaStream_t>, Cached>& cache() {
  static auto* c = new std::map<std::pair<int, cudaStream_t>, Cached>();  // never destroyed: the driver may
  return *c;                                                              // be gone at exit
}

}  // namespace

Workspace::~Workspace() { release(); }

detail::Error Workspace::acquire(int device, cudaStream_t stream, size_t bytes, int64_t counter_ints) {
  const bool counter = counter_ints > 0;
  data_ = nullptr;
  counter_ = nullptr;
  stream_ = stream;
  transient_ = false;
  if (bytes == 0 && !counter) return detail::ok();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    return runtime_error("cudaStreamIsCapturing", e);
  // cudaStreamPerThread is one handle for a different stream in every host thread, whose calls may run at once (and a
  // thread's id may be reused once it exits): no cached buffer can be keyed by it, so its calls get their own, as
  // captured calls do.
  if (capture != cudaStreamCaptureStatusNone || stream == cudaStreamPerThread) {
    if (bytes == 0) return detail::ok();
    if (cudaError_t e = cudaMallocAsync(&data_, bytes, stream); e != cudaSuccess)
      return runtime_error("workspace of " + std::to_string(bytes) + " bytes (cudaMallocAsync, uncached)", e);
    transient_ = true;
    return detail::ok();
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  Cached& c = cache()[{device, stream}];
  if (counter && c.counter_ints < counter_ints) {
    // The old counters are zero (every kernel that took them left them so) and the stream orders their last use
    // before the free.
    if (c.counter != nullptr) {
      if (cudaError_t e = cudaFreeAsync(c.counter, stream); e != cudaSuccess)
        return runtime_error("counters (cudaFreeAsync)", e);
      c.counter = nullptr, c.counter_ints = 0;
    }
    const int64_t want = std::max<int64_t>(counter_ints, kMinCounterInts);
    void* p = nullptr;
    if (cudaError_t e = cudaMallocAsync(&p, size_t(want) * sizeof(int), stream); e != cudaSuccess)
      return runtime_error("counters (cudaMallocAsync)", e);
    if (cudaError_t e = cudaMemsetAsync(p, 0, size_t(want) * sizeof(int), stream); e != cudaSuccess) {
      cudaFreeAsync(p, stream);
      return runtime_error("counters (cudaMemsetAsync)", e);
    }
    c.counter = static_cast<int*>(p);
    c.counter_ints = want;
  }
  if (counter) counter_ = c.counter;
  if (c.bytes < bytes) {
    if (c.data != nullptr) {
      if (cudaError_t e = cudaFreeAsync(c.data, stream); e != cudaSuccess) return runtime_error("cudaFreeAsync", e);
      c.data = nullptr, c.bytes = 0;  // the counter stays
    }
    const size_t want = bytes < kMinBytes ? kMinBytes : bytes;
    if (cudaError_t e = cudaMallocAsync(&c.data, want, stream); e != cudaSuccess)
      return runtime_error("workspace of " + std::to_string(want) + " bytes (cudaMallocAsync)", e);
    c.bytes = want;
  }
  data_ = c.data;
  return detail::ok();
}

detail::Error Workspace::release() {
  if (!transient_ || data_ == nullptr) return detail::ok();
  void* p = data_;
  data_ = nullptr;
  transient_ = false;
  if (cudaError_t e = cudaFreeAsync(p, stream_); e != cudaSuccess) return runtime_error("cudaFreeAsync", e);
  return detail::ok();
}

}  // namespace flashattn::cuda
