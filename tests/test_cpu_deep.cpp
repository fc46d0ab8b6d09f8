// Deep tier: larger shapes and randomly drawn feature combinations (fixed seeds, so failures reproduce).
#include <gtest/gtest.h>

#include <random>

#include "attention_case.hpp"

namespace flashattn::testing {
namespace {

TEST(CpuDeep, LargeShapes) {
  for (auto [sq, sk] : {std::pair<int, int>{1023, 1024}, {1024, 1023}, {2049, 777}}) {
    Case c;
    c.sq = sq;
    c.sk = sk;
    c.causal = true;
    c.d = 128;
    expect_matches_reference(c, true);
  }
  Case c;
  c.sq = c.sk = 300;
  c.d = 256;
  c.hq = 4;
  c.hkv = 2;
  expect_matches_reference(c, true);
}

TEST(CpuDeep, RandomFeatureCombinations) {
  std::mt19937 rng(20261130);
  auto pick = [&](int n) { return int(rng() % unsigned(n)); };
  for (int trial = 0; trial < 40; ++trial) {
    Case c;
    c.seed = uint64_t(trial) + 100;
    const fa_dtype dtypes[] = {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16};
    c.dtype = dtypes[pick(3)];
    const int dims[] = {8, 24, 64, 72, 96, 128, 160, 256};
    c.d = dims[pick(8)];
    c.dv = pick(3) == 0 ? dims[pick(8)] : 0;
    const int groups[] = {1, 2, 3, 4};
    c.hkv = 1 + pick(2);
    c.hq = c.hkv * groups[pick(4)];
    c.causal = pick(2) == 0;
    c.top_left = pick(2) == 0;
    if (pick(3) == 0) c.wl = pick(80);
    if (!c.causal && pick(3) == 0) c.wr = pick(80);
    if (pick(4) == 0) c.softcap = 1.f + float(pick(30));
    c.alibi = pick(4) == 0 ? Alibi::kHeads : Alibi::kNone;
    c.head_pad = pick(3) == 0 ? 8 : 0;
    if (pick(3) == 0) {
      const int n = 1 + pick(4);
      for (int b = 0; b < n; ++b) {
        c.lens_q.push_back(pick(200));
        c.lens_k.push_back(pick(260));
      }
    } else {
      c.batch = 1 + pick(3);
      c.sq = 1 + pick(260);
      c.sk = 1 + pick(260);
    }
    expect_matches_reference(c, true);
  }
}

}  // namespace
}  // namespace flashattn::testing
