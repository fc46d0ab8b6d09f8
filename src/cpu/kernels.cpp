// The CPU FlashAttention forward and backward. Built once per instruction set (FA_CPU_ISA names the
// namespace, FA_CPU_VEC_BYTES the vector width); backend.cpp picks the build that the processor runs.
//
// Forward: one task per (sequence, query head, 64-row query block), query-head-major so that a thread's tasks
// mostly share a KV head, whose fp32 K/V tiles are converted once for all of them (cpu/shared_tiles.hpp). K/V are
// streamed in 64-key tiles; the online softmax keeps the running max m, sum l and the unnormalised output O of
// the block in fp32, so the only memory beyond the inputs and outputs is a few tiles per thread (and that cache).
// Backward: D = rowsum(dO * O) first; then one task per (sequence, query head, chunk of key blocks) that
// recomputes P from the saved LSE tile by tile (the common rows in vectors), accumulates dK/dV of its key block in
// registers-sized tiles and its share of dQ in an fp32 buffer (full blocks straight from the GEMM); its heads' Q
// and dO tiles are converted once per task when they fit a per-thread cache. A last pass sums dQ over chunks and
// dK/dV over each GQA group. bf16 problems on AVX512-BF16 (the avx512bf16 build) run the GEMMs of both directions
// in bf16 dot products, P and dS rounded to bf16 as the GPU kernels round them.
// Measured: bench/results/2026-12-01_cpu_bwd_epyc2.md.
// Every sum is taken in a fixed order, so the backward is deterministic.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/problem.hpp"
#include "cpu/numeric.hpp"
#include "cpu/scratch.hpp"
#include "cpu/shared_tiles.hpp"
#include "cpu/tile_gemm.hpp"
#include "cpu/tiles.hpp"

namespace flashattn::cpu::FA_CPU_ISA {

using detail::Error;
using detail::Problem;
using detail::RowLayout;

namespace {

// max(x, m) lane by lane where a NaN in x wins and a NaN in m stays: the softmax's running maximum.
inline vfloat nan_max(vfloat x, vfloat m) { return (x > m || x != x) ? x : m; }

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

constexpr int kMaxHeadDimPad = 256;  // head dims are at most 256 (a multiple of the vector width)

struct Dims {
  int d, dv, dp, dvp;  // head dims and their padding to the vector width
  int bq, bk;
};

Dims dims_of(const Problem& p, bool bf16_dot = false) {
  CpuTiles t = cpu_tiles(p, bf16_dot);
  return {int(p.head_dim),
          int(p.head_dim_v),
          round_up(int(p.head_dim), kVecFloats),
          round_up(int(p.head_dim_v), kVecFloats),
          t.block_q,
          t.block_k};
}

// Copies `rows` rows (of `valid` present ones) x `dim` columns into a zero-padded [rows][ld] fp32 tile.
template <fa_dtype T>
void load_tile(const Problem& p, const void* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int rows,
               int valid, int dim, int ld, float* dst) {
  using S = Storage<T>;
  const auto* src = static_cast<const typename S::type*>(base);
  for (int r = 0; r < rows; ++r) {
    float* d = dst + int64_t(r) * ld;
    if (r < valid) {
      const auto* s = src + p.offset(l, b, r0 + r, h);
      for (int c = 0; c < dim; ++c) d[c] = S::load(s[c]);
      for (int c = dim; c < ld; ++c) d[c] = 0.f;
    } else {
      std::fill(d, d + ld, 0.f);
    }
  }
}

// Eight float lanes (any build: GCC lowers the shuffles below to the instruction set's own).
typedef float v8f __attribute__((vector_size(32)));

// Rows r[0..7] become columns in place: r[k][i] = old r[i][k] (unpack pairs, then pairs of pairs, then halves).
inline void transpose8(v8f (&r)[8]) {
  v8f t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      u[i + 2 * j] = __builtin_shufflevector(t[i + j], t[i + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 2 * j + 1] = __builtin_shufflevector(t[i + j], t[i + j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int k = 0; k < 4; ++k) {
    r[k] = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4] = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// Same, transposed: dst[c][r], ld = the padded row count. In 8 x 8 blocks transposed in registers, each stored as
// eight 32-byte pieces of the destination's rows: element by element (a strided store each) it took 5 % of an fp32
// 1k fwd+bwd (perf, 2 threads, bench/results/2026-12-06_session41/README.md). Head dims are multiples of 8
// (validate.cpp) and so are the tiles' row counts; anything else takes the element-wise loop.
template <fa_dtype T>
void load_tile_t(const Problem& p, const void* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int rows,
                 int valid, int dim, int dim_pad, int ld, float* dst) {
  using S = Storage<T>;
  const auto* src = static_cast<const typename S::type*>(base);
  if (rows % 8 == 0 && dim % 8 == 0) {
    for (int rb = 0; rb < rows; rb += 8) {
      const typename S::type* row[8];
      for (int i = 0; i < 8; ++i) row[i] = rb + i < valid ? src + p.offset(l, b, r0 + rb + i, h) : nullptr;
      for (int c0 = 0; c0 < dim; c0 += 8) {
        v8f m[8];
        for (int i = 0; i < 8; ++i) {
          if (row[i] == nullptr) {
            m[i] = v8f{};
          } else if constexpr (T == FA_FLOAT32) {
            std::memcpy(&m[i], row[i] + c0, sizeof(v8f));
          } else {
            for (int k = 0; k < 8; ++k) m[i][k] = S::load(row[i][c0 + k]);
          }
        }
        transpose8(m);
        for (int k = 0; k < 8; ++k) std::memcpy(dst + int64_t(c0 + k) * ld + rb, &m[k], sizeof(v8f));
      }
    }
  } else {
    for (int r = 0; r < rows; ++r) {
      if (r < valid) {
        const auto* s = src + p.offset(l, b, r0 + r, h);
        for (int c = 0; c < dim; ++c) dst[int64_t(c) * ld + r] = S::load(s[c]);
      } else {
        for (int c = 0; c < dim; ++c) dst[int64_t(c) * ld + r] = 0.f;
      }
    }
  }
  for (int c = dim; c < dim_pad; ++c) std::fill(dst + int64_t(c) * ld, dst + int64_t(c) * ld + rows, 0.f);
}

#if defined(FA_CPU_BF16_DOT)
constexpr bool kHaveBf16Dot = true;
#else
constexpr bool kHaveBf16Dot = false;
#endif

// 32-bit words of a bf16 dot-product operand (tile_gemm.hpp's packed pairs), counted in the scratch accounting.
class PairBuffer {
 public:
  static_assert(sizeof(uint32_t) == sizeof(float));
  explicit PairBuffer(std::size_t n) : f_(n), n_(n) {}
  uint32_t* data() const { return reinterpret_cast<uint32_t*>(f_.data()); }
  std::size_t size() const { return n_; }

 private:
  FloatBuffer f_;
  std::size_t n_;
};

#if defined(FA_CPU_BF16_DOT)
// Rows r0 .. r0 + valid of (b, h) of a bf16 tensor packed in pairs along their first `dim` columns, as the B
// operand of gemm_bf16 over `n` columns (rows past `valid` zero): Bp[(k/2) * n + r] = (x[r][k], x[r][k+1]).
template <fa_dtype T>
void pack_rows(const Problem& p, const void* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int valid,
               int n, int dim, uint32_t* Bp) {
  static_assert(T == FA_BFLOAT16);
  constexpr int kMaxRows = 256;  // a tile's rows (cpu_tiles: at most 256)
  const uint16_t* rows[kMaxRows];
  const auto* src = static_cast<const uint16_t*>(base);
  valid = std::min(valid, kMaxRows);
  for (int r = 0; r < valid; ++r) rows[r] = src + p.offset(l, b, r0 + r, h);
  pack_pairs_t(rows, valid, n, dim, Bp);
}

// Rows r0 .. r0 + valid of (b, h) interleaved in pairs of consecutive rows, as the B operand of gemm_bf16 whose
// reduction runs over those rows: Bp[(r/2) * ld + c] = (x[r][c], x[r+1][c]) for c < dim, 0 past dim (up to ld) and
// for rows past `valid` (up to `rows`, even).
template <fa_dtype T>
void pack_row_pairs(const Problem& p, const void* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int valid,
                    int rows, int dim, int ld, uint32_t* Bp) {
  static_assert(T == FA_BFLOAT16);
  const auto* src = static_cast<const uint16_t*>(base);
  for (int r = 0; r < rows; r += 2) {
    const uint16_t* x0 = r < valid ? src + p.offset(l, b, r0 + r, h) : nullptr;
    const uint16_t* x1 = r + 1 < valid ? src + p.offset(l, b, r0 + r + 1, h) : nullptr;
    uint32_t* dst = Bp + int64_t(r / 2) * ld;
    for (int c = 0; c < dim; ++c) {
      const uint32_t lo = x0 ? x0[c] : 0u, hi = x1 ? x1[c] : 0u;
      dst[c] = lo | (hi << 16);
    }
    for (int c = dim; c < ld; ++c) dst[c] = 0;
  }
}

// Two vectors of 16 fp32 values (keys k and k + 1 of 16 queries) as 16 bf16 pair words (key_pairs_of's layout).
template <class V>
inline void store_bf16_pairs(uint32_t* dst, V lo, V hi) {
  const __m256bh a = _mm512_cvtneps_pbh(reinterpret_cast<const __m512&>(lo));
  const __m256bh c = _mm512_cvtneps_pbh(reinterpret_cast<const __m512&>(hi));
  const __m512i l = _mm512_maskz_cvtepu16_epi32(0xffff, reinterpret_cast<const __m256i&>(a));
  const __m512i h =
      _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, reinterpret_cast<const __m256i&>(c)), 16);
  _mm512_storeu_si512(dst, _mm512_or_si512(l, h));
}

// The probabilities of a tile St[key][query] (row stride ld, a multiple of 16; keys even) as gemm_bf16's B operand
// over the keys, rounded to bf16: Bp[(k/2) * ld + q] = (St[k][q], St[k+1][q]). Pairs of St's rows as they are, 16
// queries per vector: the forward computes O^T += V^T P^T so that P needs no transpose.
inline void key_pairs_of(const float* st, int ld, int keys, uint32_t* Bp) {
  for (int k = 0; k < keys; k += 2)
    for (int q = 0; q < ld; q += 16)
      store_bf16_pairs(Bp + int64_t(k / 2) * ld + q, _mm512_loadu_ps(st + int64_t(k) * ld + q),
                       _mm512_loadu_ps(st + int64_t(k + 1) * ld + q));
}

// Rows r0 .. r0 + valid of (b, h) of a bf16 tensor transposed, out[c][r] for c < dim and r < rows (row stride rows),
// zero past valid and from dim to dim_pad: V^T, the A operand of O^T += V^T P^T.
template <fa_dtype T>
void pack_t(const Problem& p, const void* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int valid,
            int rows, int dim, int dim_pad, uint16_t* out) {
  static_assert(T == FA_BFLOAT16);
  const auto* src = static_cast<const uint16_t*>(base);
  std::fill(out, out + int64_t(dim_pad) * rows, uint16_t(0));
  int r = 0;
  // 16 rows at a time: a gather of the column pairs (c, c + 1) of 16 rows (tile_gemm.hpp's gather_offsets16), split
  // into output rows c and c + 1.
  for (; r + 16 <= valid; r += 16) {
    const uint16_t* row[16];
    for (int i = 0; i < 16; ++i) row[i] = src + p.offset(l, b, r0 + r + i, h);
    const uint16_t* x0 = row[0];
    __m512i rows16;
    if (!gather_offsets16(row, 16, &rows16)) break;
    for (int c = 0; c < dim; c += 2) {
      const __m512i w = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xffff, rows16, x0 + c, 2);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + int64_t(c) * rows + r),
                          _mm512_maskz_cvtepi32_epi16(0xffff, w));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + int64_t(c + 1) * rows + r),
                          _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_maskz_srli_epi32(0xffff, w, 16)));
    }
  }
  for (; r < valid; ++r) {
    const uint16_t* x = src + p.offset(l, b, r0 + r, h);
    for (int c = 0; c < dim; ++c) out[int64_t(c) * rows + r] = x[c];
  }
}

// n fp32 values rounded to bf16 (n a multiple of 16), 16 per vector.
inline void rows_to_bf16(const float* x, int n, uint16_t* out) {
  for (int i = 0; i < n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), reinterpret_cast<const __m256i&>(v));
  }
}

#endif

// Turns raw q.k products of one row into logits: scale, softcap, ALiBi, mask. With softcap, `capped` (when given)
// receives the tanh values the softcap derivative needs.
struct RowTransform {
  float scale, softcap, slope;
  int64_t diag;    // i + mask offset: the ALiBi distance origin
  int64_t lo, hi;  // visible keys of this row
  bool full;       // every key of the tile visible: the mask loop can be skipped
};

inline void logits_row(const RowTransform& t, int64_t j0, int n, float* s, float* capped = nullptr) {
  for (int c = 0; c < n; ++c) s[c] *= t.scale;
  if (t.softcap > 0.f) {
    const float inv = 1.f / t.softcap;
    for (int c = 0; c < n; ++c) {
      const float th = tanh_fast(s[c] * inv);
      if (capped != nullptr) capped[c] = th;
      s[c] = t.softcap * th;
    }
  }
  if (t.slope != 0.f) {
    for (int c = 0; c < n; ++c) {
      float dist = float(t.diag - (j0 + c));
      s[c] -= t.slope * (dist < 0.f ? -dist : dist);
    }
  }
  if (!t.full) {
    for (int c = 0; c < n; ++c) {
      int64_t j = j0 + c;
      s[c] = (j < t.lo || j >= t.hi) ? kNegInf : s[c];
    }
  }
}

RowTransform row_transform(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t lq, int64_t lk, int64_t j0,
                           int bk) {
  detail::KeyRange kr = detail::visible_keys(p, i, lq, lk);
  RowTransform t;
  t.scale = p.scale;
  t.softcap = p.softcap;
  t.slope = p.alibi_slope(b, h);
  t.diag = i + detail::mask_offset(p, lq, lk);
  t.lo = kr.lo;
  t.hi = kr.hi;
  t.full = kr.lo <= j0 && kr.hi >= j0 + bk;
  return t;
}

// More threads than the machine has never run faster, and thousands of them exhaust memory (or OpenMP):
// requests above the hardware thread count are clamped to it (flashattn.h says so).
int thread_count(int requested) {
  return requested > 0 ? std::min(requested, omp_get_num_procs()) : omp_get_max_threads();
}

// Logits of a key tile against a query tile held transposed, St[key][query] (queries along the vector
// lanes): scale, softcap, ALiBi and the mask, all branch-free per vector. The mask is core/mask_rule.hpp's rule in
// vector form (its fields are the rule's, from detail::mask_rule); the tiles' key ranges come from the rule itself.
struct TileMask {
  float scale, softcap, slope;
  bool mask;          // some (key, query) pair of the tile is outside the window
  float off;          // mask offset: query i's diagonal key is i + off
  float left, right;  // window sides, or a huge value when unbounded
  float len_k;        // keys at or past this are padding
};

inline void logits_tile_t(const TileMask& t, int64_t i0, int64_t j0, int bq, int bk, float* st) {
  vfloat iota;
  for (int l = 0; l < kVecFloats; ++l) iota[l] = float(l);
  const float inv_cap = t.softcap > 0.f ? 1.f / t.softcap : 0.f;
  for (int c = 0; c < bk; ++c) {
    const float j = float(j0 + c);
    for (int v = 0; v < bq; v += kVecFloats) {
      vfloat x = vload(st + int64_t(c) * bq + v) * t.scale;
      if (t.softcap > 0.f) x = t.softcap * tanh_fast(x * inv_cap);
      const vfloat diag = iota + float(i0 + v) + t.off;
      if (t.slope != 0.f) {
        vfloat dist = diag - j;
        x -= t.slope * (dist < 0.f ? -dist : dist);
      }
      if (t.mask) {
        // Visible: diag - left <= j <= diag + right, and j a real key.
        x = (j >= diag - t.left && j <= diag + t.right && j < t.len_k) ? x : vbroadcast(kNegInf);
      }
      vstore(st + int64_t(c) * bq + v, x);
    }
  }
}

template <fa_dtype T>
Error forward_impl(const Problem& p, int threads) {
  const Dims dm = dims_of(p, T == FA_BFLOAT16 && kHaveBf16Dot);
  const int64_t group = p.group();
  // Every query block of a (sequence, KV head) reads the same K/V tiles: their fp32 copies are made once and shared
  // by the threads working on that head (SharedTiles: kKvSlots heads at once, each at most kKvSlotBytes, 32k keys of
  // d64 or 16k of d128), and tasks run KV-head-major so that the threads mostly work on one or two heads. A 4 MiB
  // copy per thread instead left 16k keys of d128 outside it, and every task gathered its tiles again from rows one
  // (B, S, H, D) row apart: fp32 16k 2-6 % slower, fp16 16k 42 % (2 threads,
  // bench/results/2026-12-06_cpu_zen5_session39.md). A task takes up to kQueryGroup consecutive query
  // blocks, which share each K/V tile it converts or reads from the cache: the K/V traffic per FLOP
  // of a 512-row block, while each block keeps its own 64-row softmax state (and its bits: every block visits the
  // same tiles in the same order either way). Fewer blocks per task only where the tasks would not keep every
  // thread busy (four tasks per thread for the dynamic schedule). d128, 2 threads
  // (bench/results/2026-12-01_cpu_fwd_16k_epyc2.md): at 16k (fp32, K/V outside the cache) 1, 4, 8, 16 blocks per
  // task ran 16.1-17.5, 13.4-14.2, 12.0, 12.6 s; at 4k (cached) 8 instead of 1 ran bf16 6-9% faster, fp32 the
  // same.
  constexpr int64_t kKvSlotBytes = int64_t(32) << 20;
  constexpr int kKvSlots = 3;
  constexpr int kQueryGroup = 8;
  int64_t max_lk = 0;
  for (int64_t b = 0; b < p.batch; ++b) max_lk = std::max(max_lk, p.len_k(b));
  const int64_t kv_blocks_max = (max_lk + dm.bk - 1) / dm.bk;
  const int64_t kv_cache_floats = kv_blocks_max * dm.bk * (dm.dp + dm.dvp);
  // bf16 with dot products copies K's rows per tile and reads V through V^T: no fp32 copies, but V^T of every
  // tile of the (sequence, KV head), packed once per thread and head when it fits kVtCacheBytes (16k keys of d128).
  const bool bf16_dot = T == FA_BFLOAT16 && kHaveBf16Dot;
  constexpr int64_t kVtCacheBytes = int64_t(4) << 20;
  const int64_t vt_cache_elems = kv_blocks_max * dm.bk * dm.dvp;
  const bool cache_vt = bf16_dot && vt_cache_elems > 0 && vt_cache_elems * 2 <= kVtCacheBytes;
  const bool cache_kv = !bf16_dot && kv_cache_floats > 0 && kv_cache_floats * int64_t(sizeof(float)) <= kKvSlotBytes;
  const int nthreads = thread_count(threads);
  // A slot per thread at most (each thread holds one head at a time) and per (sequence, KV head).
  SharedTiles kv_shared;
  if (cache_kv &&
      !kv_shared.init(int(std::min<int64_t>({kKvSlots, nthreads, p.batch * p.heads_kv})), size_t(kv_cache_floats)))
    return detail::backend_error("cpu: out of memory allocating the forward's shared K/V tiles");
  int64_t all_blocks = 0;
  for (int64_t b = 0; b < p.batch; ++b) all_blocks += (p.len_q(b) + dm.bq - 1) / dm.bq;
  const int group_blocks = int(std::clamp<int64_t>(all_blocks * p.heads_q / (4 * int64_t(nthreads)), 1, kQueryGroup));
  // Tasks: (sequence, first query row of a group of query blocks) pairs, times heads.
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i0 = 0; i0 < p.len_q(b); i0 += dm.bq * group_blocks) blocks.push_back({b, i0});
  const int64_t ntasks = int64_t(blocks.size()) * p.heads_q;
  // Unbounded window sides as a distance no sequence reaches (exact in float for lengths < 2^24).
  constexpr float kUnbounded = 3.0e7f;
  bool alloc_failed = false;

#pragma omp parallel num_threads(nthreads)
  {
    // The query tile is held transposed (queries along vector lanes) so that the scores come out as
    // St[key][query]: the online softmax then runs down columns with plain vector ops and no horizontal
    // reductions, and K and V are read in their natural row layout. qt, o, m, l (and Q's bf16 pairs) per block
    // of the task's group.
    // fp32 Q^T and K/V tiles serve the fp32 products only: bf16 dot products read Q in pairs, K from its dense bf16
    // tile and V through V^T.
    const size_t gb = size_t(group_blocks), fp32_tiles = bf16_dot ? 0 : 1;
    FloatBuffer qt(fp32_tiles * gb * dm.dp * dm.bq), k(fp32_tiles * dm.bk * dm.dp), v(fp32_tiles * dm.bk * dm.dvp);
    FloatBuffer st(size_t(dm.bk) * dm.bq), o(gb * dm.bq * dm.dvp), m(gb * dm.bq), l(gb * dm.bq), alpha(dm.bq);
    PairBuffer vt_cache(cache_vt ? size_t(vt_cache_elems / 2) : 0), k_tile_buf(bf16_dot ? size_t(dm.bk) * dm.d / 2 : 0);
    int64_t cached_b = -1, cached_hk = -1;  // whose tiles kv (or vt_cache) holds
    const float* kv = nullptr;              // the shared K/V tiles this thread holds (cache_kv), or none
    const bool pairs = T == FA_BFLOAT16 && kHaveBf16Dot;
#if defined(FA_CPU_AMX)
    if (pairs) amx_configure();  // this thread's tiles for gemm_bf16 (tile_gemm.hpp)
#endif
    // bf16 dot products: Q in pairs, V^T (dvp x bk bf16) and P^T in key pairs (bk / 2 x bq words); O is held
    // transposed, O^T[c][q].
    PairBuffer q_pair_buf(pairs ? gb * (dm.dp / 2) * dm.bq : 0), v_t_buf(pairs ? size_t(dm.bk / 2) * dm.dvp : 0),
        p_pair_buf(pairs ? size_t(dm.bq) * dm.bk / 2 : 0);
    uint32_t *q_pairs = q_pair_buf.data(), *p_pairs = p_pair_buf.data();
    auto* v_t = reinterpret_cast<uint16_t*>(v_t_buf.data());
    (void)q_pairs, (void)v_t, (void)p_pairs;
    const bool ok = (bf16_dot || (qt.data() && k.data() && v.data())) && st.data() && o.data() && m.data() &&
                    l.data() && alpha.data() && (!pairs || (q_pairs && v_t && p_pairs)) &&
                    (!cache_vt || vt_cache.data()) && (!bf16_dot || k_tile_buf.data());
    if (!ok) {
#pragma omp atomic write
      alloc_failed = true;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      if (!ok) continue;
      // Query-head-major (a KV head's query heads are consecutive), longest blocks first within a head under causal
      // masks: later query blocks see more keys.
      const int64_t nblocks = int64_t(blocks.size());
      const auto [b, i_task] = blocks[size_t(nblocks - 1 - task % nblocks)];
      const int64_t h = task / nblocks, hk = h / group;
      const int64_t lq = p.len_q(b), lk = p.len_k(b);
      if (cache_kv && (cached_b != b || cached_hk != hk)) {
        if (kv != nullptr) kv_shared.release(kv);
        kv = kv_shared.acquire(b * p.heads_kv + hk, int((lk + dm.bk - 1) / dm.bk), [&](int t, float* tiles) {
          const int64_t j0 = int64_t(t) * dm.bk;
          const int cols = int(std::min<int64_t>(dm.bk, lk - j0));
          load_tile<T>(p, p.k, p.k_layout, b, hk, j0, dm.bk, cols, dm.d, dm.dp, tiles + j0 * dm.dp);
          load_tile<T>(p, p.v, p.v_layout, b, hk, j0, dm.bk, cols, dm.dv, dm.dvp,
                       tiles + kv_blocks_max * dm.bk * dm.dp + j0 * dm.dvp);
        });
        cached_b = b;  // kv == nullptr: every slot held by other heads, the tiles converted per task below
        cached_hk = hk;
      }
#if defined(FA_CPU_BF16_DOT)
      if constexpr (T == FA_BFLOAT16) {
        if (cache_vt && (cached_b != b || cached_hk != hk)) {
          auto* vt = reinterpret_cast<uint16_t*>(vt_cache.data());
          for (int64_t j0 = 0; j0 < lk; j0 += dm.bk)
            pack_t<T>(p, p.v, p.v_layout, b, hk, j0, int(std::min<int64_t>(dm.bk, lk - j0)), dm.bk, dm.dv, dm.dvp,
                      vt + j0 * dm.dvp);
          cached_b = b;
          cached_hk = hk;
        }
      }
#endif
      TileMask tm;
      tm.scale = p.scale;
      tm.softcap = p.softcap;
      tm.slope = p.alibi_slope(b, h);
      const detail::MaskRule<int64_t> rule = detail::mask_rule(p, lq, lk);
      tm.off = float(rule.diag_off);
      tm.left = rule.left >= 0 ? float(rule.left) : kUnbounded;
      tm.right = rule.right >= 0 ? float(rule.right) : kUnbounded;
      tm.len_k = float(rule.len_k);

      // The group's query blocks: rows, the keys their first and last rows see, their state.
      const int ng = int(std::min<int64_t>(group_blocks, (lq - i_task + dm.bq - 1) / dm.bq));
      struct Block {
        int64_t i0;
        int rows;
        detail::KeyRange first, last;
        float *qt, *o, *m, *l;
        uint32_t* q_pairs;
      };
      Block blk[kQueryGroup];
      int64_t j_begin = std::numeric_limits<int64_t>::max(), j_end = 0;
      for (int g = 0; g < ng; ++g) {
        Block& B = blk[g];
        B.i0 = i_task + int64_t(g) * dm.bq;
        B.rows = int(std::min<int64_t>(dm.bq, lq - B.i0));
        B.qt = bf16_dot ? nullptr : qt.data() + size_t(g) * dm.dp * dm.bq;
        B.o = o.data() + size_t(g) * dm.bq * dm.dvp;
        B.m = m.data() + size_t(g) * dm.bq;
        B.l = l.data() + size_t(g) * dm.bq;
        B.q_pairs = pairs ? q_pairs + size_t(g) * (dm.dp / 2) * dm.bq : nullptr;
        // The fp32 Q^T serves the fp32 products only (bf16 dot products read Q in pairs).
        if (!bf16_dot) load_tile_t<T>(p, p.q, p.q_layout, b, h, B.i0, dm.bq, B.rows, dm.d, dm.dp, dm.bq, B.qt);
#if defined(FA_CPU_BF16_DOT)
        // bf16: S^T = K Q^T from the bf16 inputs in bf16 dot products (tile_gemm.hpp), Q packed in pairs once here.
        if constexpr (T == FA_BFLOAT16) pack_rows<T>(p, p.q, p.q_layout, b, h, B.i0, B.rows, dm.bq, dm.d, B.q_pairs);
#endif
        std::fill(B.o, B.o + size_t(dm.bq) * dm.dvp, 0.f);
        std::fill(B.m, B.m + dm.bq, kNegInf);
        std::fill(B.l, B.l + dm.bq, 0.f);
        B.first = detail::visible_keys(p, B.i0, lq, lk);
        B.last = detail::visible_keys(p, B.i0 + B.rows - 1, lq, lk);
        if (B.first.lo / dm.bk * dm.bk < B.last.hi) {  // the block visits key tiles [first.lo / bk, last.hi)
          j_begin = std::min(j_begin, B.first.lo / dm.bk * dm.bk);
          j_end = std::max(j_end, B.last.hi);
        }
      }
      for (int64_t j0 = j_begin; j0 < j_end; j0 += dm.bk) {
        const int cols = int(std::min<int64_t>(dm.bk, lk - j0));
        // K/V beyond the cache: the tile converted once per task, for its query blocks. Read in place instead (as
        // before kQueryGroup), the GEMMs' loads of rows one (B, S, H, D) row apart (8 KB at 16 fp32 heads of d128)
        // stalled on the TLB: fp32 16k forward 0.22-0.23 -> 0.29-0.30 TFLOP/s (2 threads,
        // bench/results/2026-12-02_cpu_xeon_amx_session17.md).
        const float* kt = k.data();
        const float* vt = v.data();
        bool v_packed = false;  // bf16: V of this tile in row pairs (v_rp), once for the group
        if (kv != nullptr) {
          kt = kv + j0 * dm.dp;
          vt = kv + kv_blocks_max * dm.bk * dm.dp + j0 * dm.dvp;
        } else if (!bf16_dot) {
          load_tile<T>(p, p.k, p.k_layout, b, hk, j0, dm.bk, cols, dm.d, dm.dp, k.data());
          load_tile<T>(p, p.v, p.v_layout, b, hk, j0, dm.bk, cols, dm.dv, dm.dvp, v.data());
        }
        // bf16 dot products: K's rows of the tile copied into a dense tile (zero rows past the keys), once per tile
        // for the task's query blocks, so that every tile takes the same arithmetic (a paged call equals the
        // contiguous one bit for bit). Not read in place: the AMX tile loads of rows one (B, S, H, D) row apart (4 KB
        // at 16 heads of d128) stalled on the TLB, and the copy made the forward 8-10% faster (d128, 1k/4k, 2 threads,
        // bench/results/2026-12-02_cpu_xeon_amx_session17.md). V only through V^T.
        const uint16_t* k_bf16 = nullptr;
        if (bf16_dot) {
          auto* kb = reinterpret_cast<uint16_t*>(k_tile_buf.data());
          const auto* src = static_cast<const uint16_t*>(p.k);
          for (int r = 0; r < dm.bk; ++r) {
            if (r < cols)
              std::memcpy(kb + int64_t(r) * dm.d, src + p.offset(p.k_layout, b, j0 + r, hk), size_t(dm.d) * 2);
            else
              std::fill(kb + int64_t(r) * dm.d, kb + int64_t(r + 1) * dm.d, uint16_t(0));
          }
          k_bf16 = kb;
        }
        (void)k_bf16;  // read under FA_CPU_BF16_DOT only
        for (int g = 0; g < ng; ++g) {
          Block& B = blk[g];
          if (j0 < B.first.lo / dm.bk * dm.bk || j0 >= B.last.hi) continue;  // outside this block's tiles
          bool scored = false;
#if defined(FA_CPU_BF16_DOT)
          if constexpr (T == FA_BFLOAT16) {
            gemm_bf16<false>(dm.bk, dm.bq, dm.d, k_bf16, dm.d, B.q_pairs, dm.bq, st.data(), dm.bq);
            scored = true;
          }
#endif
          if (!scored) gemm<false>(dm.bk, dm.bq, dm.dp, kt, dm.dp, B.qt, dm.bq, st.data(), dm.bq);
          // The mask can be skipped when every real query sees every key of a full tile: window starts
          // grow with the query index (the last query's start bounds them all), ends likewise (the first's).
          tm.mask = !(cols == dm.bk && B.last.lo <= j0 && B.first.hi >= j0 + dm.bk);
          // A tile without mask, softcap or ALiBi has the logits scale * raw: formed inside the two passes below
          // (the same products, bit for bit) instead of in a pass of their own over the tile. The row maximum of
          // the raw scores times the (positive) scale is the maximum of the logits: rounding is monotonic.
          const bool plain = !tm.mask && tm.softcap == 0.f && tm.slope == 0.f;
          if (!plain) logits_tile_t(tm, B.i0, j0, dm.bq, dm.bk, st.data());
          const vfloat to_logit = vbroadcast(plain ? tm.scale : 1.f);
          // bf16 dot products without dropout: the exp pass writes P's key pairs itself.
          const bool fused_pairs = pairs && !p.dropout.on;
          for (int q = 0; q < dm.bq; q += kVecFloats) {
            // NaN-propagating running max: once a NaN is seen it stays, and the row's output becomes NaN. Four
            // independent maxima over the keys: one chain of compare, or and masked move per key was latency bound
            // (6 cycles a key, as long as the tile's two GEMMs on AMX). The maximum does not depend on the order
            // (of +0 and -0 either may stay: m only enters as x - m and exp(+-0) = 1).
            vfloat maxima[4] = {vbroadcast(kNegInf), vbroadcast(kNegInf), vbroadcast(kNegInf), vbroadcast(kNegInf)};
            int c = 0;
            for (; c + 4 <= dm.bk; c += 4)
              for (int u = 0; u < 4; ++u) maxima[u] = nan_max(vload(st.data() + int64_t(c + u) * dm.bq + q), maxima[u]);
            for (; c < dm.bk; ++c) maxima[0] = nan_max(vload(st.data() + int64_t(c) * dm.bq + q), maxima[0]);
            vfloat tile_max = nan_max(nan_max(maxima[0], maxima[1]), nan_max(maxima[2], maxima[3]));
            tile_max *= to_logit;
            const vfloat mx = nan_max(tile_max, vload(B.m + q));
            // Rows that have seen no visible key keep m = -inf; subtracting 0 instead keeps exp(-inf) = 0.
            const vfloat m_use = mx == kNegInf ? vfloat{} : mx;
            const vfloat a = exp_nonpositive(vload(B.m + q) - m_use);
            vfloat sum{};
#if defined(FA_CPU_BF16_DOT)
            if (fused_pairs) {  // P straight into its bf16 key pairs (key_pairs_of's layout), St not written back
              for (int c = 0; c < dm.bk; c += 2) {
                const float* sp = st.data() + int64_t(c) * dm.bq + q;
                const vfloat e0 = exp_nonpositive(vload(sp) * to_logit - m_use);
                const vfloat e1 = exp_nonpositive(vload(sp + dm.bq) * to_logit - m_use);
                store_bf16_pairs(p_pairs + int64_t(c / 2) * dm.bq + q, e0, e1);
                sum += e0;
                sum += e1;
              }
            }
#endif
            for (int c = 0; c < dm.bk && !fused_pairs; ++c) {
              float* sp = st.data() + int64_t(c) * dm.bq + q;
              vfloat e = exp_nonpositive(vload(sp) * to_logit - m_use);
              vstore(sp, e);
              sum += e;
            }
            vstore(B.l + q, vload(B.l + q) * a + sum);
            vstore(B.m + q, mx);
            vstore(alpha.data() + q, a);
          }
          bool rescale = false;  // any row's max moved (later tiles rarely move it)
          for (int q = 0; q < dm.bq; ++q) rescale |= alpha.data()[q] != 1.f;
          if (pairs && rescale) {  // O^T (the bf16 dot-product layout): queries along the vectors
            for (int c = 0; c < dm.dvp; ++c)
              for (int q = 0; q < dm.bq; q += kVecFloats) {
                float* oc = B.o + int64_t(c) * dm.bq + q;
                vstore(oc, vload(oc) * vload(alpha.data() + q));
              }
          } else if (!pairs) {
            for (int r = 0; r < B.rows; ++r) {
              const float a = alpha.data()[r];
              if (a != 1.f) {
                float* orow = B.o + int64_t(r) * dm.dvp;
                for (int c = 0; c < dm.dvp; ++c) orow[c] *= a;
              }
            }
          }
          // Dropout after the row sums (the softmax's normaliser counts every key), before P reaches V.
          if (p.dropout.on)
            for (int c = 0; c < cols; ++c)
              for (int r = 0; r < B.rows; ++r)
                st.data()[int64_t(c) * dm.bq + r] *= p.dropout.factor(b, p.heads_q, h, B.i0 + r, j0 + c);
#if defined(FA_CPU_BF16_DOT)
          if constexpr (T == FA_BFLOAT16) {
            // O^T += V^T P^T in bf16 dot products: P rounded to bf16 (as the GPU kernels round it) in key pairs of
            // St's rows, V^T once per tile for the group.
            if (!fused_pairs) key_pairs_of(st.data(), dm.bq, dm.bk, p_pairs);
            const uint16_t* vt = cache_vt ? reinterpret_cast<const uint16_t*>(vt_cache.data()) + j0 * dm.dvp : v_t;
            if (!cache_vt && !v_packed) pack_t<T>(p, p.v, p.v_layout, b, hk, j0, cols, dm.bk, dm.dv, dm.dvp, v_t);
            v_packed = true;
            gemm_bf16<true>(dm.dvp, dm.bq, dm.bk, vt, dm.bk, p_pairs, dm.bq, B.o, dm.bq);
            continue;
          }
#endif
          gemm<true, ALayout::kTransposed>(dm.bq, dm.dvp, dm.bk, st.data(), dm.bq, vt, dm.dvp, B.o, dm.dvp);
        }
        (void)v_packed;
      }
      using S = Storage<T>;
      auto* out = static_cast<typename S::type*>(p.out);
      const float sink = p.sink(h);
      for (int g = 0; g < ng; ++g) {
        const Block& B = blk[g];
        for (int r = 0; r < B.rows; ++r) {
          const float lr = B.l[r], mr = B.m[r];
          // l == 0 only when no key was visible (m stays -inf): out = 0, lse = -inf. A NaN l keeps NaN.
          float inv = lr > 0.f ? 1.f / lr : (lr == 0.f ? 0.f : lr);
          float lse = lr > 0.f ? mr + std::log(lr) : (lr == 0.f ? kNegInf : lr);
          if (sink != kNegInf) {
            // The sink joins the denominator: lse' = log(e^lse + e^sink), out scaled by e^(lse - lse').
            const float merged =
                lse == kNegInf ? sink : std::max(lse, sink) + std::log1p(std::exp(-std::fabs(lse - sink)));
            if (lr > 0.f) inv *= std::exp(lse - merged);
            lse = merged;
          }
          auto* dst = out + p.offset(p.out_layout, b, B.i0 + r, h);
          if (pairs) {
            for (int c = 0; c < dm.dv; ++c) dst[c] = S::store(B.o[int64_t(c) * dm.bq + r] * inv);
          } else {
            const float* orow = B.o + int64_t(r) * dm.dvp;
            for (int c = 0; c < dm.dv; ++c) dst[c] = S::store(orow[c] * inv);
          }
          if (p.lse) p.lse[p.offset(p.lse_layout, b, B.i0 + r, h)] = lse;
        }
      }
    }
    if (kv != nullptr) kv_shared.release(kv);
  }
  if (alloc_failed) return detail::backend_error("cpu: out of memory allocating per-thread tiles");
  return detail::ok();
}

constexpr int kMaxKeyGroup = 4;

// Key blocks a backward task takes per pass over its query blocks. Where the task's Q and dO do not fit its
// per-thread cache (more than 4k rows of d128 for one head), they are converted from the inputs per query block
// and dQ's rows go back to memory per visit: four key blocks per pass quarter that traffic (fp32 d128 16k,
// 2 threads: backward +18-37% over one block a pass, bench/results/2026-12-02_cpu_session18.md). Cached Q/dO keep
// one block a pass, as measured before. bf16 dot products already take 128/256-key tiles.
constexpr int key_group(bool bf16_dot, bool cache_qdo) { return bf16_dot || cache_qdo ? 1 : kMaxKeyGroup; }

template <fa_dtype T>
Error backward_impl(const Problem& p, int threads) {
  using S = Storage<T>;
  const Dims dm = dims_of(p, T == FA_BFLOAT16 && kHaveBf16Dot);
  const int64_t group = p.group(), H = p.heads_q;
  const int nthreads = thread_count(threads);
  const int64_t tq = p.total_q, tk = p.total_k;
  // Rows of the fp32 accumulators are global rows: varlen rows as they are, batched rows b * S + r.
  auto qrow = [&](int64_t b, int64_t r) { return p.varlen ? p.host_cu_q[b] + r : b * p.seqlen_q + r; };
  auto krow = [&](int64_t b, int64_t r) { return p.varlen ? p.host_cu_k[b] + r : b * p.seqlen_k + r; };

  // A task is (sequence, KV head, query-head subgroup, key-block chunk): it owns the dK/dV of its key blocks for
  // the query heads of its subgroup (summed over them in ascending order) and one fp32 copy of dQ per chunk.
  // Chunks and subgroups only as many as it takes to occupy every thread: the dQ copies grow with the chunks, the
  // dK/dV accumulators with the subgroups (GQA/MQA with one subgroup holds them once per KV head, not per query
  // head).
  const int64_t Hk = p.heads_kv;
  int64_t max_kblocks = 0;
  for (int64_t b = 0; b < p.batch; ++b) max_kblocks = std::max<int64_t>(max_kblocks, (p.len_k(b) + dm.bk - 1) / dm.bk);
  constexpr int64_t kMaxChunks = 4;
  const int64_t seq_heads = std::max<int64_t>(1, p.batch * Hk);
  // Two tasks per thread for the dynamic schedule to balance (one thread: one task is enough).
  const int64_t tasks_wanted = nthreads > 1 ? 2 * int64_t(nthreads) : 1;
  const int64_t want = (tasks_wanted + seq_heads - 1) / seq_heads;
  const int64_t chunks = std::max<int64_t>(1, std::min({want, kMaxChunks, std::max<int64_t>(1, max_kblocks)}));
  const int64_t subgroups = std::max<int64_t>(1, std::min(group, (want + chunks - 1) / chunks));
  const int64_t acc_heads = Hk * subgroups;

  FloatBuffer D, lse, dq_acc, dk_acc, dv_acc;
  if (!D.reset(size_t(H * tq)) || !lse.reset(size_t(H * tq)) || !dq_acc.reset(size_t(chunks * H * tq * dm.dp)) ||
      !dk_acc.reset(size_t(acc_heads * tk * dm.dp)) || !dv_acc.reset(size_t(acc_heads * tk * dm.dvp)))
    return detail::backend_error("cpu: out of memory allocating backward accumulators");
  // The serial parts of the backward are parallel over (sequence, head), not over sequences alone: with one
  // sequence they ran on one thread, which at 16 threads cost a large share of short backwards.
  const int64_t zero_chunks = 4 * int64_t(nthreads);
  for (FloatBuffer* acc : {&dq_acc, &dk_acc, &dv_acc}) {
    const size_t n = acc == &dq_acc   ? size_t(chunks * H * tq * dm.dp)
                     : acc == &dk_acc ? size_t(acc_heads * tk * dm.dp)
                                      : size_t(acc_heads * tk * dm.dvp);
    float* data = acc->data();
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t z = 0; z < zero_chunks; ++z) {
      const size_t lo = n * size_t(z) / size_t(zero_chunks), hi = n * size_t(z + 1) / size_t(zero_chunks);
      std::fill(data + lo, data + hi, 0.f);
    }
  }

  // D_i = rowsum(dO * O) and the saved LSE, per (head, global row).
  const auto* out = static_cast<const typename S::type*>(p.out);
  const auto* dout = static_cast<const typename S::type*>(p.dout);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t bh = 0; bh < p.batch * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t r = 0; r < p.len_q(b); ++r) {
      const auto* o = out + p.offset(p.out_layout, b, r, h);
      const auto* g = dout + p.offset(p.dout_layout, b, r, h);
      float acc = 0.f;
      int c = 0;
#if defined(FA_CPU_BF16_DOT)
      if constexpr (T == FA_BFLOAT16) {  // 32 products per vdpbf16ps (exact), summed in fp32
        __m512 sum = _mm512_setzero_ps();
        for (; c + 32 <= dm.dv; c += 32)
          sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(o + c), (__m512bh)_mm512_loadu_si512(g + c));
        alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12 warns on its undefined operand)
        _mm512_store_ps(lanes, sum);
        for (float x : lanes) acc += x;
      }
#endif
      for (; c < dm.dv; ++c) acc += S::load(o[c]) * S::load(g[c]);
      D.data()[h * tq + qrow(b, r)] = acc;
      lse.data()[h * tq + qrow(b, r)] = p.lse[p.offset(p.lse_layout, b, r, h)];
    }
  }
  // dsink_h = -sum over rows of e^(sink_h - lse) * D (the sink's probability with dP = 0), in a fixed order.
  if (p.dsinks != nullptr) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t h = 0; h < H; ++h) {
      double acc = 0.0;
      const float sink = p.sink(h);
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t r = 0; r < p.len_q(b); ++r) {
          const float l = lse.data()[h * tq + qrow(b, r)];
          if (l != kNegInf) acc += std::exp(double(sink) - double(l)) * double(D.data()[h * tq + qrow(b, r)]);
        }
      p.dsinks[h] = float(-acc);
    }
  }

  const int64_t ntasks = p.batch * acc_heads * chunks;
  // Chunk boundaries per sequence that split the key blocks' work (the query rows that visit each block) evenly: under
  // a causal mask equal block counts gave the first of two chunks three times the second's work, and with two tasks
  // per thread the longest task set the time.
  std::vector<std::vector<int64_t>> chunk_bounds(size_t(p.batch));
  for (int64_t b = 0; b < p.batch && chunks > 1; ++b) {
    const int64_t lq = p.len_q(b), lk = p.len_k(b), nkb = (lk + dm.bk - 1) / dm.bk;
    std::vector<double> work(size_t(nkb), 0.0);
    for (int64_t i0 = 0; i0 < lq; i0 += dm.bq) {
      const int64_t rows = std::min<int64_t>(dm.bq, lq - i0);
      const detail::KeyRange first = detail::visible_keys(p, i0, lq, lk),
                             last = detail::visible_keys(p, i0 + rows - 1, lq, lk);
      for (int64_t kb = std::max<int64_t>(0, first.lo / dm.bk); kb < nkb && kb * dm.bk < last.hi; ++kb)
        work[size_t(kb)] += double(rows);
    }
    double total = 0.0;
    for (double w : work) total += w;
    std::vector<int64_t>& bounds = chunk_bounds[size_t(b)];
    bounds.assign(size_t(chunks) + 1, nkb);
    bounds[0] = 0;
    double acc = 0.0;
    int64_t c = 1;
    for (int64_t kb = 0; kb < nkb && c < chunks; ++kb) {
      acc += work[size_t(kb)];
      while (c < chunks && acc >= total * double(c) / double(chunks)) bounds[size_t(c++)] = kb + 1;
    }
  }
  // A task visits its heads' query blocks once per key block: their fp32 Q and dO tiles are converted once per
  // task into a per-thread cache when they fit kQdoCacheBytes (one head of 4k d128 rows), else reloaded per block.
  constexpr int64_t kQdoCacheBytes = int64_t(4) << 20;
  int64_t max_lq = 0;
  for (int64_t b = 0; b < p.batch; ++b) max_lq = std::max(max_lq, p.len_q(b));
  const int64_t heads_per_task = (group + subgroups - 1) / subgroups;
  const int64_t q_blocks_max = (max_lq + dm.bq - 1) / dm.bq;
  const int64_t cache_floats = heads_per_task * q_blocks_max * dm.bq * (dm.dp + dm.dvp);
  // bf16 with dot products reads Q and dO as bf16 (fp32 tiles only for the Q.K^T / dO.V^T of a partial block).
  const bool bf16_dot = T == FA_BFLOAT16 && kHaveBf16Dot;
  const bool cache_qdo = !bf16_dot && cache_floats > 0 && cache_floats * int64_t(sizeof(float)) <= kQdoCacheBytes;
  // bf16: Q^T and dO^T of the task's (head, query block) pairs in bf16, once per task when they fit (4k rows of
  // d128 per thread: tests/test_memory.cpp holds the backward's scratch to the accumulators), else per use.
  constexpr int64_t kQgCacheBytes = int64_t(2) << 20;
  const int64_t qg_cache_elems = heads_per_task * q_blocks_max * dm.bq * (dm.dp + dm.dvp);
  const bool cache_qg = bf16_dot && qg_cache_elems > 0 && qg_cache_elems * 2 <= kQgCacheBytes;
  const size_t kg = size_t(key_group(bf16_dot, cache_qdo));
  bool alloc_failed = false;
#pragma omp parallel num_threads(nthreads)
  {
    // K, V and the dK/dV sums of the kg key blocks of a group, one tile each.
    const size_t kdp = size_t(dm.bk) * dm.dp, kdvp = size_t(dm.bk) * dm.dvp;
    FloatBuffer q(size_t(dm.bq) * dm.dp), g(size_t(dm.bq) * dm.dvp), kt(kg * kdp), kn(kg * kdp), vt(kg * kdvp),
        s(size_t(dm.bq) * dm.bk), dp(size_t(dm.bq) * dm.bk), dk(kg * kdp), dv(kg * kdvp), dq(size_t(dm.bq) * dm.dp),
        dk_head(kg * kdp), dv_head(kg * kdvp), qdo(cache_qdo ? size_t(cache_floats) : 0), tanh_row(size_t(dm.bk));
    auto kt_of = [&](int gi) { return kt.data() + gi * kdp; };
    auto kn_of = [&](int gi) { return kn.data() + gi * kdp; };
    auto vt_of = [&](int gi) { return vt.data() + gi * kdvp; };
    const bool pairs = bf16_dot;
#if defined(FA_CPU_AMX)
    if (pairs) amx_configure();  // this thread's tiles for gemm_bf16 (tile_gemm.hpp)
#endif
    PairBuffer k_pair_buf(pairs ? kg * kdp / 2 : 0), v_pair_buf(pairs ? kg * kdvp / 2 : 0);
    // Operands of the three GEMMs of P and dS, which run transposed for dK and dV (dV^T += dO^T P, dK^T += Q^T dS:
    // P and dS in bf16 pairs of their query rows, no transposes of them): P and dS pairs, dS in bf16 rows, K in row
    // pairs, Q^T and dO^T in bf16 (per block, or cached per task). dk, dv (and dk_head, dv_head) then hold dK^T, dV^T.
    PairBuffer p_pair_buf(pairs ? size_t(dm.bk) * dm.bq / 2 : 0), ds_pair_buf(pairs ? size_t(dm.bk) * dm.bq / 2 : 0),
        ds_r_buf(pairs ? size_t(dm.bq) * dm.bk / 2 : 0), k_rp_buf(pairs ? kg * kdp / 2 : 0),
        q_t_buf(pairs ? size_t(dm.bq / 2) * dm.dp : 0), g_t_buf(pairs ? size_t(dm.bq / 2) * dm.dvp : 0),
        qg_cache(cache_qg ? size_t(qg_cache_elems / 2) : 0), q_pad_buf(pairs ? size_t(dm.bq) * dm.d / 2 : 0),
        g_pad_buf(pairs ? size_t(dm.bq) * dm.dv / 2 : 0);
    uint32_t *p_pairs = p_pair_buf.data(), *ds_pairs = ds_pair_buf.data();
    auto k_pairs_of = [&](int gi) { return k_pair_buf.data() + gi * kdp / 2; };
    auto v_pairs_of = [&](int gi) { return v_pair_buf.data() + gi * kdvp / 2; };
    auto k_rp_of = [&](int gi) { return k_rp_buf.data() + gi * kdp / 2; };
    (void)k_pairs_of, (void)v_pairs_of, (void)k_rp_of, (void)kt_of, (void)kn_of, (void)vt_of;
    auto* ds_r = reinterpret_cast<uint16_t*>(ds_r_buf.data());
    (void)p_pairs, (void)ds_pairs, (void)ds_r;
    const bool ok = q.data() && g.data() && kt.data() && kn.data() && vt.data() && s.data() && dp.data() && dk.data() &&
                    dv.data() && dq.data() && dk_head.data() && dv_head.data() && (!cache_qdo || qdo.data()) &&
                    tanh_row.data() &&
                    (!pairs || (k_pair_buf.data() && v_pair_buf.data() && k_rp_buf.data() && p_pairs && ds_pairs &&
                                ds_r && q_t_buf.data() && g_t_buf.data() && (!cache_qg || qg_cache.data()) &&
                                q_pad_buf.data() && g_pad_buf.data()));
    if (!ok) {
#pragma omp atomic write
      alloc_failed = true;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      if (!ok) continue;
      const int64_t b = task / (acc_heads * chunks), acc_head = (task / chunks) % acc_heads, chunk = task % chunks;
      const int64_t hk = acc_head / subgroups, sub = acc_head % subgroups, lq = p.len_q(b), lk = p.len_k(b);
      const int64_t h_begin = hk * group + group * sub / subgroups, h_end = hk * group + group * (sub + 1) / subgroups;
      const int64_t nkb = (lk + dm.bk - 1) / dm.bk;
      const int64_t kb_begin = chunks > 1 ? chunk_bounds[size_t(b)][size_t(chunk)] : 0;
      const int64_t kb_end = chunks > 1 ? chunk_bounds[size_t(b)][size_t(chunk + 1)] : nkb;
      const int64_t nqb = (lq + dm.bq - 1) / dm.bq;
      // Q and dO tiles of (head, query block): from the cache, filled here, or loaded into q / g when used.
      auto q_tile = [&](int64_t h, int64_t qb) { return qdo.data() + ((h - h_begin) * nqb + qb) * dm.bq * dm.dp; };
      auto g_tile = [&](int64_t h, int64_t qb) {
        return qdo.data() + heads_per_task * q_blocks_max * dm.bq * dm.dp + ((h - h_begin) * nqb + qb) * dm.bq * dm.dvp;
      };
#if defined(FA_CPU_BF16_DOT)
      // bf16: Q^T [dp][bq] and dO^T [dvp][bq] of (head, query block), from the cache or packed into q_t / g_t.
      auto qg_t = [&](int64_t h, int64_t qb, bool fill) {
        uint16_t* qt16 = reinterpret_cast<uint16_t*>(q_t_buf.data());
        uint16_t* gt16 = reinterpret_cast<uint16_t*>(g_t_buf.data());
        if (cache_qg) {
          auto* base = reinterpret_cast<uint16_t*>(qg_cache.data()) +
                       ((h - h_begin) * q_blocks_max + qb) * int64_t(dm.bq) * (dm.dp + dm.dvp);
          qt16 = base;
          gt16 = base + int64_t(dm.bq) * dm.dp;
        }
        if constexpr (T != FA_BFLOAT16) fill = false;
        if (fill) {
          const int64_t i0 = qb * dm.bq;
          const int rows = int(std::min<int64_t>(dm.bq, lq - i0));
          pack_t<FA_BFLOAT16>(p, p.q, p.q_layout, b, h, i0, rows, dm.bq, dm.d, dm.dp, qt16);
          pack_t<FA_BFLOAT16>(p, p.dout, p.dout_layout, b, h, i0, rows, dm.bq, dm.dv, dm.dvp, gt16);
        }
        return std::pair<const uint16_t*, const uint16_t*>(qt16, gt16);
      };
      if constexpr (T == FA_BFLOAT16)
        if (cache_qg && kb_end > kb_begin)
          for (int64_t h = h_begin; h < h_end; ++h)
            for (int64_t qb = 0; qb < nqb; ++qb) qg_t(h, qb, true);
#endif
      if (cache_qdo && kb_end > kb_begin)
        for (int64_t h = h_begin; h < h_end; ++h)
          for (int64_t qb = 0; qb < nqb; ++qb) {
            const int64_t i0 = qb * dm.bq;
            const int rows = int(std::min<int64_t>(dm.bq, lq - i0));
            load_tile<T>(p, p.q, p.q_layout, b, h, i0, dm.bq, rows, dm.d, dm.dp, q_tile(h, qb));
            load_tile<T>(p, p.dout, p.dout_layout, b, h, i0, dm.bq, rows, dm.dv, dm.dvp, g_tile(h, qb));
          }
      // Key blocks in groups of kg: each query block's Q and dO tiles (and its dQ rows) are loaded once per group
      // instead of once per key block; within the group each block's arithmetic, and its order, is unchanged.
      for (int64_t kb0 = kb_begin; kb0 < kb_end; kb0 += int64_t(kg)) {
        const int ng = int(std::min<int64_t>(int64_t(kg), kb_end - kb0));
        int64_t j0s[kMaxKeyGroup];
        int colss[kMaxKeyGroup];
        for (int gi = 0; gi < ng; ++gi) {
          const int64_t j0 = (kb0 + gi) * dm.bk;
          const int cols = int(std::min<int64_t>(dm.bk, lk - j0));
          j0s[gi] = j0;
          colss[gi] = cols;
          if (!bf16_dot) {  // fp32 operands (bf16 dot products read the bf16 inputs)
            load_tile_t<T>(p, p.k, p.k_layout, b, hk, j0, dm.bk, cols, dm.d, dm.dp, dm.bk, kt_of(gi));
            load_tile<T>(p, p.k, p.k_layout, b, hk, j0, dm.bk, cols, dm.d, dm.dp, kn_of(gi));
            load_tile_t<T>(p, p.v, p.v_layout, b, hk, j0, dm.bk, cols, dm.dv, dm.dvp, dm.bk, vt_of(gi));
          }
#if defined(FA_CPU_BF16_DOT)
          // bf16: S = Q K^T and dP = dO V^T from the bf16 inputs in bf16 dot products, K and V packed here.
          if constexpr (T == FA_BFLOAT16) {
            pack_rows<T>(p, p.k, p.k_layout, b, hk, j0, cols, dm.bk, dm.d, k_pairs_of(gi));
            pack_rows<T>(p, p.v, p.v_layout, b, hk, j0, cols, dm.bk, dm.dv, v_pairs_of(gi));
            pack_row_pairs<T>(p, p.k, p.k_layout, b, hk, j0, cols, dm.bk, dm.d, dm.dp, k_rp_of(gi));
          }
#endif
        }
        dk.zero();
        dv.zero();
        // One head's sums over the query blocks, then the heads' in ascending order (the order the per-query-head
        // accumulators were summed in before).
        for (int64_t h = h_begin; h < h_end; ++h) {
          float* const head_dk = h == h_begin ? dk.data() : dk_head.data();
          float* const head_dv = h == h_begin ? dv.data() : dv_head.data();
          if (h != h_begin) {
            dk_head.zero();
            dv_head.zero();
          }
          float* dq_part = dq_acc.data() + (chunk * H + h) * tq * dm.dp;
          for (int64_t i0 = 0; i0 < lq; i0 += dm.bq) {
            const int rows = int(std::min<int64_t>(dm.bq, lq - i0));
            const detail::KeyRange first = detail::visible_keys(p, i0, lq, lk);
            const detail::KeyRange last = detail::visible_keys(p, i0 + rows - 1, lq, lk);
            // The group's blocks that some row of this query block sees.
            bool seen[kMaxKeyGroup];
            bool any = false;
            for (int gi = 0; gi < ng; ++gi) {
              seen[gi] = !(first.lo >= j0s[gi] + colss[gi] || last.hi <= j0s[gi]);
              any = any || seen[gi];
            }
            if (!any) continue;
            float* qt = q.data();
            float* gt = g.data();
            if (cache_qdo) {
              qt = q_tile(h, i0 / dm.bq);
              gt = g_tile(h, i0 / dm.bq);
            } else if (!bf16_dot) {
              load_tile<T>(p, p.q, p.q_layout, b, h, i0, dm.bq, rows, dm.d, dm.dp, qt);
              load_tile<T>(p, p.dout, p.dout_layout, b, h, i0, dm.bq, rows, dm.dv, dm.dvp, gt);
            }
#if defined(FA_CPU_BF16_DOT)
            auto* qp = reinterpret_cast<uint16_t*>(q_pad_buf.data());
            auto* gp = reinterpret_cast<uint16_t*>(g_pad_buf.data());
            if constexpr (T == FA_BFLOAT16) {
              // Q and dO rows copied into dense zero-padded tiles, so that every block takes the same arithmetic;
              // not read in place: AMX tile loads of rows one (B, S, H, D) row apart stall on the TLB, and the copy
              // made the backward 5-11% faster (d128, 1k/4k, 2 threads, the file K's copy in the forward cites).
              const auto* qsrc = static_cast<const uint16_t*>(p.q);
              const auto* gsrc = static_cast<const uint16_t*>(p.dout);
              for (int r = 0; r < rows; ++r) {
                std::memcpy(qp + int64_t(r) * dm.d, qsrc + p.offset(p.q_layout, b, i0 + r, h), size_t(dm.d) * 2);
                std::memcpy(gp + int64_t(r) * dm.dv, gsrc + p.offset(p.dout_layout, b, i0 + r, h), size_t(dm.dv) * 2);
              }
              std::fill(qp + int64_t(rows) * dm.d, qp + int64_t(dm.bq) * dm.d, uint16_t(0));
              std::fill(gp + int64_t(rows) * dm.dv, gp + int64_t(dm.bq) * dm.dv, uint16_t(0));
            }
#endif
            for (int gi = 0; gi < ng; ++gi) {
              if (!seen[gi]) continue;
              const int64_t j0 = j0s[gi];
              const int cols = colss[gi];
              float* const hk_dk = head_dk + int64_t(gi) * dm.bk * dm.dp;
              float* const hk_dv = head_dv + int64_t(gi) * dm.bk * dm.dvp;
              bool scored = false;
#if defined(FA_CPU_BF16_DOT)
              if constexpr (T == FA_BFLOAT16) {
                gemm_bf16<false>(dm.bq, dm.bk, dm.d, qp, dm.d, k_pairs_of(gi), dm.bk, s.data(), dm.bk);
                gemm_bf16<false>(dm.bq, dm.bk, dm.dv, gp, dm.dv, v_pairs_of(gi), dm.bk, dp.data(), dm.bk);
                scored = true;
              }
#endif
              if (!scored) {
                gemm<false>(dm.bq, dm.bk, dm.dp, qt, dm.dp, kt_of(gi), dm.bk, s.data(), dm.bk);
                gemm<false>(dm.bq, dm.bk, dm.dvp, gt, dm.dvp, vt_of(gi), dm.bk, dp.data(), dm.bk);
              }
              for (int r = 0; r < dm.bq; ++r) {
                float* sr = s.data() + int64_t(r) * dm.bk;   // becomes P
                float* dr = dp.data() + int64_t(r) * dm.bk;  // becomes dS (raw-score gradient)
                if (r >= rows) {
                  std::fill(sr, sr + dm.bk, 0.f);
                  std::fill(dr, dr + dm.bk, 0.f);
                  continue;
                }
                const int64_t row = qrow(b, i0 + r);
                RowTransform t = row_transform(p, b, h, i0 + r, lq, lk, j0, dm.bk);
                logits_row(t, j0, dm.bk, sr, tanh_row.data());
                const float lse_r = lse.data()[h * tq + row], d_r = D.data()[h * tq + row];
                if (t.softcap == 0.f && !p.dropout.on) {
                  // The common row (no softcap, no dropout) in vectors: P = e^(s - lse), dS = P (dP - D) scale, with
                  // dS = 0 exactly where P = 0 (masked keys) and fully masked rows (lse = -inf) all zero.
                  const vfloat zero{}, lse_v = vbroadcast(lse_r), d_v = vbroadcast(d_r), scale_v = vbroadcast(t.scale);
                  const bool empty = lse_r == kNegInf;
                  for (int c = 0; c < dm.bk; c += kVecFloats) {
                    const vfloat pr = empty ? zero : exp_nonpositive(vload(sr + c) - lse_v);
                    const vfloat ds = pr * (vload(dr + c) - d_v) * scale_v;
                    vstore(dr + c, pr != zero ? ds : zero);
                    vstore(sr + c, pr);
                  }
                  continue;
                }
                for (int c = 0; c < dm.bk; ++c) {
                  // Fully masked rows (lse = -inf) have P = 0, not exp(-inf + inf).
                  const float pr = lse_r == kNegInf ? 0.f : exp_nonpositive(sr[c] - lse_r);
                  // d logit / d raw score: scale, times the softcap derivative 1 - tanh^2, from the tanh the logit was
                  // made of (the logit plus the ALiBi bias would carry the bias's rounding into it).
                  const float dcap = t.softcap > 0.f && pr != 0.f ? 1.f - tanh_row.data()[c] * tanh_row.data()[c] : 1.f;
                  // Dropout: dV takes Z = P m / (1 - p), dS = P (dZ m / (1 - p) - D) (D = dO.O already has it).
                  const float keep = p.dropout.on && c < cols ? p.dropout.factor(b, H, h, i0 + r, j0 + c) : 1.f;
                  // Masked keys (pr == 0) get dS = 0 exactly; a NaN pr still propagates.
                  dr[c] = pr != 0.f ? pr * (dr[c] * keep - d_r) * dcap * t.scale : 0.f;
                  sr[c] = pr * keep;
                }
              }
#if defined(FA_CPU_BF16_DOT)
              if constexpr (T == FA_BFLOAT16) {
                // bf16: P and dS rounded to bf16 (as the GPU kernels round them) and the
                // three GEMMs they feed in bf16 dot products: dV += P^T dO, dK += dS^T Q, dQ += dS K.
                key_pairs_of(s.data(), dm.bk, dm.bq, p_pairs);    // P in pairs of query rows
                key_pairs_of(dp.data(), dm.bk, dm.bq, ds_pairs);  // dS likewise
                rows_to_bf16(dp.data(), dm.bq * dm.bk, ds_r);     // dS (queries x keys)
                const auto [q_t16, g_t16] = qg_t(h, i0 / dm.bq, !cache_qg);
                gemm_bf16<true>(dm.dvp, dm.bk, dm.bq, g_t16, dm.bq, p_pairs, dm.bk, hk_dv, dm.bk);
                gemm_bf16<true>(dm.dp, dm.bk, dm.bq, q_t16, dm.bq, ds_pairs, dm.bk, hk_dk, dm.bk);
                if (rows == dm.bq) {
                  gemm_bf16<true>(dm.bq, dm.dp, dm.bk, ds_r, dm.bk, k_rp_of(gi), dm.dp, dq_part + qrow(b, i0) * dm.dp,
                                  dm.dp);
                } else {
                  gemm_bf16<false>(dm.bq, dm.dp, dm.bk, ds_r, dm.bk, k_rp_of(gi), dm.dp, dq.data(), dm.dp);
                  for (int r = 0; r < rows; ++r) {
                    float* acc = dq_part + qrow(b, i0 + r) * dm.dp;
                    const float* src = dq.data() + int64_t(r) * dm.dp;
                    for (int c = 0; c < dm.dp; ++c) acc[c] += src[c];
                  }
                }
                continue;
              }
#endif
              // dV += P^T dO and dK += dS^T Q read P and dS transposed in place (no transpose copies).
              gemm<true, ALayout::kTransposed>(dm.bk, dm.dvp, dm.bq, s.data(), dm.bk, gt, dm.dvp, hk_dv, dm.dvp);
              gemm<true, ALayout::kTransposed>(dm.bk, dm.dp, dm.bq, dp.data(), dm.bk, qt, dm.dp, hk_dk, dm.dp);
              if (rows == dm.bq) {
                // A full block's rows are consecutive rows of the accumulator: dQ += dS K straight into it.
                gemm<true>(dm.bq, dm.dp, dm.bk, dp.data(), dm.bk, kn_of(gi), dm.dp, dq_part + qrow(b, i0) * dm.dp,
                           dm.dp);
              } else {
                gemm<false>(dm.bq, dm.dp, dm.bk, dp.data(), dm.bk, kn_of(gi), dm.dp, dq.data(), dm.dp);
                for (int r = 0; r < rows; ++r) {
                  float* acc = dq_part + qrow(b, i0 + r) * dm.dp;
                  const float* src = dq.data() + int64_t(r) * dm.dp;
                  for (int c = 0; c < dm.dp; ++c) acc[c] += src[c];
                }
              }
            }
          }
          if (h != h_begin) {
            for (int64_t i = 0; i < int64_t(ng) * int64_t(kdp); ++i) dk.data()[i] += dk_head.data()[i];
            for (int64_t i = 0; i < int64_t(ng) * int64_t(kdvp); ++i) dv.data()[i] += dv_head.data()[i];
          }
        }
        for (int gi = 0; gi < ng; ++gi) {
          const float* const blk_dk = dk.data() + int64_t(gi) * dm.bk * dm.dp;
          const float* const blk_dv = dv.data() + int64_t(gi) * dm.bk * dm.dvp;
          for (int c = 0; c < colss[gi]; ++c) {
            const int64_t row = krow(b, j0s[gi] + c);
            float* dk_row = dk_acc.data() + (acc_head * tk + row) * dm.dp;
            float* dv_row = dv_acc.data() + (acc_head * tk + row) * dm.dvp;
            if (pairs) {  // dK^T, dV^T
              for (int e = 0; e < dm.dp; ++e) dk_row[e] = blk_dk[int64_t(e) * dm.bk + c];
              for (int e = 0; e < dm.dvp; ++e) dv_row[e] = blk_dv[int64_t(e) * dm.bk + c];
            } else {
              std::copy(blk_dk + int64_t(c) * dm.dp, blk_dk + int64_t(c + 1) * dm.dp, dk_row);
              std::copy(blk_dv + int64_t(c) * dm.dvp, blk_dv + int64_t(c + 1) * dm.dvp, dv_row);
            }
          }
        }
      }
    }
  }
  if (alloc_failed) return detail::backend_error("cpu: out of memory allocating per-thread tiles");

  // Sum dQ over chunks and dK/dV over each KV head's subgroups, in a fixed order; convert to storage.
  auto* dqo = static_cast<typename S::type*>(p.dq);
  auto* dko = static_cast<typename S::type*>(p.dk);
  auto* dvo = static_cast<typename S::type*>(p.dv);
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t bh = 0; bh < p.batch * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    // Row sums in a row buffer (the chunks and subgroups in ascending order, as before), vectorised along the row.
    float sum[kMaxHeadDimPad];
    auto add_rows = [&](const float* first, int64_t stride, int64_t n, int dim) {
      std::copy(first, first + dim, sum);
      for (int64_t i = 1; i < n; ++i)
        for (int c = 0; c < dim; ++c) sum[c] += first[i * stride + c];
    };
    for (int64_t r = 0; r < p.len_q(b); ++r) {
      auto* dst = dqo + p.offset(p.dq_layout, b, r, h);
      add_rows(dq_acc.data() + (h * tq + qrow(b, r)) * dm.dp, H * tq * dm.dp, chunks, dm.d);
      for (int c = 0; c < dm.d; ++c) dst[c] = S::store(sum[c]);
    }
    // dK, dV of the KV head of the group's first query head (each KV head once). Keys beyond seqused_k get zero
    // gradients: no query saw them.
    if (h % group != 0) continue;
    const int64_t hk = h / group;
    const int64_t rows_k = p.varlen ? p.host_cu_k[b + 1] - p.host_cu_k[b] : p.seqlen_k;
    for (int64_t r = 0; r < rows_k; ++r) {
      auto* dkd = dko + p.offset(p.dk_layout, b, r, hk);
      auto* dvd = dvo + p.offset(p.dv_layout, b, r, hk);
      const bool used = r < p.len_k(b);
      if (!used) {
        for (int c = 0; c < dm.d; ++c) dkd[c] = S::store(0.f);
        for (int c = 0; c < dm.dv; ++c) dvd[c] = S::store(0.f);
        continue;
      }
      add_rows(dk_acc.data() + (hk * subgroups * tk + krow(b, r)) * dm.dp, tk * dm.dp, subgroups, dm.d);
      for (int c = 0; c < dm.d; ++c) dkd[c] = S::store(sum[c]);
      add_rows(dv_acc.data() + (hk * subgroups * tk + krow(b, r)) * dm.dvp, tk * dm.dvp, subgroups, dm.dv);
      for (int c = 0; c < dm.dv; ++c) dvd[c] = S::store(sum[c]);
    }
  }
  return detail::ok();
}

}  // namespace

Error forward(const Problem& p, int threads) {
  switch (p.dtype) {
    case FA_FLOAT32: return forward_impl<FA_FLOAT32>(p, threads);
    case FA_FLOAT16: return forward_impl<FA_FLOAT16>(p, threads);
    case FA_BFLOAT16: return forward_impl<FA_BFLOAT16>(p, threads);
    default: return detail::unsupported("cpu: unsupported dtype");
  }
}

Error backward(const Problem& p, int threads) {
  switch (p.dtype) {
    case FA_FLOAT32: return backward_impl<FA_FLOAT32>(p, threads);
    case FA_FLOAT16: return backward_impl<FA_FLOAT16>(p, threads);
    case FA_BFLOAT16: return backward_impl<FA_BFLOAT16>(p, threads);
    default: return detail::unsupported("cpu: unsupported dtype");
  }
}

}  // namespace flashattn::cpu::FA_CPU_ISA
