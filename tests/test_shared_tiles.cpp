// SharedTiles (src/cpu/shared_tiles.hpp), the forward's K/V tiles shared by the threads of one head: every tile made
// exactly once per key however many threads ask, complete before any caller reads it, kept for a later caller of
// the same key, and a slot taken by another key only once its readers have released it.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "cpu/shared_tiles.hpp"

namespace {

using flashattn::cpu::SharedTiles;
constexpr int kTiles = 64, kTileFloats = 256;

// Tile t of key k holds k * 1000 + t in every float; `made` counts the fills per tile.
auto filler(int64_t key, std::vector<std::atomic<int>>& made) {
  return [key, &made](int t, float* data) {
    made[size_t(t)].fetch_add(1);
    for (int i = 0; i < kTileFloats; ++i) data[t * kTileFloats + i] = float(key * 1000 + t);
  };
}

bool holds(const float* data, int64_t key) {
  for (int t = 0; t < kTiles; ++t)
    for (int i = 0; i < kTileFloats; ++i)
      if (data[t * kTileFloats + i] != float(key * 1000 + t)) return false;
  return true;
}

TEST(CpuSharedTiles, EachTileMadeOnceForConcurrentCallers) {
  SharedTiles tiles;
  ASSERT_TRUE(tiles.init(2, size_t(kTiles) * kTileFloats));
  for (int64_t key : {7, 8, 7}) {  // 7 again: a third slot use after 8, kept or remade, never half made
    std::vector<std::atomic<int>> made(kTiles);
    std::atomic<int> complete{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([&] {
        const float* data = tiles.acquire(key, kTiles, filler(key, made));
        if (data != nullptr && holds(data, key)) complete.fetch_add(1);
        if (data != nullptr) tiles.release(data);
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(complete.load(), 8) << "key " << key;
    for (int t = 0; t < kTiles; ++t) EXPECT_LE(made[size_t(t)].load(), 1) << "key " << key << " tile " << t;
  }
}

TEST(CpuSharedTiles, KeptForTheSameKeyAndTakenOnlyWhenReleased) {
  SharedTiles tiles;
  ASSERT_TRUE(tiles.init(1, size_t(kTiles) * kTileFloats));
  std::vector<std::atomic<int>> made1(kTiles), made2(kTiles), again(kTiles);
  const float* one = tiles.acquire(1, kTiles, filler(1, made1));
  ASSERT_NE(one, nullptr);
  EXPECT_TRUE(holds(one, 1));
  // The only slot is held by key 1: key 2 gets none (its caller converts its own tiles), and nothing is made.
  EXPECT_EQ(tiles.acquire(2, kTiles, filler(2, made2)), nullptr);
  for (auto& m : made2) EXPECT_EQ(m.load(), 0);
  tiles.release(one);
  // Released and asked for by the same key: kept, not made again.
  const float* kept = tiles.acquire(1, kTiles, filler(1, again));
  ASSERT_EQ(kept, one);
  for (auto& m : again) EXPECT_EQ(m.load(), 0);
  tiles.release(kept);
  // Released and asked for by another key: remade for it.
  const float* two = tiles.acquire(2, kTiles, filler(2, made2));
  ASSERT_NE(two, nullptr);
  EXPECT_TRUE(holds(two, 2));
  for (auto& m : made2) EXPECT_EQ(m.load(), 1);
  tiles.release(two);
}

}  // namespace
