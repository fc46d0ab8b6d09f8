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

// Tiles of the backward (src/cuda/sm80/bwd_kernel.cuh). Each CTA of the main kernel owns block_k keys and
// walks the query rows block_q at a time; the dQ kernel (deterministic mode) owns block_q rows and walks keys.
// The 8 warps split every GEMM into 16x16 wmma fragments; dK and dV of a CTA live in registers:
// 2 * block_k * head_dim / threads fp32 accumulators per thread (32 at d64, 64 at d128 with 64x64 tiles, 64 at
// d256 with 32x32). Shared memory (padded Q, dO, K, V tiles, P/dS, fp32 S/dP or staging): 88.5 KiB (d64),
// 120.5 KiB (d128), 103.75 KiB (d256); ptxas (sm_90): d64 128-142 registers, d128 up to 255 with 12 bytes spilled
// (the atomic-dQ kernel), d256 up to 255.
// Square tiles: the fp32 staging area of dK/dV (block_k rows) is the one of dQ (block_q rows).
struct BwdTiles {
  int block_q;
  int block_k;
  int threads;
};
constexpr BwdTiles bwd_tiles(int head_dim) {
  if (head_dim <= 128) return {64, 64, 256};
  return {32, 32, 256};
}

}  // namespace flashattn::cuda::sm80
