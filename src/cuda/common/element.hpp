// The CUTLASS element type of a storage dtype, for the CUDA kernel families (fp16/bf16 only).
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

}  // namespace flashattn::cuda
