// Tile sizes of the sm90 (FlashAttention-3 design) forward kernel: the one constexpr function the kernel
// (template arguments), the launch (grid, shared memory) and Backend::tile_shape read.
#pragma once

namespace flashattn::cuda::sm90 {

// One wgmma (m64nNk16) covers 64 query rows: each consumer warpgroup owns 64 rows of the query block.
constexpr int kWarpgroupRows = 64;

struct FwdTiles {
  int consumer_warpgroups;  // block_q = 64 * consumer_warpgroups
  int block_k;              // keys per main-loop step (wgmma N of Q.K^T, K of P.V: a multiple of 16)
  int stages;               // K and V pipeline depth (each stage holds one K and one V tile)
  constexpr int block_q() const { return kWarpgroupRows * consumer_warpgroups; }
};

// `head_dim` is the compiled head dim. Registers decide: a consumer thread holds 64 * head_dim / 128 fp32
// output accumulators, 64 * block_k / 128 scores and, with the softmax of one block overlapped with the next
// block's Q.K^T, a second score tile plus the bf16 probabilities of the first. With two consumer warpgroups a
// thread may keep 240 registers (setmaxnreg), with three 160:
//   d64:  3 warpgroups x 128 keys: 32 O + 2 x 64 S + 32 P = 192 live values... of which one S tile is dead by
//         the time P exists, so ~128 + addressing fits 160;
//   d128: 2 x 128 keys:  64 O + 2 x 64 S + 32 P;
//   d256: 2 x 80 keys:  128 O + 2 x 40 S + 20 P (80 keys: the largest multiple of 16 whose two K/V stages fit
//         227 KiB of shared memory next to the 64 KiB Q tile: 64 + 2 * 2 * 80 * 256 * 2 B = 224 KiB).
constexpr FwdTiles fwd_tiles(int head_dim) {
  if (head_dim <= 64) return {3, 128, 2};
  if (head_dim <= 128) return {2, 128, 2};
  return {2, 80, 2};
}

}  // namespace flashattn::cuda::sm90
