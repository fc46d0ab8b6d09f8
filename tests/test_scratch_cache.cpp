// The CPU backend's scratch cache (src/cpu/tiles.hpp): large blocks handed back are handed out again to a later
// request of about their size instead of fresh memory, never to two holders at once, and the kept total stays under
// the limit (the oldest blocks go first).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu/scratch.hpp"
#include "cpu/tiles.hpp"

namespace {

namespace cpu = flashattn::cpu;

void* take(std::size_t want, std::size_t* got = nullptr) {
  std::size_t bytes = want;
  void* block = cpu::scratch_take(&bytes);
  EXPECT_NE(block, nullptr);
  EXPECT_GE(bytes, want);
  if (got != nullptr) *got = bytes;
  return block;
}

// The tests below need room for a few blocks: FLASHATTN_CPU_SCRATCH_CACHE_MB, when set, must leave 64 MiB or more.
#define SKIP_WITHOUT_ROOM()                                 \
  if (cpu::scratch_cache_limit() < (std::size_t(64) << 20)) \
  GTEST_SKIP() << "FLASHATTN_CPU_SCRATCH_CACHE_MB leaves less than 64 MiB"

TEST(CpuScratchCache, LargeBlockReusedForItsSizeOnly) {
  SKIP_WITHOUT_ROOM();
  const std::size_t size = (std::size_t(3) << 20) + 4096;
  std::size_t got = 0;
  void* a = take(size, &got);
  ASSERT_EQ(got, size);
  cpu::scratch_give(a, got);
  // A larger request, or one that would waste more than a quarter of the block, gets other memory.
  void* larger = take(size + 64);
  void* smaller = take(size / 2);
  EXPECT_NE(larger, a);
  EXPECT_NE(smaller, a);
  // A request of the same size, or up to a quarter less, gets the block back, whole.
  void* again = take(size - size / 8, &got);
  EXPECT_EQ(again, a);
  EXPECT_EQ(got, size);
  std::memset(again, 1, got);
  // Taken, the block is no longer kept: the next request of its size gets other memory.
  void* other = take(size);
  EXPECT_NE(other, again);
  for (void* b : {again, other}) cpu::scratch_give(b, size);
  cpu::scratch_give(larger, size + 64);
  cpu::scratch_give(smaller, size / 2);
}

TEST(CpuScratchCache, SmallBlocksNotKept) {
  const std::size_t before = cpu::scratch_cached_bytes();
  void* small = take(cpu::kScratchCacheMin - 64);
  cpu::scratch_give(small, cpu::kScratchCacheMin - 64);
  EXPECT_EQ(cpu::scratch_cached_bytes(), before);
}

// Under FLASHATTN_CPU_SCRATCH_CACHE_MB=0 (the test_scratch_cache_off entry of tests/CMakeLists.txt) nothing is kept.
TEST(CpuScratchCache, NothingKeptUnderALimitOfZero) {
  if (cpu::scratch_cache_limit() != 0) GTEST_SKIP() << "FLASHATTN_CPU_SCRATCH_CACHE_MB is not 0";
  void* block = take(std::size_t(4) << 20);
  cpu::scratch_give(block, std::size_t(4) << 20);
  EXPECT_EQ(cpu::scratch_cached_bytes(), 0u);
  cpu::FloatBuffer buf(std::size_t(1) << 20);
  ASSERT_NE(buf.data(), nullptr);
  buf.reset(0);
  EXPECT_EQ(cpu::scratch_cached_bytes(), 0u);
}

TEST(CpuScratchCache, OldestEvictedToStayUnderTheLimit) {
  SKIP_WITHOUT_ROOM();
  const std::size_t limit = cpu::scratch_cache_limit();
  const std::size_t size = limit / 3 + 4096;  // three do not fit together
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(take(size));
  for (void* b : blocks) cpu::scratch_give(b, size);
  EXPECT_LE(cpu::scratch_cached_bytes(), limit);
  // The two newest are kept, the two oldest were freed.
  void* x = take(size);
  void* y = take(size);
  EXPECT_TRUE((x == blocks[2] && y == blocks[3]) || (x == blocks[3] && y == blocks[2]));
  cpu::scratch_give(x, size);
  cpu::scratch_give(y, size);
}

TEST(CpuScratchCache, FloatBufferReusesAndNeverSharesABlock) {
  SKIP_WITHOUT_ROOM();
  {
    cpu::FloatBuffer first(std::size_t(5) << 18);  // 5 MiB of floats
    ASSERT_NE(first.data(), nullptr);
    const float* p = first.data();
    first.reset(0);
    cpu::FloatBuffer second(std::size_t(5) << 18);
    EXPECT_EQ(second.data(), p);
  }
  // Eight threads take, fill, check and return blocks of a few sizes: a block handed to two holders at once would
  // carry the other's fill.
  std::vector<std::thread> threads;
  std::vector<int> bad(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([t, &bad] {
      for (int round = 0; round < 200; ++round) {
        const std::size_t n = (std::size_t(1) << 18) * std::size_t(1 + (t + round) % 3);
        cpu::FloatBuffer buf(n);
        if (buf.data() == nullptr) {
          ++bad[size_t(t)];
          continue;
        }
        float* d = buf.data();
        for (std::size_t i = 0; i < n; i += 1024) d[i] = float(t * 1000 + round);
        std::this_thread::yield();
        for (std::size_t i = 0; i < n; i += 1024) bad[size_t(t)] += d[i] != float(t * 1000 + round);
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(bad[size_t(t)], 0) << "thread " << t;
}

}  // namespace
