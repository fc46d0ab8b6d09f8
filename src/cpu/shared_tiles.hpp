// fp32 tiles of one (sequence, KV head) that every thread working on that head reads: converted once, by whichever
// threads arrive while they are being converted, instead of once per thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "cpu/scratch.hpp"

namespace flashattn::cpu {

class SharedTiles {
 public:
  // `slots` (sequence, KV head) pairs held at once, `floats` each. Returns false when an allocation failed.
  bool init(int slots, size_t floats) {
    slots_ = std::make_unique<Slot[]>(size_t(slots));
    count_ = slots;
    for (int i = 0; i < slots; ++i)
      if (!slots_[i].data.reset(floats)) return false;
    return true;
  }

  // The tiles of `key`: its `ntiles` tiles made by `fill(tile, data)` on first use, the callers that find them
  // unfinished sharing the tiles left; or nullptr when every slot holds another key in use (the caller then converts
  // its own tiles). Every acquire that returns tiles needs its release.
  template <class Fill>
  const float* acquire(int64_t key, int ntiles, Fill&& fill) {
    Slot* s = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int i = 0; i < count_ && s == nullptr; ++i)
        if (slots_[i].key == key) s = &slots_[i];
      for (int i = 0; i < count_ && s == nullptr; ++i)
        if (slots_[i].users == 0) {  // no reader left: the slot may take another key
          s = &slots_[i];
          s->key = key;
          s->ntiles = ntiles;
          s->next.store(0, std::memory_order_relaxed);
          s->done.store(0, std::memory_order_relaxed);
        }
      if (s == nullptr) return nullptr;
      ++s->users;
    }
    // The ntiles of one key never change (a key is one (sequence, KV head)), so a slot found by key has them.
    for (int t; (t = s->next.fetch_add(1, std::memory_order_relaxed)) < s->ntiles;) {
      fill(t, s->data.data());
      s->done.fetch_add(1, std::memory_order_release);
    }
    // The tiles others claimed: each is being made by a running thread, which never waits here for another key.
    while (s->done.load(std::memory_order_acquire) < s->ntiles) std::this_thread::yield();
    return s->data.data();
  }

  void release(const float* tiles) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < count_; ++i)
      if (slots_[i].data.data() == tiles) --slots_[i].users;
  }

 private:
  struct Slot {
    int64_t key = -1;
    int ntiles = 0;
    int users = 0;  // acquires not yet released (under mutex_)
    std::atomic<int> next{0}, done{0};
    FloatBuffer data;
  };
  std::unique_ptr<Slot[]> slots_;
  int count_ = 0;
  std::mutex mutex_;
};

}  // namespace flashattn::cpu
