// Tile sizes of the sm80 (FlashAttention-2) forward kernel: the one constexpr function that both the kernel
// (template arguments) and the host (launch grid, Backend::tile_shape) read, so they can never disagree.
#pragma once

namespace flashattn::cuda::sm80 {

struct FwdTiles {
  int block_q;  // query rows per CTA
  int block_k;  // key rows per main-loop step
  int warps;    // warps per CTA; each owns block_q / warps query rows (FA2: warps split the queries)
};

// `head_dim` is the kernel's compiled head dim (the problem's max(d, dv) rounded up to a built one).
// The register file decides first: each thread holds block_q * head_dim / threads fp32 output accumulators
// plus block_q * block_k / threads scores, next to the ldmatrix operands of two k-slices; these sizes compile
// without spills on sm_90 (ptxas -v; d256: 8 bytes). FA2's 128x128 (d64) and 128x64 (d128) tiles spilled here and ran at a
// third / half of FA2's speed (src/cuda/NOTES.md, run 1). Among spill-free shapes the H200 measurements of
// run 3 picked: 128-row CTAs for d64/d128 (64-row ones were 7-10% slower: K/V are read from shared memory
// once per 64 instead of 128 query rows), and for d256 64x64 with 4 warps: 96 KiB of shared memory, so two
// CTAs share an SM and hide each other's barriers, 6-19% faster than one 128x64 CTA of 8 warps (128 KiB).
// Shared memory = (block_q + 2 * block_k) * head_dim * 2 bytes: 32 KiB (d64), 48 KiB (d128), 96 KiB (d256).
constexpr FwdTiles fwd_tiles(int head_dim) {
  if (head_dim <= 64) return {128, 64, 4};   // 64 O + 64 S accumulators per thread
  if (head_dim <= 128) return {128, 32, 4};  // 128 O + 32 S
  return {64, 64, 4};                        // 128 O + 32 S
}

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
// `windowed` (causal / sliding window) picks d64's tile: 128 x 128 spills 160 bytes (ptxas sm_90) and pays
// for it where CTAs are short; 64 x 128 (24 bytes) was 8% faster causal, 128 x 128 3-4% faster without a mask
// (H200, src/cuda/NOTES.md, backward device run B2-2).
constexpr BwdTiles bwd_tiles(int head_dim, bool windowed) {
  if (head_dim <= 64) return windowed ? BwdTiles{64, 128, 8, 2, 4, 2, 2} : BwdTiles{128, 128, 8, 2, 4, 4, 2};
  if (head_dim <= 128) return {64, 128, 8, 2, 4, head_dim % 64 == 0 ? 2 : 4, 2};
  return {64, 64, 8, 4, 2, 2, 1};
}

}  // namespace flashattn::cuda::sm80
