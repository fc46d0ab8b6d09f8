// Tile sizes of the sm80 (FlashAttention-2) forward kernel: the one constexpr function that both the kernel
// (template arguments) and the host (launch grid, Backend::tile_shape) read, so they can never disagree.
#pragma once

namespace flashattn::cuda::sm80 {

struct FwdTiles {
  int block_q;  // query rows per CTA
  int block_k;  // key rows per main-loop step
  int warps;    // warps per CTA; each owns block_q / warps query rows (FA2: warps split the queries)
};

// `head_dim` is the kernel's compiled head dim (the problem's max(d, dv) rounded up to a built one); `compact`:
// the tile for masked calls and short unmasked ones (fwd_compact). Each thread holds block_q * head_dim / threads
// fp32 output accumulators plus block_q * block_k / threads scores. FA2's tiles (128 x 128 at d64, 128 x 64 at
// d128 and, with 8 warps, at d256) exceed the register file a little at d64 / d128 (ptxas sm_90a, bf16: 184-252
// bytes of spills) and are still the fastest once the mainloop's interior blocks run without mask and
// predication code (H200, bench/results/2026-11-30_sm80_tiles/run3_split_loop_fwd.tsv): d128 128 x 64 is 4-9%
// faster than the spill-free 128 x 32. Under a causal mask, where the short CTAs of the diagonal make the tail,
// smaller CTAs win at 1k-4k: d64 keeps 128 x 64 (128 x 128: 0.97x FA2 at 1k), d256 64 x 64 with 4 warps (two
// CTAs per SM; 128 x 64 x 8 warps: 0.89-0.96x FA2 at 1k-4k).
// Shared memory = (block_q + 2 * block_k) * head_dim * 2 bytes: 48 / 32 KiB (d64), 64 KiB (d128), 128 / 96 KiB
// (d256).
constexpr FwdTiles fwd_tiles(int head_dim, bool compact) {
  if (head_dim <= 64) return compact ? FwdTiles{128, 64, 4} : FwdTiles{128, 128, 4};
  if (head_dim <= 128) return {128, 64, 4};
  return compact ? FwdTiles{64, 64, 4} : FwdTiles{128, 64, 8};
}

// The dropout kernel (KernelVariant Dropout): 64 query rows, 16 per warp. Its Philox rounds need registers the
// 128-row tiles above do not have: at d128 ptxas (sm_90) spilled 972-1116 bytes with 128 x 64, where the plain
// kernel spills 208; with 16 rows per warp each thread holds half the output accumulators and scores.
constexpr FwdTiles fwd_dropout_tiles(int /*head_dim*/) { return {64, 64, 4}; }
template <int kHeadDim>
struct DropoutFwdTiles {
  static constexpr FwdTiles value = fwd_dropout_tiles(kHeadDim);
};

// Unmasked calls with few key blocks per CTA take the compact tile above d128 as well: with one 8-warp CTA per
// SM its prologue (Q and the first K tile) and epilogue stall the SM, while two 4-warp CTAs hide each other's.
// d256 unmasked at 1k keys (16 blocks): 64 x 64 1.005-1.010x FA2, 128 x 64 x 8 0.99-1.00x; at 2k 128 x 64 x 8 is
// 1.5% faster (H200, bench/results/2026-11-30_sm80_tiles/run11_d256_abc.tsv). d192 shares d256's tiles and this
// rule (not measured on its own).
constexpr int kShortKeys = 1024;
// Whether unmasked calls at this compiled head dim ever take the compact tile (the launch instantiates it only then).
constexpr bool compact_for_short_keys(int head_dim) { return head_dim > 128; }
constexpr bool fwd_compact(int head_dim, bool windowed, long long seqlen_k) {
  return windowed || (compact_for_short_keys(head_dim) && seqlen_k <= kShortKeys);
}

template <int kHeadDim, bool kCompact>
struct DefaultFwdTiles {
  static constexpr FwdTiles value = fwd_tiles(kHeadDim, kCompact);
};

}  // namespace flashattn::cuda::sm80

namespace flashattn::cuda::sm80 {

// Tiles of the backward (src/cuda/sm80/bwd_kernel.cuh), FlashAttention-2's choices for GPUs with >= 144 KiB of
// shared memory per CTA. A CTA owns block_k keys (K, V in shared memory, dK and dV accumulated in registers) and
// walks the query rows block_q at a time. Its warps tile three differently shaped GEMM families, each with its
// own warp grid: S = Q.K^T and dP = dO.V^T (block_q x block_k), dV += P^T.dO and dK += dS^T.Q (block_k x head
// dim), dQ = dS.K (block_q x head dim). Registers per thread: 2 * block_k * head_dim / threads fp32 dK/dV
// accumulators (64 at d64, 128 at d128 and d256) + 2 * block_q * block_k / threads S/dP (128, 64, 32).
// Shared memory = (2 * block_q [Q] + do_stages * block_q [dO] + 2 * block_k [K, V]) * head_dim * 2 bytes
// + 2 * block_q * block_k * 2 bytes [P, dS]: 160 KiB (d64 unmasked, d128), 96 KiB (d64 causal / window),
// 176 KiB (d256: dO single-buffered; double-buffered (208 KiB) measured no faster; sm80 parts with 164 KiB per
// CTA cannot run d256).
struct BwdTiles {
  int block_q;      // query rows per main-loop step
  int block_k;      // keys per CTA
  int warps;        // warps per CTA
  int sdp_warps_m;  // warp grid of S/dP: warps along the query rows (the others split the keys)
  int dkv_warps_n;  // warp grid of dK/dV: warps along the keys (the others split the head dim)
  int dq_warps_m;   // warp grid of dQ: warps along the query rows (the others split the head dim)
  int do_stages;    // dO buffers (Q always has two: its next tile streams in during the whole step)
};
// The head-dim split of each warp grid is 16 * (warps / warps_along_rows) columns wide and must divide the
// head dim: 96 (FLASHATTN_KERNELS=all) takes 4 x 2 grids where 64-column ones do not fit.
// d64 takes FA2's warp grids (4 x 2 for S/dP and dQ): 6-9% faster than 2 x 4 grids, and under a causal mask
// 128 x 128 beats 64 x 128 by 7-12% (H200, bench/results/2026-11-30_sm80_tiles/run1_tiles_before.tsv).
constexpr BwdTiles bwd_tiles(int head_dim) {
  if (head_dim <= 64) return {128, 128, 8, 4, 4, 4, 2};
  if (head_dim <= 128) return {64, 128, 8, 2, 4, head_dim % 64 == 0 ? 2 : 4, 2};
  return {64, 64, 8, 4, 2, 2, 1};
}
template <int kHeadDim>
struct DefaultBwdTiles {
  static constexpr BwdTiles value = bwd_tiles(kHeadDim);
};

}  // namespace flashattn::cuda::sm80
