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
// Register budget decides: each thread holds block_q * head_dim / threads fp32 output accumulators plus
// block_q * block_k / threads scores, which must stay well under 255 registers. Shared memory holds one Q,
// one K and one V tile: (block_q + 2 * block_k) * head_dim * 2 bytes (48 KiB at d64, 64 KiB at d128,
// 128 KiB at d256), under the 164 KiB (sm80) / 227 KiB (sm90) a CTA may use.
constexpr FwdTiles fwd_tiles(int head_dim) {
  if (head_dim <= 64) return {128, 128, 4};   // 64 O + 128 S accumulators per thread
  if (head_dim <= 128) return {128, 64, 4};   // 128 O + 64 S
  return {128, 64, 8};                        // d256 needs 8 warps: 128 O + 32 S per thread
}

}  // namespace flashattn::cuda::sm80
