// Tile sizes of the sm90 (FlashAttention-3 design) forward kernel: the one constexpr function the kernel
// (template arguments), the launch (grid, shared memory) and Backend::tile_shape read.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm90 {

// One wgmma (m64nNk16) covers 64 query rows: each consumer warpgroup owns 64 rows of the query block.
constexpr int kWarpgroupRows = 64;

// Paged K/V whose pages are not whole key blocks but multiples of 16 rows: rows of one TMA box (fwd_load.cuh). A
// key block is loaded as block_k / 16 boxes per swizzle-atom column; every block_k is a multiple of 16, so a box
// never straddles pages (vLLM's default page is 16 keys). Other page sizes are gathered with cp.async.
constexpr int kPageBoxRows = 16;

// The registers a thread of each consumer warpgroup gets by setmaxnreg (forward and backward traits). setmaxnreg
// moves registers only within the CTA's pool, what it launched with: 64 K registers over the SM's CTAs and threads,
// a multiple of 8 a thread (the allocation unit). The consumers get what that pool holds beyond the producer
// warpgroup's `producer_regs`, rounded down to a multiple of 8 and capped at 240. A larger request waits forever:
// with 32 for the producer and 240 for the consumers, the forward hung, and so did the backward when its share was
// computed from the whole register file (bench/results/2026-12-07_h100_session51/README.md). One CTA of two consumer
// warpgroups: 168 a thread at launch, 240 for the consumers; three CTAs of one: 80 at launch, 136.
constexpr int consumer_regs(int ctas_per_sm, int consumer_warpgroups, int producer_regs) {
  const int wg_threads = 128, threads = (consumer_warpgroups + 1) * wg_threads;
  const int launch_regs = 64 * 1024 / (ctas_per_sm * threads) / 8 * 8;
  const int share = (launch_regs * threads - producer_regs * wg_threads) / (consumer_warpgroups * wg_threads) / 8 * 8;
  return share > 240 ? 240 : share;
}
static_assert(consumer_regs(1, 2, 24) == 240 && consumer_regs(3, 1, 24) == 136);

struct FwdTiles {
  int consumer_warpgroups;  // block_q = 64 * consumer_warpgroups
  int block_k;              // keys per main-loop step (wgmma N of Q.K^T, K of P.V: a multiple of 16)
  int stages;               // K and V pipeline depth (each stage holds one K and one V tile)
  int ctas_per_sm = 1;      // resident CTAs an SM holds (registers and shared memory are divided among them)
  constexpr int block_q() const { return kWarpgroupRows * consumer_warpgroups; }
};

// The table's entries. The plan (plan.cpp plan_sm90) picks one per call; entries with equal tiles share one kernel
// (fwd_launch.cuh), so an entry costs an instantiation only where its tiles differ.
enum class FwdEntry : uint8_t {
  kWide,      // no window, sequences longer than fwd_short_seqlen
  kWindowed,  // causal / sliding window longer than fwd_short_seqlen; packed GQA and dropout under every mask
  kShort,     // sequences up to fwd_short_seqlen (not packed, no dropout)
  kDecode,    // packed GQA tiles of at most 64 rows (query positions x group), 16-bit (decode_entry_exists)
  kNarrow,    // one warpgroup, several CTAs per SM: unpacked 16-bit calls up to fwd_narrow_seqlen (no score mods,
              // no dropout; narrow_entry_exists)
};

// `head_dim` is the compiled head dim. Registers decide first: a consumer thread holds 64 * head_dim / 128 fp32
// output accumulators, 64 * block_k / 128 scores and, with the softmax of one block overlapped with the next block's
// Q.K^T, a second score tile plus the bf16 probabilities of the first. With two consumer warpgroups a thread may keep
// 240 registers (setmaxnreg), with three 160 (ptxas: no spills for any entry below). Then the H200 measurements
// (bench/results/2026-11-30_sm90_dev):
//   d64:  3 warpgroups (192 query rows) x 128 keys: 32 O + 2 x 64 S + 32 P per thread;
//   d128: 2 x 176 keys without a window (+2-3% over 128 keys at 8k-16k: fewer softmax rounds per key; its
//         K/V stages leave no room for a separate O tile, so O is staged in Q's space), 2 x 128 keys under
//         causal/window (176 keys was 8% slower there at 2k: more masked work on the diagonal);
//   d256: 2 x 80 keys: 128 O + 2 x 40 S + 20 P; 80 is the largest multiple of 16 whose two K/V stages fit
//         next to the 64 KiB Q tile (64 + 2 * 2 * 80 * 256 * 2 B = 224 KiB of 227 KiB).
// Short sequences (kShort, up to fwd_short_seqlen) waste less of a tile. d64 under causal/window: 2 warpgroups
// (128 query rows; at 512 causal queries 192-row tiles compute 1.7x the visible scores, 128-row ones 1.25x) gained
// +7% at 512, +9% at 1k, -2% at 2k, until the narrow tiles (kNarrow, below) took those calls; without a window 2
// warpgroups gained nothing at 512/1k and lost 7-12% from 2k. So d64 has no short entry. d128 without a window:
// 128 keys (176 keys leave 528 key columns for 512 keys and a masked partial block): +14% at 512, +10% at 1k, +7%
// at 2k, +3.5% at 4k, +0.7% at 8k (bench/results/2026-12-02_h200_session19/fwd_short_tiles.csv; 16k keeps 176).
// Two stages everywhere: one stage was 1-3% slower at d128, three no faster (the ablation table).
// Dropout (variant::Dropout) takes the windowed entry under every mask: with the mask drawn beside the scores (its
// first version) ptxas sm_90a spilled 92 bytes at d128 x 176 keys and 20 at 128; the kernel as built, 4 at 128 keys
// (176 was not measured again).
// FP8 (e4m3 inputs): the P.V wgmma takes 32 keys per step, so block_k is a multiple of 32; the probabilities are 8-bit
// (a quarter of the registers of S), and a K/V stage takes half the bytes of a 16-bit one. d128 without a window:
// 192 keys (888-893 TFLOP/s at 16k against 864 for 128, bench/results/2026-12-02_h200_session13; 256 made ptxas
// serialise the wgmmas and spill 144 bytes). 128 keys elsewhere: d256 keeps 128 O + 64 S + 16 P registers, and its
// two stages (2 x 2 x 32 KiB) fit beside Q (32 KiB) and a bfloat16 O tile of its own (64 KiB). FP8 has no short
// entry of its own (fwd_short_seqlen is 0): its kShort is the windowed one.
// Decode (kDecode): a packed tile of one query position holds `group` rows (4 for GQA 32/8), so a second consumer
// warpgroup has no rows at all. One warpgroup and two CTAs per SM instead: each CTA is its own K/V stream with its
// own producer, as cuDNN's decode kernel runs two CTAs of 4 warps per SM (ncu,
// bench/results/2026-12-03_h200_session24/README.md). Two stages of 64 keys keep the bytes in flight per SM as they
// were: 2 x (16 KiB Q + 64 KiB K/V + 16 KiB O) fits twice in the SM's 228 KiB; at d64, 128-key blocks take the same
// bytes. Above d128 kDecode is the windowed entry, which the plan then does not pick (decode_entry_exists).
constexpr FwdTiles fwd_tiles(int head_dim, FwdEntry entry, bool fp8 = false) {
  const bool wide = entry == FwdEntry::kWide;
  if (entry == FwdEntry::kDecode && !fp8 && head_dim <= 128) return {1, head_dim <= 64 ? 128 : 64, 2, 2};
  if (entry == FwdEntry::kNarrow && !fp8 && head_dim <= 64) return {1, 64, 2, 3};
  if (fp8) return {head_dim <= 64 ? 3 : 2, head_dim > 64 && head_dim <= 128 && wide ? 192 : 128, 2};
  if (head_dim <= 64) return {3, 128, 2};
  if (head_dim <= 128) return {2, wide ? 176 : 128, 2};
  return {2, 80, 2};
}

constexpr bool same_tiles(const FwdTiles& a, const FwdTiles& b) {
  return a.consumer_warpgroups == b.consumer_warpgroups && a.block_k == b.block_k && a.stages == b.stages &&
         a.ctas_per_sm == b.ctas_per_sm;
}

// Whether kDecode / kNarrow have tiles of their own at this compiled head dim (16-bit).
constexpr bool decode_entry_exists(int head_dim) { return fwd_tiles(head_dim, FwdEntry::kDecode).ctas_per_sm > 1; }
constexpr bool narrow_entry_exists(int head_dim) { return fwd_tiles(head_dim, FwdEntry::kNarrow).ctas_per_sm > 1; }

// Short unpacked calls on one-warpgroup tiles (kNarrow, d64 only): 64 x 64 tiles, three CTAs per SM (as many
// warpgroups as the 192-row tiles), so that one CTA's tile boundary (the next tile's Q load, its first Q.K^T, the
// epilogue) runs under the others' GEMMs, and causal tiles compute fewer masked scores. H200 bf16, against the
// entries they replace in one process (bench/results/2026-12-03_h200_session25/README.md, run 3): d64 causal +23 %
// at 512, +5-11 % at 1k, -3 to -9 % at 2k; without a window even at 512 and -7 to -23 % from 1k. The same tiles at
// d128 (two CTAs per SM) were 5-20 % slower at every length from 512 to 4k, masked or not. The longest sequence that
// takes them (an ablation build's FLASHATTN_SM90_NARROW_SEQLEN overrides it, plan.cpp).
constexpr int64_t fwd_narrow_seqlen(int head_dim, bool windowed, bool fp8) {
  return !fp8 && head_dim <= 64 && windowed ? 1024 : 0;
}

// The longest sequence (the longer of the query and key lengths) that takes kShort; 0: none (the measurements above).
constexpr int64_t fwd_short_seqlen(int head_dim, bool windowed, bool fp8) {
  if (fp8 || head_dim > 128) return 0;
  if (head_dim <= 64) return 0;  // its causal/window calls up to 1k take kNarrow
  return windowed ? 0 : 4096;    // d128 windowed: the short entry is the windowed one
}

// Tiles of the backward (bwd_kernel.cuh): a CTA owns block_k keys and walks the query rows block_q at a time
// through a `stages`-deep pipeline of Q and dO tiles; two consumer warpgroups.
// - Head dims up to 128 (split_head_dim false): 128 keys, each warpgroup holding its 64 keys' dK and dV
//   (2 * 64 * head_dim / 128 fp32 accumulators per thread). Registers besides dK/dV: S^T and dP^T,
//   2 * 64 * block_q / 128, and the dQ tile, 64 * dq_cols / 128. FlashAttention-3 and -4 take the same 128 x 128
//   at d64 and 64 x 128 at d128 under a mask; at d128 without one they take 80 x 128 with dQ transposed, which was
//   slower here at 1k-16k in both versions tried (H100: -1.5..-5.7 % with dS queries contiguous,
//   bench/results/2026-12-06_h100_session36/README.md run 1; -5..-7 % with dS keys contiguous and no spills,
//   bench/results/2026-12-06_h100_session43/README.md run 2). At d64, cuDNN's 64 x 64 tiles of one warpgroup with
//   two CTAs per SM (so that one CTA's K/V load and dK/dV store run under the other's GEMMs) were 8-12 % slower
//   without a mask and 2.4-7 % causal at 512-4k (H100, bench/results/2026-12-07_h100_session49/README.md run 2).
// - Above 128 (split_head_dim): 64 keys whose dK and dV the two warpgroups split by head dim (2 * 64 * d/2 / 128
//   accumulators: 128 at d256); each computes S^T and dP^T for half of the 64 query rows, and P and dS go
//   through shared memory to the other (bwd_mainloop_split.cuh). 128 keys would need 256 accumulators a thread.
struct BwdTiles {
  int block_q;
  int block_k;
  int stages;
  bool split_head_dim;
};
constexpr BwdTiles bwd_tiles(int head_dim) {
  if (head_dim <= 64) return {128, 128, 2, false};
  if (head_dim <= 128) return {64, 128, 2, false};
  return {64, 64, 2, true};
}

}  // namespace flashattn::cuda::sm90
