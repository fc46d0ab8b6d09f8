// The planner: every dispatch decision of a CUDA call, made once from the validated Problem (see plan.hpp).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda/device.hpp"
#include "cuda/fwd_params.hpp"
#include "cuda/bwd_params.hpp"
#include "cuda/host_common.hpp"
#include "cuda/sm80/tiles.hpp"
#include "cuda/sm90/bwd_order.hpp"
#include "cuda/sm90/tiles.hpp"
#include "flashattn/flashattn.hpp"  // dtype_name: the one spelling of a dtype in messages

namespace flashattn::cuda {

const char* family_name(Family f) { return f == Family::kSm90 ? "cuda-sm90" : "cuda-sm80"; }

detail::Error device_info(int device, DeviceInfo* info) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static DeviceInfo cache[kMaxDevices];
  if (device < 0) return detail::invalid("q", "device_index must be >= 0");
  std::lock_guard<std::mutex> lock(mutex);
  if (device < kMaxDevices && cache[device].sms > 0) {
    *info = cache[device];
    return detail::ok();
  }
  DeviceInfo d;
  if (detail::Error e = device_arch(device, &d.arch); !e.ok()) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return runtime_error("cudaDeviceGetAttribute(multiProcessorCount)", e);
  if (cudaError_t e = cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device); e != cudaSuccess)
    return runtime_error("cudaDeviceGetAttribute(L2CacheSize)", e);
  if (device < kMaxDevices) cache[device] = d;
  *info = d;
  return detail::ok();
}

namespace {

bool needs_score_mods(const detail::Problem& p) { return p.softcap > 0.f || p.alibi != nullptr; }
int64_t max_head_dim(const detail::Problem& p) { return std::max(p.head_dim, p.head_dim_v); }

Variant variant_of(const detail::Problem& p, int compiled_head_dim) {
  Variant v;
  v.score_mods = needs_score_mods(p);
  // The score-mods kernel serves every head dim (sm80/kernel_variant.hpp); the plain one only the compiled one.
  v.padded_head_dim = v.score_mods || p.head_dim != compiled_head_dim || p.head_dim_v != compiled_head_dim;
  v.dropout = p.dropout.on;
  return v;
}

// What every forward plan of an instance says, whichever family runs it.
FwdPlan instance_plan(Family family, const detail::Problem& p, Instance instance) {
  FwdPlan f;
  f.family = family;
  f.instance = instance.index;
  f.head_dim = instance.head_dim;
  f.variant = variant_of(p, instance.head_dim);
  f.windowed = p.has_window();
  return f;
}

constexpr int kMaxGridYZ = 65535;  // CUDA grid limit of the sm80 launch's heads (y) and batch (z) dimensions
constexpr int64_t kMaxTmaCoord = (int64_t(1) << 31) - 1;  // TMA coordinates and sm90 tile indices are 32-bit

// ------------------------------------------------------------------------------------------------- sm90
// The TMA and extent rules every sm90 kernel's tensors obey, or "" when the problem's do.
std::string sm90_tma_unfit(const detail::Problem& p) {
  // TMA strides must be positive multiples of 16 bytes (the validation already requires multiples of 8
  // elements); a zero stride is only harmless along a dimension of extent 1.
  const int64_t rows_q = p.varlen ? p.total_q : p.seqlen_q, rows_k = p.varlen ? p.total_k : p.seqlen_k;
  const int64_t batch = p.varlen ? 1 : p.batch;
  // Paged K/V: TMA sees (page_size rows, d, heads, pages).
  const int64_t rows_kv = p.paged() ? p.page_size : rows_k, batch_kv = p.paged() ? p.num_pages : batch;
  auto bad = [&](const detail::RowLayout& l, int64_t rows, int64_t heads, int64_t batches) {
    return (rows > 1 && l.row == 0) || (heads > 1 && l.head == 0) || (batches > 1 && l.batch == 0);
  };
  // dout: the backward's (the forward's Problem has none).
  const char* tma_arg = bad(p.q_layout, rows_q, p.heads_q, batch)                           ? "q"
                        : bad(p.k_layout, rows_kv, p.heads_kv, batch_kv)                    ? "k"
                        : bad(p.v_layout, rows_kv, p.heads_kv, batch_kv)                    ? "v"
                        : bad(p.out_layout, rows_q, p.heads_q, batch)                       ? "out"
                        : p.dout != nullptr && bad(p.dout_layout, rows_q, p.heads_q, batch) ? "dout"
                                                                                            : nullptr;
  if (tma_arg != nullptr)
    return std::string(tma_arg) +
           ": the cuda-sm90 backend loads tensors with TMA, which needs non-zero strides "
           "along every dimension of extent > 1 (use FA_BACKEND_AUTO to fall back to cuda-sm80)";
  const int64_t max_tiles = (p.seqlen_q + sm90::kWarpgroupRows - 1) / sm90::kWarpgroupRows * p.heads_q * p.batch;
  // Paged K/V: TMA's coordinates are a page's row and the page index (validated below 2^31), not rows.
  const int64_t max_rows = std::max(p.varlen ? p.total_q : p.batch * p.seqlen_q, p.paged()  ? p.page_size
                                                                                 : p.varlen ? p.total_k
                                                                                            : p.batch * p.seqlen_k);
  if (max_rows > kMaxTmaCoord || max_tiles > kMaxTmaCoord)
    return "q: the cuda-sm90 backend addresses at most 2^31-1 rows per tensor and 2^31-1 (query block, head, batch) "
           "tiles";
  return "";
}

// Why the sm90 forward cannot take the problem (the message of an explicit cuda-sm90 request), or "" when it can.
std::string sm90_unfit(const detail::Problem& p, Instance* instance) {
  // FP8 runs nowhere else on CUDA: its refusals name what it lacks (no fallback to suggest).
  if (p.fp8() && p.dropout.on) return "dropout_p: the cuda-sm90 FP8 forward has no dropout (forward-only inference)";
  // Dropout has its own kernels, without score mods: those two together run on cuda-sm80.
  if (p.dropout.on && needs_score_mods(p))
    return "dropout_p: the cuda-sm90 forward has no kernel for dropout with softcap/ALiBi (FA_BACKEND_AUTO runs it on "
           "cuda-sm80)";
  *instance = sm90::find_fwd(p.dtype, max_head_dim(p), needs_score_mods(p), p.dropout.on);
  if (p.fp8() && !instance->found())
    return "q: this build has no cuda-sm90 FP8 kernel for head_dim " + std::to_string(p.head_dim) + ", head_dim_v " +
           std::to_string(p.head_dim_v);
  if (!instance->found())
    return "q: the cuda-sm90 backend has no kernel for this dtype with head_dim " + std::to_string(p.head_dim) +
           ", head_dim_v " + std::to_string(p.head_dim_v) + (needs_score_mods(p) ? " and softcap/ALiBi" : "") +
           (p.dropout.on ? " and dropout" : "") + " in this build (use FA_BACKEND_AUTO to fall back to cuda-sm80)";
  if (p.fp8() && (p.head_dim % 16 != 0 || p.head_dim_v % 16 != 0))
    return "q: the cuda-sm90 FP8 forward needs head_dim and head_dim_v multiples of 16 (got " +
           std::to_string(p.head_dim) + ", " + std::to_string(p.head_dim_v) + ")";
  // The transposed V's rows are padded (16 keys; varlen: each sequence to kVtSeqAlign) and addressed by TMA.
  if (p.fp8() && (p.varlen ? p.total_k + int64_t(kVtSeqAlign) * (p.batch + 1) : p.seqlen_k + 15) > kMaxTmaCoord)
    return "k: the cuda-sm90 FP8 forward takes at most 2^31 - 1 keys in its padded copy of V";
  // A cache without pages has no TMA descriptor to encode; 16-bit calls gather it (every key 0), FP8 has no gather.
  if (p.fp8() && p.paged() && p.num_pages == 0)
    return "k: the cuda-sm90 FP8 forward needs a paged cache with at least one page (got 0)";
  return sm90_tma_unfit(p);
}

// Split-KV: when the tiles would leave SMs idle (decode: B x KV heads tiles of one packed query block), each
// tile's key blocks are divided among `splits` CTAs whose partial O and LSE are merged (by the combine kernel, or in
// the forward itself: FwdPlan::fused_combine). Every split keeps at least kMinSplitBlocks key blocks, so that the
// partials' fp32 traffic stays small against the K/V a split reads. `requested`: exec.num_splits (0: decide here;
// n: at most n).
constexpr int kMaxSplits = FwdParams::kMaxKvSplits;
constexpr int64_t kMinSplitBlocks = 4;
int kv_splits(const detail::Problem& p, const FwdPlan& f, int requested, int sms) {
  if (requested == 1 || f.tiles == 0) return 1;
  // Keys a tile can see: a sliding window bounds them below the key length.
  int64_t keys = p.seqlen_k;
  if (p.window_left >= 0)
    keys = std::min(keys, p.window_left + p.seqlen_q + std::max<int64_t>(p.window_right, 0) + f.block_k);
  const int64_t key_blocks = (keys + f.block_k - 1) / f.block_k;
  int64_t splits = requested > 1 ? std::min<int64_t>(requested, key_blocks)
                                 : std::min(int64_t(sms) / f.tiles, key_blocks / kMinSplitBlocks);
  splits = std::clamp<int64_t>(splits, 1, kMaxSplits);
  // Tile indices (tiles x splits) are 32-bit in the kernel.
  while (splits > 1 && f.tiles * splits > kMaxTmaCoord) --splits;
  return int(splits);
}

// The most rows a tile may have for its splits to be merged in the forward (FwdPlan::fused_combine): two per warp of
// the merging warpgroup.
constexpr int64_t kFusedCombineRows = 8;

// The tile table's entry of a call (sm90/tiles.hpp): packed GQA and dropout take the windowed one whatever the
// mask; sequences up to fwd_short_seqlen (the longer of the query and key lengths) the short one.
sm90::FwdEntry sm90_entry(const detail::Problem& p, const FwdPlan& f, int head_dim) {
  // Packed tiles whose rows fit one warpgroup (decode: a few query positions of a group) take the decode entry:
  // one consumer warpgroup, two CTAs per SM. Not with softcap (no such instantiation: build time).
  if (f.pack_gqa && !p.fp8() && sm90::decode_entry_exists(head_dim) && !f.variant.score_mods &&
      p.seqlen_q * p.group() <= sm90::kWarpgroupRows)
    return sm90::FwdEntry::kDecode;
  if (f.pack_gqa || p.dropout.on) return sm90::FwdEntry::kWindowed;
  const int64_t longest = std::max(p.seqlen_q, p.seqlen_k);
  int64_t narrow_seqlen = sm90::fwd_narrow_seqlen(head_dim, f.windowed, p.fp8());
#ifdef FLASHATTN_SM90_ABLATIONS
  if (const char* limit = std::getenv("FLASHATTN_SM90_NARROW_SEQLEN"); limit != nullptr)
    narrow_seqlen = std::strtoll(limit, nullptr, 10);
#endif
  if (!p.fp8() && !f.variant.score_mods && sm90::narrow_entry_exists(head_dim) && longest <= narrow_seqlen)
    return sm90::FwdEntry::kNarrow;
  int64_t short_seqlen = sm90::fwd_short_seqlen(head_dim, f.windowed, p.fp8());
#ifdef FLASHATTN_SM90_ABLATIONS
  // Ablation builds: the limit from the environment, read at every call, so that a benchmark measures both
  // entries at one shape in one process.
  if (const char* limit = std::getenv("FLASHATTN_SM90_SHORT_SEQLEN"); limit != nullptr)
    short_seqlen = std::strtoll(limit, nullptr, 10);
#endif
  if (longest <= short_seqlen) return sm90::FwdEntry::kShort;
  return f.windowed ? sm90::FwdEntry::kWindowed : sm90::FwdEntry::kWide;
}

detail::Error plan_sm90(const detail::Problem& p, const fa_exec& exec, Instance instance, FwdPlan* plan) {
  DeviceInfo dev;
  if (detail::Error e = device_info(p.device_index, &dev); !e.ok()) return e;
  FwdPlan& f = *plan = instance_plan(Family::kSm90, p, instance);
  // GQA with query sequences shorter than a tile packs the group's query heads into the tile's rows: the tile
  // is full and each K/V block is read once per group instead of once per query head. Not with ALiBi (a slope
  // per head inside one tile). Packed tiles take the causal/window tiles.
  const sm90::FwdTiles windowed_tiles = sm90::fwd_tiles(instance.head_dim, sm90::FwdEntry::kWindowed);
  // Not for FP8 yet: its packed Q gather is not written.
  // Not with dropout either: its mask is keyed by one query head per tile.
  f.pack_gqa =
      p.group() > 1 && p.seqlen_q < windowed_tiles.block_q() && p.alibi == nullptr && !p.fp8() && !p.dropout.on;
  f.tiles_entry = sm90_entry(p, f, instance.head_dim);
  const sm90::FwdTiles t = sm90::fwd_tiles(instance.head_dim, f.tiles_entry, p.fp8());
  f.block_q = t.block_q();
  f.block_k = t.block_k;
  f.warps = t.consumer_warpgroups;
  f.stages = t.stages;
  const int64_t tile_rows = p.seqlen_q * (f.pack_gqa ? p.group() : 1);  // packed: (position, head) rows
  f.m_blocks = (tile_rows + f.block_q - 1) / f.block_q;
  const int64_t tile_heads = f.pack_gqa ? p.heads_kv : p.heads_q;
  f.tiles = f.m_blocks * tile_heads * p.batch;
  // Under causal/window tile lengths differ: a global counter hands out tiles longest first. Without a window
  // every tile costs the same and the static round-robin needs no counter (sm90/fwd_kernel.cuh TileScheduler).
  f.schedule = f.windowed ? Schedule::kPersistentDynamic : Schedule::kPersistentStatic;
  // CTA slots: one per SM (most of shared memory), t.ctas_per_sm for the decode tiles. Splits fill the SMs, not
  // the slots: at two CTAs per SM, splits for every slot (1 x 64k: 33, 8 x 16k: 4) lost more in the combine than the
  // second CTA gained (H100 decode sweep, bench/results/2026-12-06_h100_session31/README.md: 16 and 2 splits were
  // 1.0 % and 0.9 % faster a call; session 24 saw the same at 1 x 64k on the H200).
  const int slots = dev.sms * t.ctas_per_sm;
  f.num_splits = kv_splits(p, f, exec.num_splits, dev.sms);
  f.grid = int(std::min<int64_t>(f.tiles * f.num_splits, slots));
  // K and V bytes one (batch, head) streams: a section of heads whose K/V take about half of L2.
  const int64_t elem = int64_t(flashattn::dtype_size(p.dtype));
  const int64_t kv_bytes = std::max<int64_t>(p.seqlen_k, 1) * (p.head_dim + p.head_dim_v) * elem;
  f.section_heads =
      int(std::clamp<int64_t>(dev.l2_bytes / 2 / kv_bytes, 1, std::max<int64_t>(tile_heads * p.batch, 1)));
  // Paged K/V: pages holding whole key blocks take one TMA box per block; pages of a multiple of 16 rows, 16-row
  // boxes issued by the four producer warps (decode, page 16: 3.0-3.9 TB/s, 0.82-0.96x the contiguous cache, where
  // the four warps' cp.async rows read 2.0-2.5 and boxes from one thread 1.3-1.6:
  // bench/results/2026-12-02_h200_session19/README.md); other page sizes, rows gathered with cp.async.
  if (p.paged())
    f.paged = p.page_size % f.block_k == 0            ? PagedLoad::kTmaBlocks
              : p.page_size % sm90::kPageBoxRows == 0 ? PagedLoad::kTmaRows
                                                      : PagedLoad::kRows;
  // Split-KV's merge: in the forward itself, by the last warpgroup to store a tile's partials, where the decode
  // entry's tile has few rows (a group's query heads at one position), so that a warp of that warpgroup merges one or
  // two rows, and where every (tile, split) has a CTA of its own; the combine kernel otherwise, one warp per row over
  // the whole GPU. The fused merge saves the combine's launch and the kernel boundary: H100 decode, GQA 32/8 d128,
  // the plan's splits: 8 x 16k 1.5 % faster a call, 1 x 64k 2.2 us less kernel time. Each arrival costs its
  // warpgroup a fence and an atomic's round trip, so CTAs that walk several splits (explicit counts beyond the CTA
  // slots) lost 12-92 % with it (32 splits at 8 x 16k to 128 x 4k; bench/results/2026-12-07_h100_session56/).
  f.fused_combine = f.num_splits > 1 && f.tiles_entry == sm90::FwdEntry::kDecode && tile_rows <= kFusedCombineRows &&
                    f.tiles * f.num_splits <= slots;
#ifdef FLASHATTN_SM90_ABLATIONS
  // Ablation builds: FLASHATTN_SM90_COMBINE_KERNEL=1 keeps the combine kernel (read at every call: both in one
  // process).
  if (const char* v = std::getenv("FLASHATTN_SM90_COMBINE_KERNEL"); v != nullptr && std::strcmp(v, "1") == 0)
    f.fused_combine = false;
#endif
  // Counters (FwdPlan::counter_ints): the workspace's first ints serve captured calls (zeroed by their launch); eager
  // calls take the per-stream counters instead (Workspace), which need no memset.
  f.counter_ints = f.fused_combine ? 1 + f.tiles : f.schedule == Schedule::kPersistentDynamic ? 1 : 0;
  f.workspace_bytes = f.counter_ints * int64_t(sizeof(int));
  if (f.num_splits > 1) {
    f.split = split_workspace(f.num_splits, p.heads_q, p.varlen ? p.total_q : p.batch * p.seqlen_q, p.head_dim_v,
                              f.counter_ints);
    f.workspace_bytes = f.split.bytes;
  }
  // FP8: the P.V wgmma reads V K-major (keys contiguous), so the launch first writes V transposed after the rest
  // of the workspace, 16-key aligned rows (FwdParams::v_t).
  if (p.fp8()) {
    // Batched: a row of 16-key aligned keys per batch entry. Varlen: one row of every sequence, each on a kVtSeqAlign
    // boundary (v_t_seq_start), the last one's padding included.
    f.v_t_keys = p.varlen ? kVtSeqAlign * ((p.total_k + kVtSeqAlign - 1) / kVtSeqAlign + p.batch)
                          : (std::max<int64_t>(p.seqlen_k, 1) + 15) / 16 * 16;
    f.v_t_offset = (f.workspace_bytes + SplitWorkspace::kAlign) / SplitWorkspace::kAlign * SplitWorkspace::kAlign;
    f.workspace_bytes = f.v_t_offset + (p.varlen ? 1 : p.batch) * p.heads_kv * p.head_dim_v * f.v_t_keys;
  }
  return detail::ok();
}

// ------------------------------------------------------------------------------------------------- sm80
detail::Error grid_fits_sm80(const detail::Problem& p) {
  if (p.heads_q > kMaxGridYZ || p.batch > kMaxGridYZ)
    return detail::unsupported("q: the cuda-sm80 backend supports at most " + std::to_string(kMaxGridYZ) +
                               " heads and batch entries (got " + std::to_string(p.heads_q) + " heads, batch " +
                               std::to_string(p.batch) + ")");
  return detail::ok();
}

detail::Error plan_sm80(const detail::Problem& p, FwdPlan* plan) {
  const Instance instance = sm80::find_fwd(p.dtype, max_head_dim(p));
  if (!instance.found())
    return detail::unsupported(
        "q: the cuda-sm80 backend has no kernel for " + std::string(flashattn::dtype_name(p.dtype)) +
        " with head_dim " + std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
        " in this build (built: " + sm80::built_list() + "; FLASHATTN_KERNELS=default or all builds more)");
  if (detail::Error e = grid_fits_sm80(p); !e.ok()) return e;
  FwdPlan& f = *plan = instance_plan(Family::kSm80, p, instance);
  f.compact = sm80::fwd_compact(instance.head_dim, f.windowed, p.seqlen_k);
  const sm80::FwdTiles t =
      f.variant.dropout ? sm80::fwd_dropout_tiles(instance.head_dim) : sm80::fwd_tiles(instance.head_dim, f.compact);
  f.block_q = t.block_q;
  f.block_k = t.block_k;
  f.warps = t.warps;
  f.stages = 0;
  f.schedule = Schedule::kPerTile;
  f.m_blocks = (p.seqlen_q + t.block_q - 1) / t.block_q;
  f.tiles = f.m_blocks * p.heads_q * p.batch;
  f.grid = int(std::min<int64_t>(f.tiles, int64_t(1) << 30));
  f.num_splits = 1;
  f.workspace_bytes = 0;
  return detail::ok();
}

// Paged K/V the sm90 load collective reads itself, of any page size: TMA boxes of whole key blocks where the page
// size is a multiple of the block, of 16 rows where it is a multiple of 16, cp.async row gathers otherwise
// (sm90/fwd_load.cuh). The sm80 family reads gathered contiguous copies. A cache without pages has no TMA descriptor
// to encode (an extent of 0): it is gathered (every key reads as 0).
bool sm90_reads_pages(const detail::Problem& p) { return p.num_pages > 0; }

}  // namespace

detail::Error plan_forward(const detail::Problem& p, const fa_exec& exec, Family selected, FwdPlan* plan) {
  *plan = FwdPlan{};
  // A paged call no kernel reads natively is planned as the contiguous call over its gathered keys, with the two
  // copies ahead of that plan's workspace.
  // The copies hold every sequence's whole capacity (batch x max_pages x page_size keys): the memory this path
  // costs, refused when it overflows.
  auto gathered = [&](Family family) {
    GatherLayout layout;
    if (!gather_layout(p, &layout))
      return detail::invalid("block_table",
                             "the gathered copy of the paged K/V (batch x max_pages x page_size keys) "
                             "is too large to address");
    detail::Error e = plan_forward(contiguous_kv(p, nullptr, nullptr), exec, family, plan);
    if (!e.ok()) return e;
    plan->paged = PagedLoad::kGather;
    plan->gather_bytes = layout.bytes;
    plan->workspace_bytes += plan->gather_bytes;
    return e;
  };
  if (selected == Family::kSm90) {
#ifdef FLASHATTN_WITH_SM90
    Instance instance;
    const std::string unfit = sm90_unfit(p, &instance);
    if (unfit.empty())
      return p.paged() && !sm90_reads_pages(p) ? gathered(selected) : plan_sm90(p, exec, instance, plan);
    if (exec.backend == FA_BACKEND_CUDA_SM90 || p.fp8()) return detail::unsupported(unfit);
#else
    if (exec.backend == FA_BACKEND_CUDA_SM90)
      return detail::unsupported("exec.backend: this build of flashattn has no cuda-sm90 kernels");
#endif
  }
  if (p.fp8())
    return detail::unsupported(
        "q: float8_e4m3fn inputs run on the cuda-sm90 backend only (a compute capability 9.0 GPU and a build with "
        "90a in FLASHATTN_CUDA_ARCHS); the CPU backend takes them too");
  if (p.paged()) return gathered(Family::kSm80);
  return plan_sm80(p, plan);
}

namespace {

// The dQ accumulator geometry and the workspace bytes of a backward plan (bwd_params.hpp).
void bwd_geometry(const detail::Problem& p, BwdPlan& b) {
  const int64_t rows_q = p.varlen ? p.total_q : p.batch * p.seqlen_q;
  const int64_t rows_k = p.varlen ? p.total_k : p.batch * p.seqlen_k;
  b.dq_tile = int64_t(b.block_q) * b.head_dim;
  b.dq_blocks = rows_q / b.block_q + p.batch + 1;
  BwdParams geometry;
  geometry.heads_q = int(p.heads_q);
  geometry.group = int(p.group());
  geometry.head_dim = int(p.head_dim);
  geometry.head_dim_v = int(p.head_dim_v);
  geometry.rows_q = rows_q;
  geometry.rows_k = rows_k;
  geometry.dsum_stride = dsum_stride(rows_q);
  geometry.dq_splits = b.dq_splits;
  geometry.dq_ordered = b.dq_ordered;
  geometry.dq_first_stores = b.dq_first_stores;
  geometry.dq_blocks = b.dq_blocks;
  geometry.dq_tile = b.dq_tile;
  b.workspace_bytes = bwd_workspace(geometry).total() * int64_t(sizeof(float));
}

#ifdef FLASHATTN_WITH_SM90
// Why the sm90 backward cannot take the problem, or "" when it can. Softcap / ALiBi (the tanh derivative and the
// bias need their own instantiation) run the sm80 backward for now.
std::string sm90_bwd_unfit(const detail::Problem& p, Instance* instance) {
  *instance = sm90::find_bwd(p.dtype, max_head_dim(p), p.dropout.on);
  if (!instance->found())
    return "q: the cuda-sm90 backend has no backward kernel for this dtype with head_dim " +
           std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
           (p.dropout.on ? " and dropout" : "") + " in this build";
  if (needs_score_mods(p)) return "softcap: the cuda-sm90 backward has no softcap/ALiBi kernels yet";
  if (std::string unfit = sm90_tma_unfit(p); !unfit.empty()) return unfit;
  if (p.heads_q > kMaxGridYZ || p.batch > kMaxGridYZ)
    return "q: the cuda-sm90 backward supports at most 65535 heads and batch entries";
  return "";
}
#endif

}  // namespace

detail::Error plan_backward(const detail::Problem& p, const fa_exec& exec, Family selected, BwdPlan* plan) {
  *plan = BwdPlan{};
  BwdPlan& b = *plan;
  b.deterministic = exec.deterministic != 0;
#ifdef FLASHATTN_WITH_SM90
  if (selected == Family::kSm90) {
    Instance instance;
    const std::string unfit = sm90_bwd_unfit(p, &instance);
    if (unfit.empty()) {
      const sm90::BwdTiles tiles = sm90::bwd_tiles(instance.head_dim);
      b.family = Family::kSm90;
      b.instance = instance.index;
      b.head_dim = instance.head_dim;
      b.variant = variant_of(p, instance.head_dim);
      b.block_q = tiles.block_q;
      b.block_k = tiles.block_k;
      b.dq_splits = 1;
      b.dq_ordered = b.deterministic;
      // The kernels whose dQ writer warp stages dQ (bwd_traits.cuh: kDqStaged) store each tile's first add, so the
      // preprocess need not zero the accumulator: +6-24 % at 512-1k tokens, most under a causal mask (H100, bf16,
      // bench/results/2026-12-07_h100_session55/dq_zeroed_ab.csv).
      b.dq_first_stores = !tiles.split_head_dim;
#ifdef FLASHATTN_SM90_ABLATIONS
      // Ablation builds: FLASHATTN_SM90_DQ_ZEROED=1 zeroes it and adds throughout (read at every call: both in one
      // process).
      if (const char* v = std::getenv("FLASHATTN_SM90_DQ_ZEROED"); v != nullptr && std::strcmp(v, "1") == 0)
        b.dq_first_stores = false;
#endif
      // About two waves of CTAs at the grid's end in key-block-major order where bwd_tail_pairs
      // (sm90/bwd_order.hpp) takes one: a causal-like mask, not deterministic.
      DeviceInfo dev;
      if (detail::Error e = device_info(p.device_index, &dev); !e.ok()) return e;
      const bool falling_lengths = p.window_left < 0 && p.window_right >= 0;
      b.tail_pairs = sm90::bwd_tail_pairs(p.heads_q * p.batch, (p.seqlen_k + b.block_k - 1) / b.block_k,
                                          2 * int64_t(dev.sms), falling_lengths, b.deterministic);
      bwd_geometry(p, b);
      return detail::ok();
    }
    // Otherwise the sm80 backward runs, whichever backend was asked for: it takes every problem the forward
    // of either family takes.
  }
#else
  (void)selected;
#endif
  const Instance instance = sm80::find_bwd(p.dtype, max_head_dim(p));
  if (!instance.found())
    return detail::unsupported("q: the cuda-sm80 backend has no backward kernel for " +
                               std::string(flashattn::dtype_name(p.dtype)) + " with head_dim " +
                               std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
                               " in this build");
  if (detail::Error e = grid_fits_sm80(p); !e.ok()) return e;
  b.family = Family::kSm80;
  b.instance = instance.index;
  b.head_dim = instance.head_dim;
  b.variant = variant_of(p, instance.head_dim);
  const sm80::BwdTiles tiles = sm80::bwd_tiles(instance.head_dim);
  b.block_q = tiles.block_q;
  b.block_k = tiles.block_k;
  // Deterministic: enough dQ splits (CTAs per head and batch) to fill the GPU once, never more than there are key
  // blocks.
  b.dq_splits = 1;
  if (b.deterministic) {
    DeviceInfo dev;
    if (detail::Error e = device_info(p.device_index, &dev); !e.ok()) return e;
    const int64_t ctas = std::max<int64_t>(1, p.batch * p.heads_q);
    const int64_t key_blocks = std::max<int64_t>(1, (p.seqlen_k + tiles.block_k - 1) / tiles.block_k);
    b.dq_splits = int(std::min(key_blocks, (dev.sms + ctas - 1) / ctas));
  }
  bwd_geometry(p, b);
  return detail::ok();
}

}  // namespace flashattn::cuda
