// The CUTLASS element type of a storage dtype, for the CUDA kernel families (fp16/bf16; e4m3 for the sm90 FP8
// forward).
#pragma once

#include <cutlass/numeric_types.h>

#include "flashattn/flashattn.h"

namespace flashattn::cuda {

template <fa_dtype kDtype>
struct ElementOf;
template <>
struct ElementOf<FA_FLOAT16> {
  using type = cutlass::half_t;
};
template <>
struct ElementOf<FA_BFLOAT16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct ElementOf<FA_FLOAT8_E4M3> {
  using type = cutlass::float_e4m3_t;
};

}  // namespace flashattn::cuda
