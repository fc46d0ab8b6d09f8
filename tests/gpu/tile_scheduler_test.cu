// Host-side checks of the sm90 forward's tile scheduler (src/cuda/sm90/tile_scheduler.cuh): tile() divides with
// divisors built on the host (cutlass::FastDivmod), and must give what plain division gives, for the static order and
// the longest-first order in sections, including a first section with fewer (batch, head) pairs, and split-KV. Every
// tile index maps to a distinct (query block, head, batch, split). Compiled by nvcc, run on the host (label fast).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "cuda/sm90/tile_scheduler.cuh"

namespace {

using flashattn::cuda::sm90::TileScheduler;

// The order of TileScheduler::tile as plain integer division (its form before the host-built divisors).
TileScheduler::Tile plain_tile(int idx, int m_blocks, int heads, int batch, int splits, bool longest_first,
                               int section_heads) {
  const int split = idx % splits;
  idx /= splits;
  int m, hb;
  if (longest_first) {
    // Sections of section_heads (batch, head) pairs, the remainder's smaller section first.
    const int hb_count = heads * batch;
    const int small = hb_count % section_heads;
    int first_hb, section_hb, r;
    if (idx < small * m_blocks) {
      first_hb = 0;
      section_hb = small;
      r = idx;
    } else {
      const int section = (idx - small * m_blocks) / (section_heads * m_blocks);
      first_hb = small + section * section_heads;
      section_hb = section_heads;
      r = idx - first_hb * m_blocks;
    }
    m = m_blocks - 1 - r / section_hb;
    hb = first_hb + r % section_hb;
  } else {
    m = idx % m_blocks;
    hb = idx / m_blocks;
  }
  return {m, hb % heads, hb / heads, split};
}

TEST(Sm90TileScheduler, HostDivisorsMatchPlainDivision) {
  int configs = 0;
  for (const int m_blocks : {1, 2, 3, 7, 64, 129})
    for (const int heads : {1, 3, 16, 32})
      for (const int batch : {1, 2, 5})
        for (const int splits : {1, 2, 3, 16})
          for (const bool longest_first : {false, true})
            for (const int section_heads : {1, 2, 4, 5, 7, 1000}) {
              if (!longest_first && section_heads != 1) continue;
              const int group = heads % 4 == 0 ? 4 : 1;
              const TileScheduler s =
                  TileScheduler::make(m_blocks, heads, batch, splits, longest_first, section_heads, group, nullptr);
              ASSERT_EQ(s.count(), m_blocks * heads * batch * splits);
              std::set<std::tuple<int, int, int, int>> seen;
              const std::string what = "m_blocks " + std::to_string(m_blocks) + " heads " + std::to_string(heads) +
                                       " batch " + std::to_string(batch) + " splits " + std::to_string(splits) +
                                       " longest_first " + std::to_string(longest_first) + " section_heads " +
                                       std::to_string(section_heads);
              for (int idx = 0; idx < s.count(); ++idx) {
                const TileScheduler::Tile t = s.tile(idx);
                const TileScheduler::Tile r =
                    plain_tile(idx, m_blocks, heads, batch, splits, longest_first, section_heads);
                ASSERT_EQ(std::make_tuple(t.m_block, t.head, t.batch, t.split),
                          std::make_tuple(r.m_block, r.head, r.batch, r.split))
                    << what << " idx " << idx;
                ASSERT_TRUE(t.m_block >= 0 && t.m_block < m_blocks && t.head >= 0 && t.head < heads && t.batch >= 0 &&
                            t.batch < batch && t.split >= 0 && t.split < splits)
                    << what << " idx " << idx;
                seen.insert({t.m_block, t.head, t.batch, t.split});
              }
              ASSERT_EQ(int(seen.size()), s.count()) << what;
              for (int h = 0; h < heads; ++h) ASSERT_EQ(s.kv_head(h), h / group) << what;
              ++configs;
            }
  EXPECT_GT(configs, 1000);
}

// Tile counts near the int range the plan allows: the divisors stay exact for large indices.
TEST(Sm90TileScheduler, LargeIndices) {
  const TileScheduler s = TileScheduler::make(4096, 96, 4096, 1, true, 12, 8, nullptr);
  for (int idx : {0, 1, s.count() / 3, s.count() / 2 + 17, s.count() - 2, s.count() - 1}) {
    const TileScheduler::Tile t = s.tile(idx);
    const TileScheduler::Tile r = plain_tile(idx, 4096, 96, 4096, 1, true, 12);
    EXPECT_EQ(std::make_tuple(t.m_block, t.head, t.batch), std::make_tuple(r.m_block, r.head, r.batch)) << idx;
  }
  // 96 * 4096 pairs in sections of 7: a smaller first section of 5 pairs.
  const TileScheduler f = TileScheduler::make(4096, 96, 4096, 1, true, 7, 8, nullptr);
  for (int idx : {0, 1, 5 * 4096 - 1, 5 * 4096, 5 * 4096 + 1, f.count() / 2 + 17, f.count() - 1}) {
    const TileScheduler::Tile t = f.tile(idx);
    const TileScheduler::Tile r = plain_tile(idx, 4096, 96, 4096, 1, true, 7);
    EXPECT_EQ(std::make_tuple(t.m_block, t.head, t.batch), std::make_tuple(r.m_block, r.head, r.batch)) << idx;
  }
  const TileScheduler u = TileScheduler::make(4096, 96, 4096, 1, false, 1, 1, nullptr);
  for (int idx : {0, u.count() / 2 + 17, u.count() - 1}) {
    const TileScheduler::Tile t = u.tile(idx);
    EXPECT_EQ(std::make_tuple(t.m_block, t.head, t.batch),
              std::make_tuple(idx % 4096, idx / 4096 % 96, idx / 4096 / 96));
  }
}

}  // namespace
