// Register-blocked fp32 tile products for the CPU backend: C[M][N] (+)= A[M][K] * B[K][N], all row-major
// scratch tiles with N a multiple of the vector width. GCC vector extensions lower to AVX-512, AVX2 or SSE
// depending on the flags of the translation unit that includes this (kernels.cpp is built once per ISA).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(FA_CPU_BF16_DOT)
#include <immintrin.h>
#endif

#if !defined(FA_CPU_VEC_BYTES) || !defined(FA_CPU_ISA)
#error "tile_gemm.hpp is included only by the per-ISA kernel builds (FA_CPU_ISA, FA_CPU_VEC_BYTES)"
#endif

// Everything here lives in the ISA's namespace: the same inline function compiled for different vector
// widths must not be merged by the linker into one (it would silently pick the narrowest build).
namespace flashattn::cpu::FA_CPU_ISA {

constexpr int kVecFloats = FA_CPU_VEC_BYTES / 4;
// Accumulators kept in registers: kRows x kMaxVecs vectors. 32 vector registers on AVX-512 hold 4x4 plus
// operands; 16 on AVX2/SSE hold 4x2.
constexpr int kRows = 4;
constexpr int kMaxVecs = FA_CPU_VEC_BYTES == 64 ? 4 : 2;

typedef float vfloat __attribute__((vector_size(FA_CPU_VEC_BYTES)));
typedef float vfloat_u __attribute__((vector_size(FA_CPU_VEC_BYTES), aligned(4)));

inline vfloat vload(const float* p) { return *reinterpret_cast<const vfloat_u*>(p); }
inline void vstore(float* p, vfloat v) { *reinterpret_cast<vfloat_u*>(p) = v; }
// x - 0, not 0 + x: 0 + x is not x for x = -0, so that form kept a scalar add in front of every broadcast (on the
// FMA ports, in the GEMMs' inner loop); x - 0 is x for every x, and compiles to the broadcast alone.
inline vfloat vbroadcast(float x) { return x - vfloat{}; }

enum class ALayout { kRowMajor, kTransposed };  // A[m][k] at A[m*lda + k], or at A[k*lda + m]

template <int NV, bool kAccumulate, ALayout kA>
inline __attribute__((always_inline)) void micro_tile(const float* __restrict A, int64_t lda, const float* __restrict B,
                                                      int64_t ldb, int K, float* __restrict C, int64_t ldc) {
  vfloat acc[kRows][NV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? vload(C + r * ldc + v * kVecFloats) : vfloat{};
  for (int k = 0; k < K; ++k) {
    vfloat b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + v * kVecFloats);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      vfloat a = vbroadcast(kA == ALayout::kRowMajor ? A[r * lda + k] : A[k * lda + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + v * kVecFloats, acc[r][v]);
}

// C[M][N] (+)= A[M][K] * B[K][N]. M a multiple of kRows, N a multiple of kVecFloats.
template <bool kAccumulate, ALayout kA = ALayout::kRowMajor>
inline void gemm(int M, int N, int K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
  for (int m = 0; m < M; m += kRows) {
    const float* a = kA == ALayout::kRowMajor ? A + m * lda : A + m;
    for (int n = 0; n < N; n += kMaxVecs * kVecFloats) {
      const int nv = (N - n) / kVecFloats;
      const float* b = B + n;
      float* c = C + m * ldc + n;
      if (nv >= kMaxVecs) {
        micro_tile<kMaxVecs, kAccumulate, kA>(a, lda, b, ldb, K, c, ldc);
      } else if constexpr (kMaxVecs == 4) {
        if (nv == 3)
          micro_tile<3, kAccumulate, kA>(a, lda, b, ldb, K, c, ldc);
        else if (nv == 2)
          micro_tile<2, kAccumulate, kA>(a, lda, b, ldb, K, c, ldc);
        else
          micro_tile<1, kAccumulate, kA>(a, lda, b, ldb, K, c, ldc);
      } else {
        micro_tile<1, kAccumulate, kA>(a, lda, b, ldb, K, c, ldc);
      }
    }
  }
}

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

#if defined(FA_CPU_BF16_DOT)
// bf16 products with fp32 sums (AVX512-BF16's vdpbf16ps: each fp32 lane adds a0*b0 + a1*b1 of a bf16 pair, the
// products exact), twice the fp32 FMA rate. C[M][N] (+)= A[M][K] * B[K][N] for bf16 A rows (A[m*lda + k], k
// pairs adjacent: lda and K even) and B packed in pairs along K: Bp[(k/2)*ldb + n] holds (B[k][n], B[k+1][n]) as
// one 32-bit word (pack_pairs_t builds it from rows of B^T). M a multiple of kRows, N of 16.
template <int NV, bool kAccumulate>
inline __attribute__((always_inline)) void micro_tile_bf16(const uint16_t* __restrict A, int64_t lda,
                                                           const uint32_t* __restrict Bp, int64_t ldb, int K,
                                                           float* __restrict C, int64_t ldc) {
  __m512 acc[kRows][NV];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = kAccumulate ? _mm512_loadu_ps(C + r * ldc + v * 16) : _mm512_setzero_ps();
  for (int k2 = 0; k2 < K / 2; ++k2) {
    __m512bh b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(Bp + k2 * ldb + v * 16);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      uint32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * k2, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(pair));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + v * 16, acc[r][v]);
}

template <bool kAccumulate>
inline void gemm_bf16_avx512(int M, int N, int K, const uint16_t* A, int64_t lda, const uint32_t* Bp, int64_t ldb,
                             float* C, int64_t ldc) {
  for (int m = 0; m < M; m += kRows)
    for (int n = 0; n < N; n += 64) {
      const int nv = (N - n) / 16;
      if (nv >= 4)
        micro_tile_bf16<4, kAccumulate>(A + m * lda, lda, Bp + n, ldb, K, C + m * ldc + n, ldc);
      else if (nv == 3)
        micro_tile_bf16<3, kAccumulate>(A + m * lda, lda, Bp + n, ldb, K, C + m * ldc + n, ldc);
      else if (nv == 2)
        micro_tile_bf16<2, kAccumulate>(A + m * lda, lda, Bp + n, ldb, K, C + m * ldc + n, ldc);
      else
        micro_tile_bf16<1, kAccumulate>(A + m * lda, lda, Bp + n, ldb, K, C + m * ldc + n, ldc);
    }
}

#if defined(FA_CPU_AMX)
// AMX-BF16 (Sapphire Rapids and later): the same product on the tile unit, 16 x 16 fp32 C tiles from 16 x 32 bf16
// A tiles and 16 x 16 pair tiles of B, which is exactly Bp's layout (a row of Bp is a row of k pairs). Tile registers:
// C blocks of 2 x 2 tiles in 0-3, A in 4-5, B in 6-7.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// The tile configuration is per thread, and another library (oneDNN in torch) may leave a different one on the same
// thread between our calls: every parallel region that calls gemm_bf16 loads ours first, on each of its threads
// (once per region, not per GEMM: 4-5% of the bf16 forward at 1k-4k, 2 threads; nothing but our code runs on a thread
// inside the region). Without it the first tile instruction faults.
inline void amx_configure() {
  static const AmxTileConfig config;
  _tile_loadconfig(&config);
}

// A block of kMT x kNT C tiles (16 x 16 each) over K32 (a multiple of 32) of the k range.
template <int kMT, int kNT, bool kAccumulate>
inline __attribute__((always_inline)) void amx_block(const uint16_t* A, int64_t lda, const uint32_t* Bp, int64_t ldb,
                                                     int K32, float* C, int64_t ldc) {
  const int64_t sa = lda * 2, sb = ldb * 4, sc = ldc * 4;  // row strides in bytes
  if constexpr (kAccumulate) {
    _tile_loadd(0, C, sc);
    if constexpr (kNT == 2) _tile_loadd(1, C + 16, sc);
    if constexpr (kMT == 2) _tile_loadd(2, C + 16 * ldc, sc);
    if constexpr (kMT == 2 && kNT == 2) _tile_loadd(3, C + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (kNT == 2) _tile_zero(1);
    if constexpr (kMT == 2) _tile_zero(2);
    if constexpr (kMT == 2 && kNT == 2) _tile_zero(3);
  }
  for (int k = 0; k < K32; k += 32) {
    _tile_loadd(4, A + k, sa);
    if constexpr (kMT == 2) _tile_loadd(5, A + 16 * lda + k, sa);
    _tile_loadd(6, Bp + (k / 2) * ldb, sb);
    if constexpr (kNT == 2) _tile_loadd(7, Bp + (k / 2) * ldb + 16, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kNT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kMT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kMT == 2 && kNT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, C, sc);
  if constexpr (kNT == 2) _tile_stored(1, C + 16, sc);
  if constexpr (kMT == 2) _tile_stored(2, C + 16 * ldc, sc);
  if constexpr (kMT == 2 && kNT == 2) _tile_stored(3, C + 16 * ldc + 16, sc);
}

// gemm_bf16_avx512's contract, on a thread whose parallel region called amx_configure. Rows in whole tiles (16) and k
// in whole tiles (32) go to the tile unit; the rest (the k tail of head dims that are no multiple of 32, rows of short
// blocks) to vdpbf16ps, accumulated onto it.
template <bool kAccumulate>
inline void gemm_bf16(int M, int N, int K, const uint16_t* A, int64_t lda, const uint32_t* Bp, int64_t ldb, float* C,
                      int64_t ldc) {
  const int m16 = M / 16 * 16, k32 = K / 32 * 32;
  if (m16 == 0 || k32 == 0) return gemm_bf16_avx512<kAccumulate>(M, N, K, A, lda, Bp, ldb, C, ldc);
  for (int m = 0; m < m16; m += 32) {
    const bool two_m = m + 32 <= m16;
    for (int n = 0; n < N; n += 32) {
      const bool two_n = n + 32 <= N;
      const uint16_t* a = A + int64_t(m) * lda;
      const uint32_t* b = Bp + n;
      float* c = C + int64_t(m) * ldc + n;
      if (two_m && two_n)
        amx_block<2, 2, kAccumulate>(a, lda, b, ldb, k32, c, ldc);
      else if (two_m)
        amx_block<2, 1, kAccumulate>(a, lda, b, ldb, k32, c, ldc);
      else if (two_n)
        amx_block<1, 2, kAccumulate>(a, lda, b, ldb, k32, c, ldc);
      else
        amx_block<1, 1, kAccumulate>(a, lda, b, ldb, k32, c, ldc);
    }
  }
  if (k32 < K) gemm_bf16_avx512<true>(m16, N, K - k32, A + k32, lda, Bp + int64_t(k32 / 2) * ldb, ldb, C, ldc);
  if (m16 < M)
    gemm_bf16_avx512<kAccumulate>(M - m16, N, K, A + int64_t(m16) * lda, lda, Bp, ldb, C + int64_t(m16) * ldc, ldc);
}
#else
template <bool kAccumulate>
inline void gemm_bf16(int M, int N, int K, const uint16_t* A, int64_t lda, const uint32_t* Bp, int64_t ldb, float* C,
                      int64_t ldc) {
  gemm_bf16_avx512<kAccumulate>(M, N, K, A, lda, Bp, ldb, C, ldc);
}
#endif

// Bp[(k/2)*N + n] = (R[n][k], R[n][k+1]) for the rows R[n] (n < valid, bf16, k < K) of B^T, zero for n >= valid.
// The element offsets of rows[0 .. lanes) (lanes <= 16) from rows[0] as the int32 indices of a 16-lane gather (lanes
// past `lanes` 0), or false when one does not fit (rows on far pages: the callers' scalar loops take them).
inline bool gather_offsets16(const uint16_t* const* rows, int lanes, __m512i* offsets) {
  alignas(64) int32_t idx[16] = {};
  for (int i = 0; i < lanes; ++i) {
    const int64_t d = rows[i] - rows[0];
    if (d < -(int64_t(1) << 30) || d >= (int64_t(1) << 30)) return false;
    idx[i] = int32_t(d);
  }
  *offsets = _mm512_load_si512(idx);
  return true;
}

inline void pack_pairs_t(const uint16_t* const* rows, int valid, int N, int K, uint32_t* Bp) {
  // 16 rows at a time: one gather of their pair k2, rows past `valid` masked to zero.
  int n0 = 0;
  for (; n0 + 16 <= N && n0 < valid; n0 += 16) {
    const int lanes = valid - n0 < 16 ? valid - n0 : 16;
    __m512i offsets;
    if (!gather_offsets16(rows + n0, lanes, &offsets)) break;
    const __mmask16 live = __mmask16((1u << lanes) - 1u);
    for (int k2 = 0; k2 < K / 2; ++k2)
      _mm512_storeu_si512(Bp + int64_t(k2) * N + n0,
                          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, rows[n0] + 2 * k2, 2));
  }
  for (int n = n0; n < N; ++n) {
    if (n < valid) {
      for (int k2 = 0; k2 < K / 2; ++k2) {
        uint32_t pair;
        std::memcpy(&pair, rows[n] + 2 * k2, 4);
        Bp[int64_t(k2) * N + n] = pair;
      }
    } else {
      for (int k2 = 0; k2 < K / 2; ++k2) Bp[int64_t(k2) * N + n] = 0;
    }
  }
}
#endif

}  // namespace flashattn::cpu::FA_CPU_ISA
