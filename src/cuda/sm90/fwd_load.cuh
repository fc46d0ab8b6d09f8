// The load collective of the sm90 forward: one producer warp issues the TMA loads of Q (per tile) and of K/V (per
// key block) into a multi-stage pipeline completing on mbarriers. GQA-packed tiles gather Q in the consumers
// instead (gather_q_packed): their rows are (position, head) pairs, not a TMA box. Paged K/V: TMA boxes of
// whole key blocks, or of 16 rows inside one page (load_boxes), or rows gathered with cp.async (load_rows); the
// last two are shared by all four warps of the producer warpgroup (warps 1-3 follow the tiles warp 0 publishes).
// The consumers only see pipeline stages.
#pragma once

#include <cute/arch/copy_sm80.hpp>

#include "cuda/sm90/fwd_tile.cuh"

namespace flashattn::cuda::sm90 {

// The lane index, read where it is used: a volatile read keeps the compiler from hoisting the row gathers'
// lane-derived shared-memory offsets out of the tile loop, where they stayed live (and spilled: the producer has 24
// registers) through every other load path.
__device__ __forceinline__ int lane_here() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

template <class Traits, class Opts>
struct FwdLoad {
  static constexpr bool kPackGQA = Opts::kPackGQA;
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using Tile = FwdTile<Traits, Opts>;
  static constexpr int kWgRows = Traits::kWgRows, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kWGs = Traits::kConsumerWGs, kWgThreads = Traits::kWgThreads;
  static constexpr int kProducerWarpThreads = 32;
  // Paged rows (load_rows) and row boxes (load_boxes): each warp of the producer warpgroup loads a share of a block.
  static constexpr int kRowWarps = Traits::kWgThreads / kProducerWarpThreads;
  static constexpr int kRowThreads = Traits::kWgThreads;  // producer arrivals per stage in that mode
  // Every producer warp loads a share of each key block: paged rows (load_rows) and 16-row boxes (load_boxes).
  __device__ static bool shares_blocks(const FwdParams& p) {
    return p.paged_rows || (p.block_table != nullptr && p.paged_box_rows == kPageBoxRows);
  }
  // Q buffers: the kernel's, but one for packed tiles (their consumers gather Q themselves: no load latency to
  // hide), and one for calls with paged rows or row boxes, whose follower warps walk one (follow; two were not
  // measured there).
  static constexpr int kQStages = kPackGQA ? 1 : Traits::kQStages;
  __device__ static int q_stages(const FwdParams& p) { return kQStages > 1 && !shares_blocks(p) ? kQStages : 1; }
  static constexpr int kQSpaceThreads = Traits::kConsumerThreads + kProducerWarpThreads;

  // Q-space protocol (the producer warp and every consumer thread): the consumers release a Q buffer (and O's
  // space where O is staged there) once nothing reads it; the producer waits for that before it loads the buffer
  // again. One buffer: a named barrier, each arrive matched by the producer's sync before the next publication or in
  // finish (the protocol of the one-buffer kernels as they were, which the SingleQ ablation keeps). Two: an mbarrier
  // per buffer (a second named barrier would not fit beside CUTLASS's reserved ids).
  template <class SharedStorage>
  __device__ static void release_q_space(SharedStorage& ss, int stage) {
    if constexpr (kQStages > 1)
      ss.empty_q[stage].arrive();
    else
      cutlass::arch::NamedBarrier::arrive(kQSpaceThreads, Barrier::kQFree);
  }
  // Paged rows and row boxes: warp 0 publishes a tile only once warps 1-3 have read the one before (follow), so
  // that none of them misses a phase of barrier_q. Their shares of a tile's blocks do not order this by themselves: a
  // tile without key blocks is released by the consumers at once, and two in a row could otherwise complete two
  // phases while a follower still issues the tile before them.
  __device__ void wait_followers() {
    if (ring.count > 0 && shares_blocks(kp.p)) ss.follow_ack.wait((ring.count - 1) & 1);
  }
  __device__ void wait_q_space() {
    if (ring.count < ring.stages) return;  // the buffer's first tile
    if constexpr (kQStages > 1)
      ss.empty_q[ring.stage()].wait(ring.free_phase());
    else
      cutlass::arch::NamedBarrier::sync(kQSpaceThreads, Barrier::kQFree);
  }

  const KernelParams<Traits>& kp;
  typename Traits::SharedStorage& ss;
  Pipeline& pipe_k;
  Pipeline& pipe_v;
  bool leader;                  // the lane that issues the copies
  bool claim_requests = false;  // warp 0 with the claim warp (TileClaims): ask for each next claim (request_claim)
  int warp;  // of the producer warpgroup: 0 issues everything but the row gathers, which all four share
  PipelineState k_write = cutlass::make_producer_start_state<Pipeline>();
  PipelineState v_write = cutlass::make_producer_start_state<Pipeline>();
  QRing ring;  // the Q buffers this warp has published into

  __device__ FwdLoad(const KernelParams<Traits>& kp_, typename Traits::SharedStorage& ss_, Pipeline& k, Pipeline& v,
                     int warp_)
      : kp(kp_), ss(ss_), pipe_k(k), pipe_v(v), leader(threadIdx.x == 0), warp(warp_), ring{0, q_stages(kp_.p)} {}

  // Loads tile `idx` (skipping tiles without rows) and publishes it to the consumers with its Q load. The K/V
  // sources are separate walks so that each keeps only its own state live (the producer has 24 registers).
  __device__ void load(const TileScheduler& sched, int idx) {
    const FwdParams& p = kp.p;
    const Tile tile(p, sched.tile(idx));
    if (tile.empty()) {
      request_claim();
      return;
    }
    const TileScheduler::Tile& t = tile.t;
    const int b = p.cu_seqlens_q != nullptr ? 0 : t.batch;
    const int kv_head = sched.kv_head(t.head);
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});

    if constexpr (Traits::kVTransposed) {
      // FP8: V from its transposed copy (contiguous per batch entry, or per sequence from v_t_seq_start), one TMA
      // box per key block; K paged or not, through the same paths as 16-bit K.
      Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});
      Tensor mVt = domain_offset(make_coord(_0{}, int32_t(v_t_seq_start(p.cu_seqlens_k, t.batch))),
                                 kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, kv_head, b));
      Tensor gVt = local_tile(mVt, Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));  // (d, N, n)
      auto v_parts = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
      Tensor tVg = get<0>(v_parts);
      Tensor tVs = get<1>(v_parts);
      auto load_v = [&](int n) {
        pipe_v.producer_acquire(v_write);
        if (leader) copy(kp.tma_v.with(*pipe_v.producer_get_barrier(v_write)), tVg(_, n), tVs(_, v_write.index()));
        ++v_write;
      };
      if (p.paged_rows) {
        walk(
            tile, idx, b,
            [&](int n) {
              load_rows<false>(sK, tile, kv_head, n, pipe_k, k_write);
              ++k_write;
            },
            load_v);
      } else if (p.block_table != nullptr) {
        walk(
            tile, idx, b,
            [&](int n) {
              load_boxes(kp.tma_k, kp.tma_k_page, kp.shape_k, sK, tile, kv_head, n, pipe_k, k_write);
              ++k_write;
            },
            load_v);
      } else {
        Tensor mK =
            domain_offset(make_coord(tile.seq.k_start, _0{}), kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, kv_head, b));
        Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, d, n)
        auto k_parts = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        Tensor tKg = get<0>(k_parts);
        Tensor tKs = get<1>(k_parts);
        walk(
            tile, idx, b,
            [&](int n) {
              pipe_k.producer_acquire(k_write);
              if (leader)
                copy(kp.tma_k.with(*pipe_k.producer_get_barrier(k_write)), tKg(_, n), tKs(_, k_write.index()));
              ++k_write;
            },
            load_v);
      }
    } else {
      if (p.paged_rows) {
        walk(
            tile, idx, b,
            [&](int n) {
              load_rows<false>(sK, tile, kv_head, n, pipe_k, k_write);
              ++k_write;
            },
            [&](int n) {
              load_rows<true>(sV, tile, kv_head, n, pipe_v, v_write);
              ++v_write;
            });
        return;
      }
      if (p.block_table != nullptr) {
        walk(
            tile, idx, b,
            [&](int n) {
              load_boxes(kp.tma_k, kp.tma_k_page, kp.shape_k, sK, tile, kv_head, n, pipe_k, k_write);
              ++k_write;
            },
            [&](int n) {
              load_boxes(kp.tma_v, kp.tma_v_page, kp.shape_v, sV, tile, kv_head, n, pipe_v, v_write);
              ++v_write;
            });
        return;
      }
      Tensor mK =
          domain_offset(make_coord(tile.seq.k_start, _0{}), kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, kv_head, b));
      Tensor mV =
          domain_offset(make_coord(tile.seq.k_start, _0{}), kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, kv_head, b));
      Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, d, n)
      Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
      auto k_parts = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      Tensor tKg = get<0>(k_parts);
      Tensor tKs = get<1>(k_parts);
      auto v_parts = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      Tensor tVg = get<0>(v_parts);
      Tensor tVs = get<1>(v_parts);
      walk(
          tile, idx, b,
          [&](int n) {
            pipe_k.producer_acquire(k_write);
            if (leader) copy(kp.tma_k.with(*pipe_k.producer_get_barrier(k_write)), tKg(_, n), tKs(_, k_write.index()));
            ++k_write;
          },
          [&](int n) {
            pipe_v.producer_acquire(v_write);
            if (leader) copy(kp.tma_v.with(*pipe_v.producer_get_barrier(v_write)), tVg(_, n), tVs(_, v_write.index()));
            ++v_write;
          });
    }
  }

  // The key blocks of one tile through load_k / load_v (each fills the next stage of its pipeline), and the tile's
  // publication with its Q load. Blocks from the last to the first (the one partial block is masked first). With one
  // Q buffer, K of the first block goes first: it only waits for a free stage, so it streams in while the previous
  // tile's last blocks still run, and the Q load waits for them to release the buffer. With two, the buffer was
  // released a tile ago and Q goes first.
  template <class LoadK, class LoadV>
  __device__ void walk(const Tile& tile, int idx, int b, LoadK&& load_k, LoadV&& load_v) {
    const TileScheduler::Tile& t = tile.t;
    const BlockRange range = tile.range;
    const bool k_first = ring.stages == 1;
    if (k_first && range.hi > range.lo) load_k(range.hi - 1);
    wait_q_space();
    wait_followers();
    const int stage = ring.stage();
    ++ring.count;
    if (leader) {
      publish_tile(ss.tile_idx[stage], idx);
      if constexpr (kPackGQA) {
        ss.barrier_q[stage].arrive();  // packed rows are no TMA box: each consumer warpgroup gathers its own
      } else {
        Tensor sQ = make_tensor(make_smem_ptr(ss.q.data() + stage * cosize_v<typename Traits::SmemLayoutQ>),
                                typename Traits::SmemLayoutQ{});
        Tensor mQ =
            domain_offset(make_coord(tile.seq.q_start, _0{}), kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, t.head, b));
        Tensor gQ = local_tile(mQ, Shape<Int<kWgRows>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (64, d, m/64)
        auto q_parts = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        ss.barrier_q[stage].arrive_and_expect_tx(Traits::kTileBytesQ * kWGs);
        CUTE_UNROLL
        for (int w = 0; w < kWGs; ++w)
          copy(kp.tma_q.with(reinterpret_cast<uint64_t&>(ss.barrier_q[stage])),
               get<0>(q_parts)(_, t.m_block * kWGs + w), get<1>(q_parts)(_, w));
      }
    }
    if (!k_first && range.hi > range.lo) load_k(range.hi - 1);
    rest_of_blocks(range, load_k, load_v, [&] { request_claim(); });
  }

  // The claim warp's next claim (TileClaims), asked for once per tile this warp loads: two key blocks before the
  // tile's last loads (at its start when it has fewer), so that the atomic's round trip runs under those loads' waits
  // for free stages, while the claimed tile is still one the CTA takes next (claimed at a tile's start, the claim
  // waited a whole tile: at d256 causal 16k, 1024 tiles of up to 205 key blocks on 132 CTAs, a long tile claimed
  // behind another long one ends late).
  __device__ void request_claim() {
    if (claim_requests && leader) {
      asm volatile("" ::: "memory");  // after take's read of the slot (the arrive's asm has no memory clobber)
      ss.claim_empty.arrive();
    }
  }

  // The blocks after the first K: Q.K^T of block n-1 is issued before P.V of block n (intra-warpgroup overlap), so
  // K(n-1) before V(n). Every producer warp takes this order (follow), so that their stages line up. `at_end` runs
  // exactly once: before the last K load, or before the last V load of a one-block tile, or at once without blocks.
  template <class LoadK, class LoadV, class AtEnd>
  __device__ static void rest_of_blocks(const BlockRange& range, LoadK&& load_k, LoadV&& load_v, AtEnd&& at_end) {
    for (int n = range.hi - 1; n > range.lo; --n) {
      if (n == range.lo + 1) at_end();
      load_k(n - 1);
      load_v(n);
    }
    if (range.hi - range.lo <= 1) at_end();
    if (range.hi > range.lo) load_v(range.lo);
  }

  // Warps 1-3 of the producer warpgroup with paged rows or row boxes (shares_blocks): each tile warp 0 publishes
  // (barrier_q, as the consumers see it), their share of its rows or boxes of K (and V, unless FP8 reads V by TMA) in
  // warp 0's block order. Each acknowledges every publication it has read (follow_ack, wait_followers), so that warp 0
  // never publishes over one they have not seen.
  __device__ void follow(const TileScheduler& sched) {
    if (kp.p.paged_rows)
      follow_blocks<true>(sched);
    else
      follow_blocks<false>(sched);
  }

  // One walk per read path, so that each keeps only its own state live (the producer has 24 registers).
  template <bool kRows>
  __device__ void follow_blocks(const TileScheduler& sched) {
    const FwdParams& p = kp.p;
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    QRing follow_ring{0, 1};  // q_stages: one buffer whenever the followers run
    for (;;) {
      int stage;
      const int idx = next_published_tile(ss, follow_ring, stage);
      __syncwarp();  // every lane has read the index before warp 0 may overwrite it
      if (lane_here() == 0) ss.follow_ack.arrive();
      if (idx >= sched.count()) break;
      const Tile tile(p, sched.tile(idx));
      const int kv_head = sched.kv_head(tile.t.head);
      auto load_k = [&](int n) {
        if constexpr (kRows)
          load_rows<false>(sK, tile, kv_head, n, pipe_k, k_write);
        else
          load_boxes(kp.tma_k, kp.tma_k_page, kp.shape_k, sK, tile, kv_head, n, pipe_k, k_write);
        ++k_write;
      };
      auto load_v = [&](int n) {
        if constexpr (!Traits::kVTransposed) {
          if constexpr (kRows)
            load_rows<true>(sV, tile, kv_head, n, pipe_v, v_write);
          else
            load_boxes(kp.tma_v, kp.tma_v_page, kp.shape_v, sV, tile, kv_head, n, pipe_v, v_write);
          ++v_write;
        }
      };
      if (tile.range.hi > tile.range.lo) load_k(tile.range.hi - 1);
      rest_of_blocks(tile.range, load_k, load_v, [] {});
    }
    if constexpr (kRows) cp_async_wait<0>();  // no copy outlives its issuing lane
  }

  // Key block n of a paged tile into the next stage: key j of the sequence is slot j % page_size of page
  // block_table[b][j / page_size]. Whole blocks (p.paged_box_rows == kBlockN: the page size is a multiple of the
  // block) take one box of the block descriptor, issued by the leader. Other page sizes take kBlockN / kPageBoxRows
  // row boxes per atom column, and every warp of the producer warpgroup issues a share of them (row box i, all its
  // columns, by warp i % 4, from its lane 0, which announces its own bytes on the stage's barrier: the kernel counts
  // kRowWarps producer arrivals per stage in this mode): at decode, page 16, they read 3.0-3.9 TB/s where one thread's
  // boxes read 1.3-1.6 and lanes 0/1 issuing a column each 2.8-3.5 (bench/results/2026-12-02_h200_session19). Rows at
  // or past the sequence's keys never read the table: their box
  // gets page -1, which TMA fills with zeros, as it does for any out-of-range page index; the table entries are read
  // before the stage is acquired, so that their latency runs under the wait for a free stage.
  template <class Tma, class TmaPage, class Smem>
  __device__ void load_boxes(const Tma& tma, const TmaPage& tma_page, const typename Traits::GmemShape& shape, Smem& sX,
                             const Tile& tile, int kv_head, int n, Pipeline& pipe, PipelineState& state) {
    const FwdParams& p = kp.p;
    const int32_t* table = p.block_table + int64_t(tile.t.batch) * p.block_table_stride;
    const int key0 = n * kBlockN;
    if (p.paged_box_rows == kBlockN) {
      const int page = leader && key0 < tile.seq.len_k ? table[key0 / p.page_size] : -1;
      pipe.producer_acquire(state);
      if (leader) {
        Tensor g = local_tile(tma.get_tma_tensor(shape)(_, _, kv_head, page), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                              make_coord(_, _0{}));  // (N, d, page_size / N)
        auto parts = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sX), group_modes<0, 2>(g));
        copy(tma.with(*pipe.producer_get_barrier(state)), get<0>(parts)(_, (key0 % p.page_size) / kBlockN),
             get<1>(parts)(_, state.index()));
      }
      return;
    }
    constexpr int kBoxes = kBlockN / kPageBoxRows, kCols = kHeadDim / Traits::kAtomCols, kAtomCols = Traits::kAtomCols;
    constexpr int kWarpBoxes = (kBoxes + kRowWarps - 1) / kRowWarps;  // the most row boxes one warp issues
    constexpr int kBoxBytes = kPageBoxRows * kAtomCols * int(sizeof(Element));
    const bool lead = lane_here() == 0;
    int page[kWarpBoxes];
    CUTE_UNROLL
    for (int j = 0; j < kWarpBoxes; ++j) {
      const int row = key0 + (warp + j * kRowWarps) * kPageBoxRows;
      page[j] = lead && warp + j * kRowWarps < kBoxes && row < tile.seq.len_k ? table[row / p.page_size] : -1;
    }
    pipe.producer_acquire(state);  // no leader in this mode: each warp announces its own bytes
    if (!lead) return;
    const int mine = (kBoxes - warp + kRowWarps - 1) / kRowWarps;  // row boxes of this warp
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(pipe.producer_get_barrier(state),
                                                                   uint32_t(mine * kCols * kBoxBytes));
    CUTE_UNROLL
    for (int j = 0; j < kWarpBoxes; ++j) {
      const int i = warp + j * kRowWarps;
      if (i >= kBoxes) break;
      const int slot_box = ((key0 + i * kPageBoxRows) % p.page_size) / kPageBoxRows;
      Tensor m = tma_page.get_tma_tensor(shape)(_, _, kv_head, page[j]);  // (page_size, head_dim)
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        // Column boxes past the real head dim (a padded kernel) lie outside the tensor: zeros, full bytes.
        Tensor g = local_tile(m, Shape<Int<kPageBoxRows>, Int<kAtomCols>>{}, make_coord(slot_box, c));
        // The box's rows of this atom column: a contiguous run of the stage (atoms stack along the rows first),
        // starting on an atom, so the swizzle pattern is the box layout's own.
        Tensor s = make_tensor(make_smem_ptr(&sX(i * kPageBoxRows, c * kAtomCols, state.index())),
                               typename Traits::SmemLayoutPageBox{});
        auto parts = tma_partition(tma_page, _0{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
        copy(tma_page.with(*pipe.producer_get_barrier(state)), get<0>(parts), get<1>(parts));
      }
    }
  }

  // Key block n of a paged tile, gathered row by row with 16-byte cp.async by the four producer warps: warp w takes
  // the 32-row chunks c of the block with c % 4 == w: 1.8-2.5 TB/s at decode, where one warp alone read 0.9 and the
  // 16-row TMA boxes 1.3-1.6 (bench/results/2026-12-02_h200_session18). Lane l of a warp looks up the page of row
  // 32 c + l of each of its chunks and leaves the row's global address in shared memory (ss.row_addr: the producer's
  // 24 registers do not hold them) before the stage is acquired, so that the table's latency runs under that wait; a
  // warp reads only the addresses it wrote. Rows at or past the sequence's keys hold the last key's row with bit 0
  // set (rows are 16-byte aligned): they are zero filled (src-size 0, from an address inside the tensor), as are
  // columns past the tensor's real head dim, so no stage holds stale rows and the consumers need no V tail zeroing.
  // Each lane arrives on the stage's barrier when its copies have landed (cp.async.mbarrier.arrive.noinc: the kernel
  // counts kRowThreads producer arrivals per stage in this mode), as CUTLASS's sm90 cp.async warp-specialized GEMM
  // signals its stages.
  template <bool kV, class Smem>
  __device__ void load_rows(Smem& sX, const Tile& tile, int kv_head, int n, Pipeline& pipe, PipelineState& state) {
    constexpr int kWarp = kProducerWarpThreads;
    constexpr int kChunkElems = int(sizeof(cute::uint128_t) / sizeof(Element));
    constexpr int kChunks = kHeadDim / kChunkElems;  // 16-byte chunks per row
    constexpr int kLanesPerRow = (kChunks & -kChunks) < kWarp ? (kChunks & -kChunks) : kWarp;
    constexpr int kRowsPerCopy = kWarp / kLanesPerRow;         // rows one warp-wide copy covers
    constexpr int kChunksPerLane = kChunks / kLanesPerRow;     // of each of those rows
    constexpr int kRowChunks = (kBlockN + kWarp - 1) / kWarp;  // 32-row chunks of the block
    static_assert(kHeadDim % kChunkElems == 0 && kChunks % kLanesPerRow == 0 && kBlockN % kRowsPerCopy == 0);
    const FwdParams& p = kp.p;
    const int lane = lane_here();
    const int32_t* table = p.block_table + int64_t(tile.t.batch) * p.block_table_stride;
    const int key0 = n * kBlockN, last = tile.seq.len_k - 1;  // a loaded block holds keys: key0 <= last
    const char* base = static_cast<const char*>(kV ? p.v : p.k) +
                       int64_t(kv_head) * (kV ? p.v_head : p.k_head) * int64_t(sizeof(Element));
    for (int c = warp; c < kRowChunks; c += kRowWarps) {
      const int row = c * kWarp + lane;
      int page, slot;
      kp.page_size_div(page, slot, min(key0 + row, last));  // past the keys: the last key (no branch)
      const uint64_t addr = uint64_t(
          base + (int64_t(table[page]) * (kV ? p.v_batch : p.k_batch) + int64_t(slot) * (kV ? p.v_row : p.k_row)) *
                     int64_t(sizeof(Element)));
      if (kBlockN % kWarp == 0 || row < kBlockN) ss.row_addr[row] = addr | uint64_t(key0 + row > last);
    }
    __syncwarp();                  // every row's address is in place
    pipe.producer_acquire(state);  // no leader in this mode: nothing is announced here
    const int stage = state.index();
    const int cols = kV ? p.head_dim_v : p.head_dim;
    const int col0 = (lane % kLanesPerRow) * kChunkElems;
    for (int c = warp; c < kRowChunks; c += kRowWarps) {
#pragma unroll 4
      for (int i = 0; i < kWarp / kRowsPerCopy; ++i) {
        const int row = c * kWarp + i * kRowsPerCopy + lane / kLanesPerRow;
        if (row >= kBlockN) break;  // the same for the whole warp: kBlockN is a multiple of kRowsPerCopy
        const uint64_t addr = ss.row_addr[row];
        const Element* src = reinterpret_cast<const Element*>(addr & ~uint64_t(1));
        CUTE_UNROLL
        for (int k = 0; k < kChunksPerLane; ++k) {
          const int col = col0 + k * kLanesPerRow * kChunkElems;
          const bool valid = (addr & 1) == 0 && col < cols;
          SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
              *reinterpret_cast<const cute::uint128_t*>(src + (valid ? col : 0)),
              *reinterpret_cast<cute::uint128_t*>(raw_pointer_cast(&sX(row, col, stage))), valid);
        }
      }
    }
    __syncwarp();  // the addresses are read before the next block's lanes overwrite them
    cutlass::arch::cpasync_barrier_arrive_noinc(pipe.producer_get_barrier(state));
  }

  // After the last tile: tells the consumers (and followers) there is no further tile, through the next Q buffer
  // once they have released it.
  __device__ void finish(const TileScheduler& sched) {
    if (kp.p.paged_rows) cp_async_wait<0>();  // no copy outlives its issuing lane
    wait_q_space();
    wait_followers();
    if (leader) {
      publish_tile(ss.tile_idx[ring.stage()], sched.count());
      ss.barrier_q[ring.stage()].arrive();
    }
  }

  // Consumers of a packed tile: warpgroup `wg` gathers its 64 packed rows of Q into its Q tile with 16-byte loads
  // (rows past the sequence and columns past head_dim are zero), then makes them visible to wgmma (async proxy).
  template <class SmemQ>
  __device__ static void gather_q_packed(const FwdParams& p, const Tile& tile, SmemQ& sQw, int wg, int tid) {
    static_assert(kPackGQA);
    const int m0_wg = tile.m0 + wg * kWgRows;
    const int head0 = tile.head0(p);
    const bool varlen = p.cu_seqlens_q != nullptr;
    cutlass::arch::NamedBarrier::sync(kWgThreads, Barrier::kEpilogueBase + wg);  // the previous tile's reads of
                                                                                 // this space are done
    typename Traits::GmemStoreO gather;  // the same 128-thread, 16-byte-vector partition as the O stores
    auto gthr = gather.get_thread_slice(tid);
    Tensor tQs = gthr.partition_D(sQw);
    Tensor tQc = gthr.partition_D(make_identity_tensor(Shape<Int<kWgRows>, Int<kHeadDim>>{}));
    const Element* q_base = static_cast<const Element*>(p.q) +
                            (varlen ? int64_t(tile.seq.q_start) * p.q_row : int64_t(tile.t.batch) * p.q_batch);
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tQs); ++m) {
      const PackedRow r(m0_wg + get<0>(tQc(0, m, 0)), tile.rows_per_pos, head0);
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tQs); ++k) {
        const int col = get<1>(tQc(0, m, k));
        cute::uint128_t v{};
        if (r.pos < tile.seq.len_q && col < p.head_dim)
          v = *reinterpret_cast<const cute::uint128_t*>(q_base + int64_t(r.pos) * p.q_row + int64_t(r.head) * p.q_head +
                                                        col);
        *reinterpret_cast<cute::uint128_t*>(raw_pointer_cast(&tQs(0, m, k))) = v;
      }
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(kWgThreads, Barrier::kEpilogueBase + wg);
  }
};

}  // namespace flashattn::cuda::sm90
