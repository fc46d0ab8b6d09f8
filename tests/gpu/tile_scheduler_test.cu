// Host-side checks of the sm90 forward's tile scheduler (src/cuda/sm90/tile_scheduler.cuh) and of the sm90
// backward's CTA order (src/cuda/sm90/bwd_order.hpp). The scheduler's tile() divides with
// divisors built on the host (cutlass::FastDivmod), and must give what plain division gives, for the static order and
// the longest-first order in sections, including a first section with fewer (batch, head) pairs, and split-KV. Every
// tile index maps to a distinct (query block, head, batch, split). Compiled by nvcc, run on the host (label fast).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "cuda/sm90/bwd_order.hpp"
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

// The backward's CTA order: every grid position takes a distinct (key block, head, batch) of the grid; positions
// outside the tail keep theirs; the tail's positions, in launch order, take key blocks in non-decreasing order with
// the tail's pairs fastest; deterministic mode reverses the key blocks and takes no tail.
TEST(Sm90BwdOrder, TailIsKeyBlockMajorBijection) {
  using flashattn::cuda::sm90::bwd_cta;
  using flashattn::cuda::sm90::BwdCta;
  int configs = 0;
  for (const int nx : {1, 2, 4, 7, 32})
    for (const int ny : {1, 3, 16})
      for (const int nz : {1, 2, 5})
        for (const int tail : {0, 1, 2, 3, 7, 1000}) {
          const int pairs = ny * nz, tail_pairs = std::min(tail, pairs);
          for (const bool descending : {false, true}) {
            const std::string what = "grid " + std::to_string(nx) + "x" + std::to_string(ny) + "x" +
                                     std::to_string(nz) + " tail_pairs " + std::to_string(tail_pairs) + " descending " +
                                     std::to_string(descending);
            std::set<std::tuple<int, int, int>> seen;
            int last_tail_n = -1;
            for (int z = 0; z < nz; ++z)
              for (int y = 0; y < ny; ++y)
                for (int x = 0; x < nx; ++x) {
                  const BwdCta c = bwd_cta(x, y, z, nx, ny, nz, tail_pairs, descending);
                  ASSERT_TRUE(c.n_block >= 0 && c.n_block < nx && c.head >= 0 && c.head < ny && c.batch >= 0 &&
                              c.batch < nz)
                      << what;
                  seen.insert({c.n_block, c.head, c.batch});
                  const bool in_tail = !descending && tail_pairs > 1 && y + ny * z >= pairs - tail_pairs;
                  if (descending) {
                    ASSERT_EQ(std::make_tuple(c.n_block, c.head, c.batch), std::make_tuple(nx - 1 - x, y, z)) << what;
                  } else if (!in_tail) {
                    ASSERT_EQ(std::make_tuple(c.n_block, c.head, c.batch), std::make_tuple(x, y, z)) << what;
                  } else {
                    ASSERT_GE(c.n_block, last_tail_n) << what;                     // key block major through the tail
                    ASSERT_GE(c.head + ny * c.batch, pairs - tail_pairs) << what;  // stays among the tail's pairs
                    last_tail_n = c.n_block;
                  }
                }
            ASSERT_EQ(int(seen.size()), nx * ny * nz) << what;
            // A tail past the pairs is every pair's (the plan never asks for one).
            const BwdCta over = bwd_cta(nx - 1, ny - 1, nz - 1, nx, ny, nz, pairs + 5, descending);
            ASSERT_TRUE(over.n_block >= 0 && over.head >= 0 && over.batch >= 0) << what;
            ++configs;
          }
        }
  EXPECT_EQ(configs, 5 * 3 * 3 * 6 * 2);
}

// The plan's tail: none without falling lengths, in deterministic mode, or with one key block or one pair; else the
// pairs that hold tail_ctas CTAs, at most all of them.
TEST(Sm90BwdOrder, TailPairs) {
  using flashattn::cuda::sm90::bwd_tail_pairs;
  EXPECT_EQ(bwd_tail_pairs(512, 4, 264, true, false), 66);
  EXPECT_EQ(bwd_tail_pairs(512, 5, 264, true, false), 53);
  EXPECT_EQ(bwd_tail_pairs(16, 128, 264, true, false), 3);
  EXPECT_EQ(bwd_tail_pairs(2, 4, 264, true, false), 2);
  EXPECT_EQ(bwd_tail_pairs(512, 4, 264, false, false), 0);
  EXPECT_EQ(bwd_tail_pairs(512, 4, 264, true, true), 0);
  EXPECT_EQ(bwd_tail_pairs(512, 1, 264, true, false), 0);
  EXPECT_EQ(bwd_tail_pairs(1, 4, 264, true, false), 0);
}

}  // namespace
