// FP8 inputs' dequantisation factors (flashattn.h, FP8), as the validation normalises them: read by the reference,
// the CPU backend and the sm90 kernels alike.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace flashattn::detail {

// The factor of head h of the tensor (q: query heads; k, v: KV heads) in batch entry b is data[b * batch + (h /
// head_div) * head]; head_div is the group size for a q_descale given per KV head, else 1.
struct Descale {
  const float* data = nullptr;  // absent: 1
  int64_t batch = 0, head = 0, head_div = 1;
  FA_HOST_DEVICE float at(int64_t b, int64_t h) const { return data ? data[b * batch + (h / head_div) * head] : 1.f; }
};

}  // namespace flashattn::detail
