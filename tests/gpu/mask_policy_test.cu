// Host-side checks of the mask policies' block arithmetic (src/cuda/common/fwd_policies.cuh), which the kernels'
// mainloops rely on: a key block outside unmasked_blocks() runs the masked (edge) step and one inside it the
// unmasked (interior) step, so unmasked_blocks() must hold exactly the visited blocks that need no mask, and a block
// that needs no mask must be entirely visible to every query row of the tile. Compiled by nvcc, run on the host
// (label fast: no GPU needed).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/common/bwd_common.cuh"
#include "cuda/common/fwd_policies.cuh"
#include "cuda/sm90/bwd_mask_band.cuh"
#include "cuda/sm90/bwd_traits.cuh"
#include "cuda/sm90/gemm.cuh"

namespace {

using flashattn::cuda::BlockRange;
using flashattn::cuda::ColRange;
using flashattn::cuda::DiagBand;
using flashattn::cuda::FwdParams;
using flashattn::cuda::KeyLengthMask;
using flashattn::cuda::QueryBlocks;
using flashattn::cuda::SeqInfo;
using flashattn::cuda::WindowMask;

// Every query tile of every block size: unmasked_blocks() == {visited blocks with block_needs_mask false}, and those
// blocks are fully visible to each row of the tile (cols() of the row covers them).
template <class Mask>
void check(const Mask& mask, int len_q, const std::string& what) {
  for (const int block_m : {64, 128}) {
    for (const int block_n : {32, 64, 128}) {
      for (int m0 = 0; m0 < len_q; m0 += block_m) {
        const int rows = std::min(block_m, len_q - m0);
        const BlockRange range = mask.blocks(m0, rows, block_n);
        const BlockRange inner = mask.unmasked_blocks(m0, rows, block_n);
        for (int n = range.lo; n < range.hi; ++n) {
          const int n0 = n * block_n;
          const bool interior = n >= inner.lo && n < inner.hi;
          ASSERT_EQ(mask.block_needs_mask(m0, rows, n0, block_n), !interior)
              << what << " block_m " << block_m << " block_n " << block_n << " m0 " << m0 << " n " << n;
          if (!interior) continue;
          for (int r = m0; r < m0 + rows; ++r) {
            const ColRange cols = mask.cols(r);
            ASSERT_TRUE(cols.lo <= n0 && n0 + block_n <= cols.hi)
                << what << " row " << r << " sees [" << cols.lo << ", " << cols.hi << ") but block " << n
                << " is unmasked";
          }
        }
      }
    }
  }
}

FwdParams problem(int len_q, int len_k) {
  FwdParams p;
  p.seqlen_q = len_q;
  p.seqlen_k = len_k;
  return p;
}

FwdParams window_problem(int len_q, int len_k, bool bottom_right, int left, int right) {
  FwdParams p = problem(len_q, len_k);
  p.has_window = true;
  p.bottom_right = bottom_right;
  p.window_left = left;
  p.window_right = right;
  return p;
}

TEST(MaskPolicy, KeyLengthUnmaskedBlocksAreExact) {
  for (const int len_q : {1, 17, 128, 239})
    for (const int len_k : {1, 17, 64, 239, 1023, 1024}) {
      const FwdParams p = problem(len_q, len_k);
      check(KeyLengthMask(p, SeqInfo(p, 0)), len_q, "keys " + std::to_string(len_k));
    }
}

TEST(MaskPolicy, WindowUnmaskedBlocksAreExact) {
  const int windows[][2] = {{-1, 0}, {0, 0}, {3, 5}, {100, -1}, {-1, 40}, {64, 0}, {200, 130}};
  for (const int len_q : {1, 17, 128, 239, 1000})
    for (const int len_k : {1, 17, 64, 239, 1024})
      for (const bool bottom_right : {false, true})
        for (const auto& w : windows) {
          const FwdParams p = window_problem(len_q, len_k, bottom_right, w[0], w[1]);
          check(WindowMask(p, SeqInfo(p, 0)), len_q,
                "q " + std::to_string(len_q) + " k " + std::to_string(len_k) + " window (" + std::to_string(w[0]) +
                    ", " + std::to_string(w[1]) + ") bottom_right " + std::to_string(bottom_right));
        }
}

// The kernels' rule is the one of flashattn.h and of the host (core/mask_rule.hpp), key by key: cols(row) holds
// exactly the keys j with i + off - left <= j <= i + off + right inside [0, len_k), as MaskRule::visible does,
// diag_band() the same keys as offsets j - i, and blocks() every block holding such a key.
TEST(MaskPolicy, WindowMatchesTheSemanticsKeyByKey) {
  const int windows[][2] = {{-1, 0}, {0, 0}, {3, 5}, {100, -1}, {-1, 40}, {7, 0}, {-1, -1}};
  for (const int len_q : {1, 17, 70})
    for (const int len_k : {1, 17, 64, 90})
      for (const bool bottom_right : {false, true})
        for (const auto& w : windows) {
          const FwdParams p = window_problem(len_q, len_k, bottom_right, w[0], w[1]);
          const WindowMask mask(p, SeqInfo(p, 0));
          const int off = bottom_right ? len_k - len_q : 0;
          auto sees = [&](int i, int j) {
            return j >= 0 && j < len_k && (w[0] < 0 || j >= i + off - w[0]) && (w[1] < 0 || j <= i + off + w[1]);
          };
          const std::string what = "q " + std::to_string(len_q) + " k " + std::to_string(len_k) + " window (" +
                                   std::to_string(w[0]) + ", " + std::to_string(w[1]) + ") br " +
                                   std::to_string(bottom_right);
          const DiagBand band = diag_band(mask);
          for (int i = 0; i < len_q; ++i) {
            const ColRange c = mask.cols(i), v = mask.rule.visible(i);
            for (int j = -2; j < len_k + 2; ++j) {
              ASSERT_EQ(sees(i, j), j >= 0 && j >= c.lo && j < c.hi) << what << " row " << i << " key " << j;
              ASSERT_EQ(sees(i, j), j >= v.lo && j < v.hi) << what << " row " << i << " key " << j << " (host rule)";
              if (j >= 0 && j < len_k)
                ASSERT_EQ(sees(i, j), (!band.has_lo || j - i >= band.lo) && (!band.has_hi || j - i <= band.hi))
                    << what << " row " << i << " key " << j << " (band)";
            }
          }
          for (const int block_n : {16, 64}) {
            const BlockRange range = mask.blocks(0, len_q, block_n);
            for (int n = 0; n * block_n < len_k; ++n) {
              bool any = false;
              for (int i = 0; i < len_q; ++i)
                for (int j = n * block_n; j < std::min(len_k, (n + 1) * block_n); ++j) any |= sees(i, j);
              if (any) ASSERT_TRUE(n >= range.lo && n < range.hi) << what << " block " << n << " is visited";
            }
          }
        }
}

// The backward's block arithmetic (common/bwd_common.cuh), which the sm90 deterministic mode's turns rest on: the
// key blocks whose CTAs walk a query block (query_blocks, read from the key side) are consecutive, and the last of
// them is last_key_block (read from the query side). A turn past the last visitor never comes (the kernel hangs);
// one short of it reorders the sum. Every visited query block exists, and every key block that a row of a query
// block sees walks it (the backward drops no gradient).
template <class Mask>
void check_backward_blocks(const Mask& mask, const SeqInfo& s, const std::string& what) {
  for (const int block_m : {64, 128}) {
    for (const int block_n : {64, 80, 128}) {
      const int m_blocks = (s.len_q + block_m - 1) / block_m;
      std::vector<std::vector<int>> visitors(m_blocks);
      for (int n = 0; n * block_n < s.len_k + 2 * block_n; ++n) {  // key blocks past len_k must walk nothing
        const QueryBlocks q = query_blocks(mask, s, n * block_n, block_n, block_m);
        for (int m = q.lo; m < q.hi; ++m) {
          ASSERT_LT(m, m_blocks) << what << " key block " << n << " walks a query block past the sequence";
          visitors[m].push_back(n);
        }
      }
      for (int m = 0; m < m_blocks; ++m) {
        const std::string at = what + " block_m " + std::to_string(block_m) + " block_n " + std::to_string(block_n) +
                               " query block " + std::to_string(m);
        const int rows = std::min(block_m, s.len_q - m * block_m);
        const BlockRange seen = mask.blocks(m * block_m, rows, block_n);
        if (visitors[m].empty()) {
          ASSERT_GE(seen.lo, seen.hi) << at << ": no key block walks it, but its rows see keys";
          continue;
        }
        const std::vector<int>& v = visitors[m];
        ASSERT_EQ(v.back() - v.front() + 1, int(v.size())) << at << ": its key blocks are not consecutive";
        ASSERT_EQ(flashattn::cuda::last_key_block(mask, s, m * block_m, block_m, block_n), v.back()) << at;
        ASSERT_EQ(seen.lo, v.front()) << at;  // the forward's block range of the rows names the same key blocks
      }
    }
  }
}

TEST(MaskPolicy, BackwardKeyBlocksPerQueryBlockAreConsecutiveUpToLastKeyBlock) {
  const int windows[][2] = {{-1, 0}, {0, 0}, {3, 5}, {100, -1}, {-1, 40}, {64, 0}, {200, 130}, {150, 30}};
  for (const int len_q : {1, 17, 64, 239, 1000})
    for (const int len_k : {1, 17, 64, 239, 1024}) {
      const FwdParams p = problem(len_q, len_k);
      check_backward_blocks(KeyLengthMask(p, SeqInfo(p, 0)), SeqInfo(p, 0),
                            "q " + std::to_string(len_q) + " k " + std::to_string(len_k));
      for (const bool bottom_right : {false, true})
        for (const auto& w : windows) {
          const FwdParams pw = window_problem(len_q, len_k, bottom_right, w[0], w[1]);
          check_backward_blocks(WindowMask(pw, SeqInfo(pw, 0)), SeqInfo(pw, 0),
                                "q " + std::to_string(len_q) + " k " + std::to_string(len_k) + " window (" +
                                    std::to_string(w[0]) + ", " + std::to_string(w[1]) + ") bottom_right " +
                                    std::to_string(bottom_right));
        }
    }
}

// The sm90 backward's mask_band (BwdConsumer::mask_step takes it for tiles inside both sequences) on the kernel's own
// S^T fragments: every consumer thread's view of BwdTraits::TiledMmaSdP, keys as rows and queries as columns, at the
// head dims of both mainloops. Each element must stay exactly where MaskRule::visible (the reference's rule) shows its
// key to its query: this checks the offsets' compile-time part against the fragment layout, which diag_band() alone
// does not.
template <int kHeadDim>
void check_band_on_fragments() {
  using namespace cute;
  using Traits = flashattn::cuda::sm90::BwdTraits<cutlass::bfloat16_t, kHeadDim>;
  constexpr int kN = Traits::kBlockN, kM = Traits::kBlockM;
  const int windows[][2] = {{-1, 0}, {0, 0}, {3, 5}, {100, -1}, {-1, 40}, {64, 0}, {-1, -1}};
  typename Traits::TiledMmaSdP mma;
  for (const int len_q : {kM, 3 * kM})
    for (const int len_k : {kN, 2 * kN, 3 * kN})
      for (const bool bottom_right : {false, true})
        for (const auto& w : windows) {
          const FwdParams p = window_problem(len_q, len_k, bottom_right, w[0], w[1]);
          const WindowMask mask(p, SeqInfo(p, 0));
          const flashattn::detail::MaskRule<int> rule = mask.rule;
          for (int m0 = 0; m0 + kM <= len_q; m0 += kM)
            for (int n0 = 0; n0 + kN <= len_k; n0 += kN)
              for (int t = 0; t < Traits::kConsumerThreads; ++t) {
                auto thr = mma.get_thread_slice(t);
                Tensor cS = thr.partition_C(make_identity_tensor(Shape<Int<kN>, Int<kM>>{}));
                Tensor cS_rc = make_tensor(cS.data(), flashattn::cuda::sm90::rows_cols(cS.layout()));
                Tensor acc = partition_fragment_C(mma, Shape<Int<kN>, Int<kM>>{});
                Tensor s = make_tensor(acc.data(), flashattn::cuda::sm90::rows_cols(acc.layout()));
                fill(s, 1.f);
                flashattn::cuda::mask_band<0>(s, cS_rc, diag_band(mask), n0 - m0, 0.f);
                for (int i = 0; i < size(s); ++i) {
                  const int key = n0 + get<0>(cS_rc(i)), q = m0 + get<1>(cS_rc(i));
                  const auto v = rule.visible(q);
                  ASSERT_EQ(s(i), key >= v.lo && key < v.hi ? 1.f : 0.f)
                      << "d " << kHeadDim << " q " << len_q << " k " << len_k << " window (" << w[0] << ", " << w[1]
                      << ") br " << bottom_right << " m0 " << m0 << " n0 " << n0 << " thread " << t << " key " << key
                      << " query " << q;
                }
              }
        }
}

TEST(MaskPolicy, BackwardBandMatchesTheRuleOnTheFragments) {
  check_band_on_fragments<64>();
  check_band_on_fragments<128>();
  check_band_on_fragments<256>();  // the split mainloop's tiles (keys split between the warpgroups' columns)
}

}  // namespace
