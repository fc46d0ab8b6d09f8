// Storage conversions and a vectorisable exp for the CPU backend. Written branch-free so that the compiler
// turns the tile loops that call them into SIMD code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "flashattn/flashattn.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace flashattn::cpu {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet bit forced so truncation cannot turn it into inf).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    // Subnormal (or zero): value = man * 2^-24, exact in float.
    float f = float(man) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal half
    float m = bits_to_float(a) * 16777216.f;              // value / 2^-24, exact scaling
    return uint16_t(sign | uint16_t(std::nearbyint(m)));  // current rounding mode: nearest even
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // round mantissa to 10 bits, nearest even
  return uint16_t(sign | uint16_t(((r >> 13) - (112u << 10)) & 0x7fffu));
}

// OCP e4m3fn (flashattn.h): bias 7, 3 mantissa bits, subnormals 2^-9 apart, max 448, NaN 0x7f / 0xff, no inf.
inline float e4m3_to_float(uint8_t x) {
  const uint32_t e = (x >> 3) & 0xfu, m = x & 7u;
  float v;
  if (e == 0xfu && m == 7u)
    v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0)
    v = float(m) * 0x1p-9f;
  else
    v = bits_to_float(((e + 120u) << 23) | (m << 20));  // 2^(e - 7) * (1 + m / 8)
  return (x & 0x80u) ? -v : v;
}

// Round to nearest even, saturating at +-448 (cvt.rn.satfinite); NaN -> 0x7f with the sign.
inline uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_to_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);          // >= 448 (and inf): the largest finite value
  if (a < 0x3c800000u) {                                       // below 2^-6: subnormal steps of 2^-9
    const float q = std::nearbyint(bits_to_float(a) * 512.f);  // current rounding mode: nearest even
    return uint8_t(sign | uint8_t(q));                         // q = 8 is the smallest normal's code
  }
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);  // mantissa to 3 bits, nearest even
  const uint32_t code = (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);
  return uint8_t(sign | (code > 0x7eu ? 0x7eu : code));
}

template <fa_dtype T>
struct Storage;
template <>
struct Storage<FA_FLOAT32> {
  using type = float;
  static float load(float x) { return x; }
  static float store(float x) { return x; }
};
template <>
struct Storage<FA_BFLOAT16> {
  using type = uint16_t;
  static float load(uint16_t x) { return bf16_to_float(x); }
  static uint16_t store(float x) { return float_to_bf16(x); }
};
template <>
struct Storage<FA_FLOAT16> {
  using type = uint16_t;
  static float load(uint16_t x) { return fp16_to_float(x); }
  static uint16_t store(float x) { return float_to_fp16(x); }
};

// Element `off` of a float32 / float16 / bfloat16 array whose dtype is known at run time only (the calls beside the
// attention: quantisation, the KV-cache append, the merge), as float and back.
inline float load_float(fa_dtype t, const void* base, int64_t off) {
  switch (t) {
    case FA_FLOAT16: return fp16_to_float(static_cast<const uint16_t*>(base)[off]);
    case FA_BFLOAT16: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    default: return static_cast<const float*>(base)[off];
  }
}
inline void store_float(fa_dtype t, void* base, int64_t off, float x) {
  switch (t) {
    case FA_FLOAT16: static_cast<uint16_t*>(base)[off] = float_to_fp16(x); break;
    case FA_BFLOAT16: static_cast<uint16_t*>(base)[off] = float_to_bf16(x); break;
    default: static_cast<float*>(base)[off] = x;
  }
}

// Rounds a float to the precision of T and back (emulates storing a low-precision intermediate).
template <fa_dtype T>
inline float round_to(float x) {
  return Storage<T>::load(Storage<T>::store(x));
}

// 2^n for integral-valued n in [-126, 127], built from the exponent bits (float or a GCC float vector).
template <class T>
inline T pow2_integral(T n) {
  if constexpr (std::is_same_v<T, float>) {
    return bits_to_float(uint32_t(int32_t(n) + 127) << 23);
  } else {
    typedef int32_t Bits __attribute__((vector_size(sizeof(T))));
    Bits b = (__builtin_convertvector(n, Bits) + 127) << 23;
    T r;
    std::memcpy(&r, &b, sizeof r);
    return r;
  }
}

// 2^f for f in [-0.5, 0.5]: the Taylor coefficients of e^(f ln2), degree 6, by Horner (exp_nonpositive's both forms).
template <class T>
inline T exp2_reduced(T f) {
  T p = T{} + 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  return p * f + 1.0f;
}

// exp(x) for x <= 0 (softmax arguments after max subtraction), relative error within 1.5 (4 + |x|) fp32 ulps
// (the rounding of x log2(e): as if x were off by an ulp; tests/test_numeric.cpp), for float and for the CPU
// kernels' float vectors (one definition, so scalar and vector paths agree bit for bit). Branch-free: range
// reduction to 2^n * 2^f, f in [-0.5, 0.5], degree-6 polynomial for 2^f. exp(-inf) = 0 exactly (masked scores),
// NaN propagates.
template <class T>
inline T exp_nonpositive(T x) {
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 64) {
    // 16-float vectors of the AVX-512 builds: the same value for every x (NaN gives NaN) in 12 instructions instead
    // of about 20. vmaxps returns its second operand when one is NaN, so the clamp lets NaN through (no restoring
    // select); vrndscaleps rounds to nearest even as adding and subtracting 1.5 * 2^23 does for |t| < 2^22; vscalefps
    // is p * 2^n rounded once, as the product with pow2_integral(n) for n >= -126; the masked form zeroes t < -126
    // (and keeps unordered lanes, NaN).
    const __m512 t = _mm512_mul_ps(reinterpret_cast<__m512&>(x), _mm512_set1_ps(1.44269504088896341f));
    // The all-lanes masked forms: the plain ones pass _mm512_undefined_ps, which GCC 12 reports as uninitialised.
    const __m512 tc = _mm512_mask_max_ps(t, 0xffff, _mm512_set1_ps(-126.f), t);
    const __m512 n = _mm512_mask_roundscale_ps(tc, 0xffff, tc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 fv = _mm512_sub_ps(tc, n);
    const T f = reinterpret_cast<const T&>(fv);
    const T p = exp2_reduced(f);
    const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.f), _CMP_NLT_UQ);
    const __m512 r = _mm512_maskz_scalef_ps(keep, reinterpret_cast<const __m512&>(p), n);
    return reinterpret_cast<const T&>(r);
  }
#endif
  const T zero{};
  const T k_min = zero + -126.f;        // 2^-126: smaller results flush to 0
  const T k_round = zero + 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest integer
  T t = x * 1.44269504088896341f;       // log2(e)
  T tc = t >= k_min ? t : k_min;        // also maps NaN to k_min; the NaN is restored below
  T n = (tc + k_round) - k_round;
  T f = tc - n;
  const T p = exp2_reduced(f);
  T r = p * pow2_integral(n);
  r = t < k_min ? zero : r;
  return x != x ? x : r;
}

// tanh: above |x| = 1 through exp_nonpositive, tanh|x| = (1 - e^-2|x|) / (1 + e^-2|x|); below it an odd
// polynomial (a least-squares fit of tanh(a)/a in a^2 on [0, 1], relative error 4.8e-9 before rounding), since
// 1 - e^-2|x| cancels there: the quotient alone had 1e-7 absolute error, 1.4e-2 relative at |x| = 1e-6, which as a
// softcapped logit's error cost the fp32 backward its 2x bound on rare inputs. Both are evaluated and one selected
// (branch-free for the vector types); tests/test_numeric.cpp bounds the error.
template <class T>
inline T tanh_fast(T x) {
  T a = x < 0.f ? -x : x;
  T e = exp_nonpositive(-2.f * a);
  T big = (1.f - e) / (1.f + e);
  T a2 = a * a;
  T p = a2 * -3.5964367136e-4f + 2.3058575589e-3f;
  p = p * a2 + -7.9528251141e-3f;
  p = p * a2 + 2.1491693823e-2f;
  p = p * a2 + -5.3881761617e-2f;
  p = p * a2 + 1.3332380972e-1f;
  p = p * a2 + -3.3333297830e-1f;
  T small = a + a * (a2 * p);
  T t = a < 1.f ? small : big;
  return x < 0.f ? -t : t;
}

}  // namespace flashattn::cpu
