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
// The register file decides: each thread holds block_q * head_dim / threads fp32 output accumulators plus
// block_q * block_k / threads scores, next to the ldmatrix operands of two k-slices; the sizes below are the
// largest that compile without spills on sm_90 (ptxas -v: d64 240 regs, d128 255, d256 254 / 8 B). FA2's
// 128x128 (d64) and 128x64 (d128) tiles spilled here (960 B at d64 while softcap/ALiBi were still in the
// same kernel; 144 B at d128 without them), and the first device run measured a third / half of FA2's
// speed with them (src/cuda/NOTES.md). Shared memory holds one Q, one K and one V tile:
// (block_q + 2 * block_k) * head_dim * 2 bytes (32 KiB at d64, 48 KiB at d128, 128 KiB at d256), under the
// 164 KiB (sm80) / 227 KiB (sm90) a CTA may use.
constexpr FwdTiles fwd_tiles(int head_dim) {
  if (head_dim <= 64) return {128, 64, 4};   // 64 O + 64 S accumulators per thread
  if (head_dim <= 128) return {128, 32, 4};  // 128 O + 32 S
  return {128, 64, 8};                       // d256 needs 8 warps: 128 O + 32 S per thread
}

}  // namespace flashattn::cuda::sm80
