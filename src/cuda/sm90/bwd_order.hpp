// The order in which the sm90 backward's CTAs take their (key block, head, batch) work: the grid's launch order,
// except at its end under a causal-like mask. Host (plan.cpp, tests) and device (bwd_kernel.cuh).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/host_device.hpp"

namespace flashattn::cuda::sm90 {

// The grid is (key blocks, heads, batch) and the hardware hands it out in launch order, key block fastest, so each
// (head, batch) pair's CTAs run together and share its Q/dO in L2. Under a mask whose left side is unbounded (causal
// in either alignment, a window with only a right bound), key block n walks no more query blocks than key block
// n - 1: every pair lists its CTAs longest first, and the last pairs' longest CTAs start only when the grid reaches
// them, near its end, and run on after the rest have finished (a model of the hardware's greedy order, CTA cost =
// steps + 1.5: 3-7 % above the ideal makespan at d64-d256 causal 512-4k; bench/gpu/dev/schedule_model.py --backward,
// bench/results/2026-12-06_h200_session44/README.md). The CTAs of the last `tail_pairs` pairs take key block major
// order instead (all their key blocks 0, then 1, ...), longest first across those pairs: 0.5-2.1 % at 512-4k in
// the model with about two waves of CTAs in the tail. Key-block-major order over the whole grid (session 32's
// bwd_longest_first.patch) lost 7 % at 512: the key blocks of one pair no longer ran together.
// Measured against the launch order (H100, bf16, 16k tokens, causal): d128 +0.2/+1.7/+3.4 % and d64 +0.8/+0.4/+1.6 %
// at 512/1k/4k (bench/results/2026-12-07_h100_session47/README.md, run 3).
struct BwdCta {
  int n_block, head, batch;
};

// CTA (x, y, z) of a grid (nx, ny, nz): the work it takes. tail_pairs <= 1 keeps the launch order; deterministic
// mode (descending) launches the highest key block first instead (bwd_kernel.cuh says why) and takes no tail.
FA_HOST_DEVICE BwdCta bwd_cta(int x, int y, int z, int nx, int ny, int nz, int tail_pairs, bool descending) {
  if (descending) return {nx - 1 - x, y, z};
  tail_pairs = tail_pairs < ny * nz ? tail_pairs : ny * nz;  // at most every pair
  const int pair = y + ny * z;                               // launch order of the (head, batch) pairs: heads fastest
  const int first_tail = ny * nz - tail_pairs;
  if (tail_pairs <= 1 || pair < first_tail) return {x, y, z};
  const int t = (pair - first_tail) * nx + x;  // the CTA's place among the tail's, in launch order
  const int q = first_tail + t % tail_pairs;
  return {t / tail_pairs, q % ny, q / ny};
}

// The plan's tail (plan.cpp): pairs enough for `tail_ctas` CTAs (about two waves), only under a mask whose left
// side is unbounded (window_left < 0 with a right bound: the lengths fall with the key block), never in
// deterministic mode.
inline int bwd_tail_pairs(int64_t pairs, int64_t key_blocks, int64_t tail_ctas, bool falling_lengths,
                          bool deterministic) {
  if (!falling_lengths || deterministic || key_blocks <= 1 || pairs <= 1) return 0;
  return int(std::min<int64_t>(pairs, (tail_ctas + key_blocks - 1) / key_blocks));
}

}  // namespace flashattn::cuda::sm90
