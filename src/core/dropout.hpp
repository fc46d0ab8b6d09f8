// The dropout mask as a pure function of its coordinates, shared by the float64 reference, the CPU backend and
// the CUDA kernels: element (b, h, i, j) of a call with (seed, offset) is kept when word
// ((i >> 3) & 1) * 2 + (j & 1) of Philox4x32-10(counter = (j >> 1, ((i >> 4) << 3) | (i & 7), b * heads_q + h,
// offset_lo), key = (seed_lo, seed_hi ^ offset_hi)) is below (1 - p) * 2^32. b is the batch entry (varlen: the
// sequence), h the query head, i and j the query and key positions within that sequence. Kept probabilities are
// scaled by 1 / (1 - p). No state, no order: the backward regenerates the forward's mask, any tiling gives the
// same one, and nothing N x N is stored.
// Why this grouping: one Philox call serves the four elements {i, i + 8} x {j, j + 1} (i % 16 < 8, j even), which
// are exactly what one thread holds of a 16 x 8 tile in the accumulators of mma.sync m16n8k16 and wgmma m64nNk16
// with queries as rows; every word of every call is used.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace flashattn::detail {

struct PhiloxWords {
  uint32_t w[4];
};

// Philox4x32 with 10 rounds (Salmon et al., SC'11; the generator of cuRAND and of torch's CUDA dropout).
FA_HOST_DEVICE PhiloxWords philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u, kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c0, p1 = uint64_t(kMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    k0 += kWeyl0, k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

struct DropoutRule {
  uint64_t seed = 0, offset = 0;
  uint32_t threshold = 0;  // keep when the word is below it: floor((1 - p) * 2^32), saturated
  float keep_scale = 1.f;  // 1 / (1 - p)
  bool on = false;

  DropoutRule() = default;
  DropoutRule(float p, uint64_t seed_, uint64_t offset_) : seed(seed_), offset(offset_), on(p > 0.f) {
    const double keep = 1.0 - double(p);
    const double t = keep * 4294967296.0;
    threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : uint32_t(t);
    keep_scale = on ? float(1.0 / keep) : 1.f;
  }
  // The four words of the group holding element (i, j) of (batch entry b, query head h); bh = b * heads_q + h.
  FA_HOST_DEVICE PhiloxWords words(int64_t bh, int64_t i, int64_t j) const {
    return philox4x32_10(uint32_t(j >> 1), uint32_t(((i >> 4) << 3) | (i & 7)), uint32_t(bh), uint32_t(offset),
                         uint32_t(seed), uint32_t(seed >> 32) ^ uint32_t(offset >> 32));
  }
  // Which of the group's words element (i, j) draws.
  FA_HOST_DEVICE static int word_of(int64_t i, int64_t j) { return int(((i >> 3) & 1) * 2 + (j & 1)); }
  // The factor a word gives: 0 (dropped) or 1 / (1 - p).
  FA_HOST_DEVICE float keep(uint32_t word) const { return word < threshold ? keep_scale : 0.f; }
  // The factor of probability (b, h, i, j): 0 (dropped) or 1 / (1 - p); 1 without dropout.
  FA_HOST_DEVICE float factor(int64_t b, int64_t heads_q, int64_t h, int64_t i, int64_t j) const {
    if (!on) return 1.f;
    return keep(words(b * heads_q + h, i, j).w[word_of(i, j)]);
  }
};

}  // namespace flashattn::detail
