// Types every part of the sm90 forward shares: the traits of one compiled kernel (tiles, shared-memory layouts,
// MMAs, TMA types), the kernel's parameters, the named barriers between the roles, and small wgmma helpers.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/fast_math.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/common/fwd_policies.cuh"
#include "cuda/sm90/gemm.cuh"
#include "cuda/sm90/mechanisms.hpp"
#include "cuda/sm90/tile_scheduler.cuh"
#include "cuda/sm90/tiles.hpp"

namespace flashattn::cuda::sm90 {

using namespace cute;

// ------------------------------------------------------------------------------------------- operands
// What the element type changes in the P.V product, as a policy of the traits (Operands16 or Fp8Operands): the
// output element, the MMA, the shared-memory view of V it reads, how the fp32 probabilities become its register A
// operand, and the dequantisation factors the softmax and the epilogue apply.
//
// 16-bit inputs: V is read as the MN-major B operand straight from its (keys, d) tile, and the m64nNk16 accumulator
// of S is already the A operand of P.V (acc_as_a_operand); no factors.
template <class Element, int kWgRows, int kHeadDim, int kBlockN, int kStages, class SmemLayoutV>
struct Operands16 {
  using Out = Element;
  static constexpr bool kVTransposed = false;  // V's stage holds V as loaded (keys, d)
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>()));
  // V as the (d, keys) B operand of P.V: the same bytes, keys the contiguous (MN-major) mode.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // Registers of P in the C layout of S, viewed as the A operand (m64nNk16: the accumulator of columns [16j, 16j +
  // 16) is the A fragment of k-slice j); the view only regroups the modes, so each value keeps its register.
  template <class AccS>
  __device__ static auto make_probs(const AccS& acc) {
    return make_tensor<Element>(acc_as_a_operand(acc.layout()));
  }
  template <class AccS, class P>
  __device__ static void to_probs(const AccS& s, P& probs) {
    Tensor converted = convert_fragment<Element>(s);
    Tensor flat = make_tensor(probs.data(), s.layout());
    CUTE_UNROLL
    for (int i = 0; i < size(flat); ++i) flat(i) = converted(i);
  }
  struct Factors {
    static constexpr float qk = 1.f;
  };
  template <class Params>
  __device__ static Factors factors(const Params&, int, int) {
    return {};
  }
  template <class AccO>
  __device__ static void scale_output(AccO&, const Factors&) {}
};

// FP8 (e4m3) inputs. wgmma reads 8-bit operands K-major only, so V arrives transposed (d, keys), keys contiguous
// (sm90/fp8_v_transpose.cu writes that copy ahead of the kernel). The m64nNk32 A fragment holds, in thread t's
// register r = rh + 2 * kh of k-slice s, the four 8-bit values of row r0 + 8 * rh at k-columns 4 * (t % 4) + [0, 4)
// + 16 * kh; the fp32 accumulator of S holds at row r0 + 8 * rh the column pairs 8 * j + 2 * (t % 4) + [0, 2) of each
// 8-column group j. Packing, per register, the pairs of groups 4s + 2kh and 4s + 2kh + 1 (no shuffle: every thread
// keeps its own values) therefore puts key 16g + sigma(a) at k-column 16g + a, sigma(a) = 2 (a / 4) + a % 2 +
// 8 (a % 4 / 2), the same permutation for every row and thread. P.V sums over keys, so the product is P.V as long
// as V's keys are permuted the same way: the transposed copy stores key 16g + i at column 16g + fp8_key_column(i).
// The probabilities e^(s - m) lie in [0, 1], where e4m3 keeps 3 mantissa bits down to 2^-6 (FlashAttention-3
// rounds them the same way). The factors: q_descale * k_descale scales the logits, v_descale the output.
template <class Element, int kWgRows, int kHeadDim, int kBlockN, int kStages>
struct Fp8Operands {
  using Out = cutlass::bfloat16_t;
  static constexpr bool kVTransposed = true;  // V's stage holds V^T (d, keys), keys in fp8_key_column order
  static_assert(kBlockN % 32 == 0 && kHeadDim % 32 == 0, "the FP8 wgmma takes 32 k-elements per step");
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::K>()));
  using SmemLayoutVt = decltype(tile_to_shape(smem_atom_k_major<Element, kBlockN>(),
                                              Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}));

  // The A operand of P.V: ((4, 2, 2), 1, N/32) 8-bit values, compact, i.e. registers in the wgmma's order.
  template <class AccS>
  __device__ static auto make_probs(const AccS&) {
    return make_tensor<Element>(Shape<Shape<_4, _2, _2>, _1, Int<kBlockN / 32>>{});
  }
  template <class AccS, class P>
  __device__ static void to_probs(const AccS& s, P& probs) {
    static_assert(decltype(size(s))::value == kBlockN / 2, "64 x kBlockN fp32 over 128 threads");
    uint32_t* regs = reinterpret_cast<uint32_t*>(raw_pointer_cast(probs.data()));
    cutlass::NumericArrayConverter<Element, float, 4, cutlass::FloatRoundStyle::round_to_nearest> convert;
    CUTE_UNROLL
    for (int k = 0; k < kBlockN / 32; ++k) {
      CUTE_UNROLL
      for (int kh = 0; kh < 2; ++kh) {
        CUTE_UNROLL
        for (int rh = 0; rh < 2; ++rh) {
          // Linear index of the accumulator value (column c, row half rh, 8-column group j): c + 2 * rh + 4 * j.
          const int j = 4 * k + 2 * kh;
          cutlass::Array<float, 4> f;
          f[0] = s(2 * rh + 4 * j);
          f[1] = s(1 + 2 * rh + 4 * j);
          f[2] = s(2 * rh + 4 * (j + 1));
          f[3] = s(1 + 2 * rh + 4 * (j + 1));
          const cutlass::Array<Element, 4> packed = convert(f);
          regs[rh + 2 * kh + 4 * k] = reinterpret_cast<const uint32_t&>(packed);
        }
      }
    }
  }
  struct Factors {
    float qk, v;
  };
  template <class Params>
  __device__ static Factors factors(const Params& p, int batch, int head_q) {
    const int head_kv = head_q / p.group;
    // The softmax's running maximum is taken over the unscaled scores, which is right for factors >= 0 only: a
    // negative one (against flashattn.h's rule; CUDA calls are not read on the host) makes the head's rows NaN.
    const float qk = p.q_descale.at(batch, head_q) * p.k_descale.at(batch, head_kv);
    return {qk < 0.f ? __int_as_float(0x7fc00000) : qk, p.v_descale.at(batch, head_kv)};
  }
  // O times v_descale (after the normalisation: the factor is V's, and the LSE does not see it).
  template <class AccO>
  __device__ static void scale_output(AccO& o, const Factors& f) {
    CUTE_UNROLL
    for (int i = 0; i < size(o); ++i) o(i) *= f.v;
  }
};

// The column of its 16-key group at which V^T holds key 16g + i (the inverse of sigma above): the order the FP8
// transpose writes and the P operand's registers read.
__host__ __device__ constexpr int fp8_key_column(int i) { return 4 * ((i % 8) / 2) + 2 * (i / 8) + i % 2; }

// ------------------------------------------------------------------------------------------- traits
template <class Element_, int kHeadDim_, FwdEntry kEntry_, class Mech_ = Mechanisms<>>
struct FwdTraits {
  using Element = Element_;
  using Mech = Mech_;
  static constexpr bool kFp8 = sizeof(Element) == 1;
  static constexpr FwdEntry kEntry = kEntry_;  // the tile table's entry (the mask is run time)
  static constexpr FwdTiles kTiles = fwd_tiles(kHeadDim_, kEntry_, kFp8);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWgRows = kWarpgroupRows;
  static constexpr int kConsumerWGs = kTiles.consumer_warpgroups;
  static constexpr int kBlockM = kTiles.block_q();
  static constexpr int kBlockN = Mech::kBlockN > 0 ? Mech::kBlockN : kTiles.block_k;
  static constexpr int kStages = Mech::kStages > 0 ? Mech::kStages : kTiles.stages;
  static constexpr int kWgThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kConsumerThreads = kConsumerWGs * kWgThreads;
  static constexpr int kThreads = kConsumerThreads + kWgThreads;  // + the producer warpgroup
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "wgmma K steps are 16 elements");

  // Register split (setmaxnreg): the producer keeps the minimum; the consumers' share (kConsumerRegs) follows
  // SharedStorage, which decides how many CTAs an SM holds.
  static constexpr int kProducerRegs = 24;

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  // Q and O: (64 rows, d, warpgroup): each warpgroup's rows are one contiguous region, so a warpgroup may
  // overwrite its own Q rows with its O while the others still read theirs.
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kWgRows>, Int<kHeadDim>, Int<kConsumerWGs>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  using Operands = std::conditional_t<kFp8, Fp8Operands<Element, kWgRows, kHeadDim, kBlockN, kStages>,
                                      Operands16<Element, kWgRows, kHeadDim, kBlockN, kStages, SmemLayoutV>>;
  using OutElement = typename Operands::Out;
  static constexpr bool kVTransposed = Operands::kVTransposed;
  // MMAs of one consumer warpgroup: S (64 x kBlockN) = Q (64 x d) K^T, both from shared memory; O (64 x d) +=
  // P (64 x kBlockN, registers) V, V's stage read through SmemLayoutVt.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kWgRows>, Int<kBlockN>, Int<kHeadDim>>>()));
  using TiledMmaPV = typename Operands::TiledMmaPV;
  using SmemLayoutVt = typename Operands::SmemLayoutVt;
  // O's tile, of the output element (bfloat16 for FP8 inputs): (64 rows, d, warpgroup) as Q's.
  using SmemLayoutO = decltype(tile_to_shape(smem_atom_k_major<OutElement, kHeadDim>(),
                                             Shape<Int<kWgRows>, Int<kHeadDim>, Int<kConsumerWGs>>{}));

  static constexpr int kTileBytesQ = kWgRows * kHeadDim * int(sizeof(Element));  // one warpgroup's rows
  static constexpr int kTileBytesO = kWgRows * kHeadDim * int(sizeof(OutElement));
  static constexpr int kTileBytesKV = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kMaxSmemBytes = 227 * 1024;  // sm90 opt-in limit per CTA
  static constexpr int kMainSmemBytes = int(sizeof(Element)) * int(cosize_v<SmemLayoutQ> + 2 * cosize_v<SmemLayoutK>);
  static constexpr int kBarrierSlack = 1024;  // pipelines' mbarriers + alignment
  // O gets its own tile when it fits: the next tile's Q load then overlaps this tile's epilogue. Otherwise
  // (d256, and d128 with 176-key blocks) each warpgroup stages O in its own Q rows.
  static constexpr bool kSeparateO = kMainSmemBytes + kConsumerWGs * kTileBytesO + kBarrierSlack <= kMaxSmemBytes;
  static_assert(kSeparateO || sizeof(OutElement) == sizeof(Element), "O is staged in Q's space only at Q's size");
  static constexpr int kSmemO = kSeparateO ? int(cosize_v<SmemLayoutO>) : 1;
  // Q buffers (Mech::kDoubleQ): two where a second fits beside a separate O tile, in entries of one CTA per SM. The
  // producer then loads a tile's Q as soon as the tile two back has released its buffer, a whole tile ahead, so the
  // consumers start the next tile without waiting for its Q (one buffer: the load waits for this tile's last Q.K^T
  // and its HBM latency, about 1 us, sits between the tiles; docs/journal/studies/sm90_fwd_short_sequences.md).
  // H200 bf16 against one buffer (the SingleQ ablation) in one process: d128 +0.6-6 % at 512-4k, d64 without a
  // window +8 % at 512, +0.4-2 % at 1k-2k (bench/results/2026-12-03_h200_session27/README.md, run 3).
  // Entries of several CTAs per SM hide a tile boundary under the other CTAs' GEMMs instead, and their shared
  // memory is divided (decode's two CTAs would no longer fit). One buffer where O is staged in Q's space, and for
  // FP8 (not measured with two).
  static constexpr int kSmemQBytes = int(sizeof(Element)) * int(cosize_v<SmemLayoutQ>);
  static constexpr int kRowAddrBytes = int(sizeof(uint64_t)) * kBlockN;  // SharedStorage::row_addr
  static constexpr int kQStages =
      Mech::kDoubleQ && !kFp8 && kSeparateO && kTiles.ctas_per_sm == 1 &&
              kMainSmemBytes + kSmemQBytes + kConsumerWGs * kTileBytesO + kBarrierSlack + kRowAddrBytes <= kMaxSmemBytes
          ? 2
          : 1;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ> * kQStages, 1024> q;  // kQStages buffers of SmemLayoutQ
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<OutElement, kSmemO, 1024> o;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    cutlass::arch::ClusterTransactionBarrier barrier_q[kQStages];  // per Q buffer: its tile is published and loaded
    cutlass::arch::ClusterBarrier empty_q[kQStages];  // two Q buffers: every consumer thread is done with one
    cutlass::arch::ClusterBarrier follow_ack;         // paged follower warps: each has read the last publication
    cutlass::arch::ClusterBarrier claim_full;         // the claim warp has published its next claim (TileClaims)
    cutlass::arch::ClusterBarrier claim_empty;        // the load warp asks for the next claim (request_claim)
    int claimed;                                      // that claim: the tile after the one warp 0 loads
    int tile_idx[kQStages];      // the tile whose Q load barrier_q announces (count(): no more tiles)
    uint64_t row_addr[kBlockN];  // paged rows gathered by the producer warp: each row's address (FwdLoad::load_rows)
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= kMaxSmemBytes, "tile table entry does not fit shared memory");
  // CTAs resident on an SM: the tile table's, fewer where an ablation's block or stages (Mech) make them not fit the
  // SM's 228 KiB (each CTA with 1 KiB the driver reserves). Each has its share of the register file.
  static constexpr int kCtasPerSmFit = 228 * 1024 / (kSmemBytes + 1024);
  static constexpr int kCtasPerSm = kTiles.ctas_per_sm < kCtasPerSmFit ? kTiles.ctas_per_sm : kCtasPerSmFit;
  static_assert(kCtasPerSm >= 1);
  // The consumers' registers: what the pool of kCtasPerSm CTAs holds beyond the producer's (tiles.hpp).
  static constexpr int kConsumerRegs = consumer_regs(kCtasPerSm, kConsumerWGs, kProducerRegs);
  static_assert(kThreads == (kConsumerWGs + 1) * kWgThreads);

  // Global tensors as TMA sees them: (rows, d, heads, batch); varlen: (total rows, d, heads, 1).
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemIn = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{}, GmemStride{}));
  using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<OutElement*>(nullptr)), GmemShape{}, GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, take<0, 2>(SmemLayoutK{}),
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // V's load: (keys, d) boxes, or with V transposed (d, keys) boxes of the (d, keys, heads, batch) copy.
  using TmaVt = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, take<0, 2>(SmemLayoutVt{}),
                                       Shape<Int<kHeadDim>, Int<kBlockN>>{}, _1{}));
  using TmaV = std::conditional_t<kVTransposed, TmaVt, TmaKV>;
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemOut{}, take<0, 2>(SmemLayoutO{}),
                                      Shape<Int<kWgRows>, Int<kHeadDim>>{}, _1{}));

  // Paged K/V in boxes of kPageBoxRows rows (PagedLoad::kTmaRows): one box per swizzle-atom column, so that it
  // lands on the contiguous run the stage's layout gives those rows there (atoms stack along the rows first).
  static constexpr int kAtomCols = decltype(size<1>(SmemAtom{}))::value;
  static_assert(kBlockN % kPageBoxRows == 0 && kHeadDim % kAtomCols == 0);
  using SmemLayoutPageBox = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kPageBoxRows>, Int<kAtomCols>>{}));
  using TmaPage = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemLayoutPageBox{},
                                         Shape<Int<kPageBoxRows>, Int<kAtomCols>>{}, _1{}));

  // Epilogue for varlen (and the packed Q gather, 16-bit only): 128-bit vectors between shared and global memory,
  // 128 threads of one warpgroup, in O's element.
  static constexpr int kVecElems = int(sizeof(cute::uint128_t) / sizeof(OutElement));
  // Threads per row: the largest power of two dividing the row's vectors, so that the thread grid covers all
  // 128 threads and tiles the (64, d) tile exactly (d96: 12 vectors per row, 4 threads, 3 vectors each; one
  // thread per vector would leave 8 threads outside the grid, addressing past the tile).
  static constexpr int kVecsPerRow = kHeadDim / kVecElems;
  static constexpr int kThreadsPerRow = kVecsPerRow & -kVecsPerRow;
  static_assert(kWgThreads % kThreadsPerRow == 0 && kWgRows % (kWgThreads / kThreadsPerRow) == 0);
  using GmemStoreO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, OutElement>{},
      Layout<Shape<Int<kWgThreads / kThreadsPerRow>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>{},
      Layout<Shape<_1, Int<kVecElems>>>{}));
};

template <class Traits>
struct KernelParams {
  FwdParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::TmaO tma_o;
  typename Traits::TmaPage tma_k_page, tma_v_page;  // paged K/V in row boxes (built for those calls only)
  typename Traits::GmemShape shape_q, shape_k, shape_v, shape_o;
  cutlass::FastDivmod page_size_div;  // paged rows (FwdLoad::load_rows): key -> (page, slot)
  // Which tile each CTA takes, built by the launch (its divisors on the host); its counter: dynamic scheduling
  // (zeroed before the launch), null: static.
  TileScheduler sched;
};

// ------------------------------------------------------------------------------------------- helpers
// Named barriers (ids above CUTLASS's reserved ones).
enum Barrier : int {
  kQFree = 0,          // consumers -> producer: the previous tile's Q (and, aliased, O) space may be reloaded (one
                       // Q buffer; with two, SharedStorage::empty_q)
  kSchedulerBase = 1,  // one per consumer warpgroup: its turn to issue GEMMs (ping-pong)
  kEpilogueBase = 4,   // one per consumer warpgroup: its O tile is complete in shared memory
  kVTail = 7,          // all consumers: the zeroed V rows past the keys of the partial block are in place
  kBarrierCount
};
// CUTLASS offsets these ids by the barriers it reserves; the hardware has 16.
static_assert(kBarrierCount + int(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier) <= 16, "named barrier ids");

// A named barrier (an id of the enum above) over `threads` threads that also returns whether any of them passed
// `pred` (bar.red.or): a warpgroup's decision broadcast without shared memory.
__device__ __forceinline__ bool named_barrier_or(int threads, int id, bool pred) {
  const uint32_t hw_id = uint32_t(id) + uint32_t(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier);
  uint32_t any;
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred p, %2, %3, p;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(any)
               : "r"(uint32_t(pred)), "r"(hw_id), "r"(uint32_t(threads))
               : "memory");
  return any != 0;
}

// The tile index travels from the producer to the consumers through shared memory, ordered by barrier_q (the
// producer writes before its arrive, the consumers read after their wait). CUTLASS's mbarrier asm carries no
// memory clobber, so compiler barriers keep the store and the load on their side of it.
__device__ __forceinline__ void publish_tile(int& slot, int idx) {
  *reinterpret_cast<volatile int*>(&slot) = idx;
  asm volatile("" ::: "memory");
}
// The Q buffers in the order the producer fills them, as each role walks them: tile k of the CTA (counting the
// published ones, the past-the-end index included) goes to buffer k % stages, whose barrier_q completes its phase
// (k / stages) % 2 for it. `stages` is a run-time value (FwdLoad::q_stages): 1 or the kernel's kQStages, 2.
struct QRing {
  int count = 0;
  int stages;
  __device__ int stage() const { return count & (stages - 1); }
  __device__ int phase() const { return (count >> (stages - 1)) & 1; }
  // empty_q[stage()]'s phase that frees the buffer for the next tile: the one the tile `stages` back completed.
  __device__ int free_phase() const { return phase() ^ 1; }
};

// The next tile published, as the consumers and the paged-load followers take it: its buffer's barrier_q, then the
// index (the scheduler's count after the last tile). Returns the buffer through `stage`.
template <class SharedStorage>
__device__ __forceinline__ int next_published_tile(SharedStorage& ss, QRing& ring, int& stage) {
  stage = ring.stage();
  ss.barrier_q[stage].wait(ring.phase());
  ++ring.count;
  asm volatile("" ::: "memory");
  return *reinterpret_cast<const volatile int*>(&ss.tile_idx[stage]);
}

}  // namespace flashattn::cuda::sm90
