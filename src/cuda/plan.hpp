// The dispatch plan of one CUDA attention call: every decision about which kernel runs and how, made once on the
// host from the validated Problem (plan.cpp). The launchers of both families only switch on these fields;
// Backend::tile_shape, fa_forward_plan (the CLI's IO picture, the tests) read the same struct, so what is reported
// is what runs. Plain data: device code (the launch headers of each family) includes it too.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/sm90/tiles.hpp"

namespace flashattn::cuda {

enum class Family : uint8_t {
  kSm80,  // FlashAttention-2 design (mma.sync, cp.async): sm80 and later
  kSm90,  // FlashAttention-3 design (TMA, wgmma, warp specialisation): sm_90a only
};

// How CTAs are assigned to (query block, head, batch) tiles.
enum class Schedule : uint8_t {
  kPerTile,            // one CTA per tile (sm80; sm90 without persistence)
  kPersistentStatic,   // one CTA per SM, tiles c, c + grid, ... (every tile costs the same)
  kPersistentDynamic,  // one CTA per SM asking a global counter for its next tile (tile lengths differ)
};

// Which instantiation of a compiled kernel serves the call.
struct Variant {
  bool score_mods = false;       // softcap and/or ALiBi
  bool padded_head_dim = false;  // head_dim or head_dim_v below the compiled head dim
  bool dropout = false;          // dropout_p > 0
};

// Where split-KV keeps its partial results in the plan's workspace (bytes from its start, after the dynamic
// scheduler's tile counter): LSE [split][head][row] then O [split][head][row][head_dim_v], fp32.
struct SplitWorkspace {
  static constexpr int64_t kAlign = 256;
  int64_t lse_offset = 0, o_offset = 0, bytes = 0;
};
// `counter_ints`: the counters at the workspace's start (captured calls; FwdPlan::counter_ints).
inline SplitWorkspace split_workspace(int splits, int64_t heads, int64_t rows, int64_t head_dim_v,
                                      int64_t counter_ints) {
  auto round_up = [](int64_t x) {
    return (x + SplitWorkspace::kAlign - 1) / SplitWorkspace::kAlign * SplitWorkspace::kAlign;
  };
  SplitWorkspace w;
  w.lse_offset = round_up(std::max<int64_t>(counter_ints, 1) * 4);
  w.o_offset = w.lse_offset + round_up(int64_t(splits) * heads * rows * 4);
  w.bytes = w.o_offset + round_up(int64_t(splits) * heads * rows * head_dim_v * 4);
  return w;
}

// How a paged call (Problem::paged) reads its K/V.
enum class PagedLoad : uint8_t {
  kNone,       // not paged
  kGather,     // the used keys gathered into contiguous copies (the workspace's first gather_bytes) first
  kTmaBlocks,  // sm90: one TMA box per key block (page_size a multiple of block_k)
  kTmaRows,    // sm90: boxes of sm90::kPageBoxRows rows from the four producer warps (page_size a multiple of it)
  kRows,       // sm90: the four producer warps gather the rows with cp.async (any other page size)
};

struct FwdPlan {
  Family family = Family::kSm80;
  int instance = -1;  // index into the family's forward kernel table
  int head_dim = 0;   // the compiled head dim of that kernel (>= max(d, dv))
  Variant variant;
  bool windowed = false;  // mask policy: causal / sliding window (WindowMask), else key length only
  bool compact = false;   // sm80: the compact tile (sm80/tiles.hpp fwd_compact)
  bool pack_gqa = false;  // sm90: the query heads of one KV group share a tile (short query sequences)
  sm90::FwdEntry tiles_entry = sm90::FwdEntry::kWide;  // sm90: the tile table's entry (sm90/tiles.hpp)
  int block_q = 0, block_k = 0;
  int warps = 0;   // sm80: warps per CTA; sm90: consumer warpgroups
  int stages = 0;  // sm90: K/V pipeline depth
  Schedule schedule = Schedule::kPerTile;
  int64_t m_blocks = 0;        // query blocks per (batch, head); packed: of (position, head) rows per KV head
  int64_t tiles = 0;           // (query block, head, batch) tiles; packed: heads are KV heads
  int grid = 0;                // CTAs launched (persistent: min(tiles, SMs))
  int section_heads = 1;       // sm90 longest-first order within sections of (batch, head) pairs whose K/V fit L2
  int num_splits = 1;          // sm90 split-KV: key-block ranges per tile (1: none), merged by the combine kernel
  bool fused_combine = false;  //   or by each tile's last arriving warpgroup in the forward itself
  SplitWorkspace split;        // num_splits > 1: where the partials live in the workspace
  // sm90: ints of zeroed counters the launch needs: [0] the dynamic schedule's tile counter, [1, 1 + tiles) the
  // fused combine's arrivals. Eager calls take the per-stream counters (Workspace), which kernels leave at zero;
  // otherwise they are the workspace's first ints, zeroed by the launch.
  int64_t counter_ints = 0;
  PagedLoad paged = PagedLoad::kNone;
  int64_t gather_bytes = 0;     // kGather: bytes of the K and V copies at the workspace's start (kernel's after)
  int64_t v_t_offset = 0;       // FP8 (sm90): where V transposed lives in the workspace (FwdParams::v_t)
  int64_t v_t_keys = 0;         //   and its keys per row
  int64_t workspace_bytes = 0;  // device workspace the launch needs (gathered K/V, tile counter, split-KV partials)
};

struct BwdPlan {
  Family family = Family::kSm80;
  int instance = -1;
  int head_dim = 0;
  Variant variant;
  bool deterministic = false;    // dQ in ordered splits instead of atomics
  bool dq_ordered = false;       // sm90 deterministic: each dQ tile's adds in descending key-block order
  bool dq_first_stores = false;  // sm90 staged dQ: a tile's first add stores; the accumulator is not zeroed
  int block_q = 0, block_k = 0;
  int dq_splits = 1;
  int64_t dq_blocks = 0, dq_tile = 0;  // dQ accumulator geometry (sm80/bwd_params.hpp)
  int tail_pairs = 0;  // sm90 causal: the grid's last (head, batch) pairs taken key block major (sm90/bwd_order.hpp)
  int64_t workspace_bytes = 0;
};

}  // namespace flashattn::cuda
