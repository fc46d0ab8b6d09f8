// The dropout mask of core/dropout.hpp in the accumulator fragments of the CUDA kernels: which of a thread's
// probabilities are kept. Both walks call keep(r, c, kept) once per element of the (rows, cols) view `coords`
// (the identity tensor partitioned like the accumulator), drawing every Philox group the thread touches once.
#pragma once

#include <cute/tensor.hpp>

#include "core/dropout.hpp"

namespace flashattn::cuda {

// Fragments with queries as rows (mma.sync m16n8k16 and wgmma accumulators): rows r, r + 1 of the view are queries
// i, i + 8 (i % 16 < 8) and columns c, c + 1 keys j, j + 1 (j even). kPairedAtoms: columns c + 2, c + 3 are keys
// j + 8, j + 9 as well (wgmma, whose n8 groups are consecutive columns of one thread), so one call serves the whole
// group of eight; otherwise one call serves the four elements of a quad (the sm80 kernels: their warp grids with
// warps along the keys may spread a 16-key block over two warps; not measured). bh = batch entry * heads_q + query
// head; m0 / n0: the fragment's first query / key.
template <bool kPairedAtoms, class C, class Keep>
__device__ __forceinline__ void dropout_query_rows(const detail::DropoutRule& d, const C& coords, int64_t bh, int m0,
                                                   int n0, Keep&& keep) {
  constexpr int kRows = decltype(cute::size<0>(coords))::value, kCols = decltype(cute::size<1>(coords))::value;
  constexpr int kStep = kPairedAtoms ? 4 : 2;
  static_assert(kRows % 2 == 0 && kCols % kStep == 0);
  const detail::PhiloxKey key = d.key();
  CUTE_UNROLL
  for (int r = 0; r < kRows; r += 2) {
    const uint32_t query_grp = detail::DropoutRule::query_group(m0 + cute::get<0>(coords(r, 0)));
    CUTE_UNROLL
    for (int c = 0; c < kCols; c += kStep) {
      const int j = n0 + cute::get<1>(coords(0, c));
      const detail::PhiloxWords w =
          detail::DropoutRule::group_words(key, bh, query_grp, detail::DropoutRule::key_group(j));
      const int half8 = kPairedAtoms ? 0 : ((j >> 3) & 1) << 1;  // words 2, 3 hold keys j0 + 8, j0 + 9
      keep(r, c, d.keeps_low(w.w[half8]));
      keep(r, c + 1, d.keeps_high(w.w[half8]));
      keep(r + 1, c, d.keeps_low(w.w[half8 | 1]));
      keep(r + 1, c + 1, d.keeps_high(w.w[half8 | 1]));
      if constexpr (kPairedAtoms) {
        keep(r, c + 2, d.keeps_low(w.w[2]));
        keep(r, c + 3, d.keeps_high(w.w[2]));
        keep(r + 1, c + 2, d.keeps_low(w.w[3]));
        keep(r + 1, c + 3, d.keeps_high(w.w[3]));
      }
    }
  }
}

// wgmma fragments with keys as rows (the sm90 backward's S^T): rows r, r + 1 are keys k, k + 8 (k % 16 < 8) and
// columns c, c + 1, c + 2, c + 3 queries q, q + 1, q + 8, q + 9 (q % 16 in {0, 2, 4, 6}). Lanes l and l ^ 4 hold keys
// k and k ^ 1 of the same queries, so between them they need exactly two groups, those of queries {q, q + 8} and
// {q + 1, q + 9} with keys {k & ~1, +1, +8, +9}: the lane with the even key draws the first, the other the second,
// and each passes the other the halves of its keys (two shuffles per pair of groups: one Philox call per eight
// elements, as with queries as rows). Every lane of the warp must call it together. n0 / m0: the first key / query.
template <class C, class Keep>
__device__ __forceinline__ void dropout_key_rows(const detail::DropoutRule& d, const C& coords, int64_t bh, int n0,
                                                 int m0, int lane, Keep&& keep) {
  constexpr int kRows = decltype(cute::size<0>(coords))::value, kCols = decltype(cute::size<1>(coords))::value;
  static_assert(kRows % 2 == 0 && kCols % 4 == 0);
  const int odd = (lane >> 2) & 1;  // this lane's keys are odd: it draws queries q + 1, q + 9 and keeps high halves
  const uint32_t send_sel = odd ? 0x5410u : 0x7632u;  // byte_perm: the partner's halves of words a, b as (a, b)
  const detail::PhiloxKey key = d.key();
  CUTE_UNROLL
  for (int r = 0; r < kRows; r += 2) {
    const uint32_t key_grp = detail::DropoutRule::key_group(n0 + cute::get<0>(coords(r, 0)));
    CUTE_UNROLL
    for (int c = 0; c < kCols; c += 4) {
      const int q = m0 + cute::get<1>(coords(0, c));
      const detail::PhiloxWords w =
          detail::DropoutRule::group_words(key, bh, detail::DropoutRule::query_group(q + odd), key_grp);
      // Word h8 | k8 << 1 holds queries + 8 h8, keys + 8 k8; received word k8 holds (h8 = 0, h8 = 1) as (low, high).
      const uint32_t recv[2] = {__shfl_xor_sync(0xffffffffu, __byte_perm(w.w[0], w.w[1], send_sel), 4),
                                __shfl_xor_sync(0xffffffffu, __byte_perm(w.w[2], w.w[3], send_sel), 4)};
      CUTE_UNROLL
      for (int k8 = 0; k8 < 2; ++k8) {
        CUTE_UNROLL
        for (int h8 = 0; h8 < 2; ++h8) {
          const bool own = d.keeps_half(w.w[h8 | k8 << 1], odd != 0);
          const bool other = d.keeps_half(recv[k8], h8 != 0);
          // (Compile-time columns: a lane-dependent index would put the fragment in local memory.)
          keep(r + k8, c + 2 * h8, odd ? other : own);
          keep(r + k8, c + 2 * h8 + 1, odd ? own : other);
        }
      }
    }
  }
}

// One bit per probability of a thread's fragment ((rows, cols) view, compile-time indices): a mask drawn ahead of
// the scores it applies to (where fewer registers are live) costs (kRows * kCols) / 32 registers until then.
template <int kRows, int kCols>
struct KeepBits {
  uint32_t bits[(kRows * kCols + 31) / 32];
  __device__ void clear() {
    CUTE_UNROLL
    for (int i = 0; i < int(sizeof(bits) / sizeof(bits[0])); ++i) bits[i] = 0;
  }
  __device__ void set(int r, int c, bool kept) {
    const int i = r + kRows * c;
    bits[i / 32] |= uint32_t(kept) << (i % 32);
  }
  __device__ bool kept(int r, int c) const {
    const int i = r + kRows * c;
    return (bits[i / 32] >> (i % 32)) & 1u;
  }
};

}  // namespace flashattn::cuda
