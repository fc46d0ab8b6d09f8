// GPU correctness of fa_forward on CUDA tensors against the float64 reference (src/cpu/reference.hpp).
// Every case: fresh random inputs, outputs and LSE poisoned with NaN before the run, then the suites' one rule
// (docs/testing.md, reference::Comparison) per tensor over the checked rows:
//   max |ours - exact| <= 2 * max |plain low-precision (Rounding::kStorage) - exact| + one storage ulp at the
//   largest reference magnitude   (NaN never passes)
// on every row (small problems) or on sampled rows that include each sequence's first and last rows; a row with
// no visible key must hold exactly 0 and LSE -inf.
// Skips (GTEST_SKIP) when no CUDA device is present, so the binary is safe in CPU-only CI.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cpu/numeric.hpp"
#include "cpu/reference.hpp"
#include "cuda/sm80/tiles.hpp"
#include "cuda/sm90/tiles.hpp"
#include "flashattn/flashattn.h"
#include "gpu_support.hpp"

namespace {

using namespace flashattn::gpu_testing;
using flashattn::detail::Problem;
namespace ref = flashattn::reference;

// Problems with more (head, row) pairs than this are checked on sampled rows.
constexpr int64_t kFullCheckRows = 3000;
constexpr int kSampledRows = 200;

std::string case_name(const testing::TestParamInfo<Case>& i) { return i.param.name; }

fa_tensor vec_i32(void* data, fa_device dev, int64_t n) {
  fa_tensor t = fa_make_tensor(data, FA_INT32, dev, 1, &n);
  return t;
}

// What the rows say beyond the tolerance: rows that broke a semantic rule (NaN, a fully masked row not 0 / -inf).
struct BadRows {
  int64_t rows = 0, bad = 0;
  std::string first;
};

void run_case(const Case& c) {
  ASSERT_EQ(fields_not_built_here(c), "") << "the GPU runners do not build these fields";
  CaseGeometry geo(c);  // non-const: the host reference reads cu_seqlens through void*
  auto& [varlen, batch, cu_q, cu_k, rows_q, rows_k, nb] = geo;
  const int64_t pad = c.row_pad, dim_v = c.value_dim();
  const size_t nq = size_t(nb * rows_q * (c.hq * c.d + pad)), nk = size_t(nb * rows_k * (c.hkv * c.d + pad));
  const size_t nv = size_t(nb * rows_k * (c.hkv * dim_v + pad)), no = size_t(nb * rows_q * (c.hq * dim_v + pad));
  const size_t nl = size_t(nb * c.hq * rows_q);

  std::mt19937 rng(std::hash<std::string>{}(c.name));
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n, float gain) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = to_storage(c.dtype, gain * normal(rng));
    return h;
  };
  std::vector<uint16_t> hq = fill(nq, c.q_gain), hk = fill(nk, 1.f), hv = fill(nv, 1.f);
  if (c.nan_past_used) {
    constexpr uint16_t kNaN = 0xffff;  // all-ones: NaN in fp16 and bf16
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t first_row = varlen ? cu_k[size_t(b)] : b * rows_k;
      const int64_t len = varlen ? c.lens_k[size_t(b)] : rows_k;
      for (int64_t j = c.seqused_k[size_t(b)]; j < len; ++j)
        for (int64_t h = 0; h < c.hkv; ++h) {
          std::fill_n(hk.begin() + (first_row + j) * (c.hkv * c.d + pad) + h * c.d, c.d, kNaN);
          std::fill_n(hv.begin() + (first_row + j) * (c.hkv * dim_v + pad) + h * dim_v, dim_v, kNaN);
        }
    }
  }
  std::vector<float> sink_logits;
  if (c.sinks) {
    std::uniform_real_distribution<float> u(-2.f, 4.f);
    sink_logits.resize(size_t(c.hq));
    for (auto& s : sink_logits) s = u(rng);
  }
  std::vector<float> slopes;
  if (c.alibi != Alibi::kNone) {
    std::uniform_real_distribution<float> u(0.05f, 0.5f);
    slopes.resize(size_t((c.alibi == Alibi::kBatch ? batch : 1) * c.hq));
    for (auto& s : slopes) s = u(rng);
  }

  DeviceBuffer<uint16_t> dq(nq), dk(nk), dv(nv), dout(no);
  DeviceBuffer<float> dlse(nl), dslopes(slopes.size()), dsinks(sink_logits.size());
  DeviceBuffer<int32_t> dcu_q(cu_q.size()), dcu_k(cu_k.size()), dused(c.seqused_k.size());
  ASSERT_TRUE(dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr);
  dq.upload(hq);
  dk.upload(hk);
  dv.upload(hv);
  if (!slopes.empty()) dslopes.upload(slopes);
  if (!sink_logits.empty()) dsinks.upload(sink_logits);
  if (varlen) {
    dcu_q.upload(cu_q);
    dcu_k.upload(cu_k);
  }
  std::vector<int32_t> used(c.seqused_k.begin(), c.seqused_k.end());
  if (!used.empty()) dused.upload(used);
  std::vector<uint64_t> host_rng = {c.dropout_seed, c.dropout_offset};
  DeviceBuffer<uint64_t> drng(2);
  drng.upload(host_rng);
  // Poison: all-ones bits are NaN in fp16, bf16 and fp32.
  ASSERT_EQ(cudaMemset(dout.ptr, 0xff, no * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse.ptr, 0xff, nl * sizeof(float)), cudaSuccess);

  auto make_params = [&](fa_device dev, void* q, void* k, void* v, void* out, void* lse, void* cuq, void* cuk,
                         void* usedk, void* sl, void* sinks) {
    fa_fwd_params p{};
    p.attn = fa_attention_default();
    p.attn.q = view(q, c.dtype, dev, varlen, batch, rows_q, c.hq, c.d, pad);
    p.attn.k = view(k, c.dtype, dev, varlen, batch, rows_k, c.hkv, c.d, pad);
    p.attn.v = view(v, c.dtype, dev, varlen, batch, rows_k, c.hkv, dim_v, pad);
    p.out = view(out, c.dtype, dev, varlen, batch, rows_q, c.hq, dim_v, pad);
    if (varlen) {
      int64_t s[2] = {c.hq, rows_q};
      p.lse = fa_make_tensor(lse, FA_FLOAT32, dev, 2, s);
      p.attn.cu_seqlens_q = vec_i32(cuq, dev, int64_t(cu_q.size()));
      p.attn.cu_seqlens_k = vec_i32(cuk, dev, int64_t(cu_k.size()));
      p.attn.max_seqlen_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
      p.attn.max_seqlen_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
    } else {
      int64_t s[3] = {batch, c.hq, rows_q};
      p.lse = fa_make_tensor(lse, FA_FLOAT32, dev, 3, s);
    }
    if (!c.seqused_k.empty()) p.attn.seqused_k = vec_i32(usedk, dev, int64_t(c.seqused_k.size()));
    p.attn.causal = c.causal;
    p.attn.causal_alignment = c.top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
    p.attn.window_left = c.wl;
    p.attn.window_right = c.wr;
    p.attn.softcap = c.softcap;
    p.attn.dropout_p = c.dropout_p;
    p.attn.dropout_seed = c.dropout_seed;
    p.attn.dropout_offset = c.dropout_offset;
    if (c.dropout_rng) {  // (seed, offset) as an int64 tensor where the call runs
      int64_t two = 2;
      p.attn.dropout_rng = fa_make_tensor(dev == FA_DEVICE_CUDA ? static_cast<void*>(drng.ptr) : host_rng.data(),
                                          FA_INT64, dev, 1, &two);
      p.attn.dropout_seed = p.attn.dropout_offset = 0;
    }
    if (c.sinks) p.attn.sinks = fa_make_tensor(sinks, FA_FLOAT32, dev, 1, &c.hq);
    if (c.alibi == Alibi::kHeads) p.attn.alibi_slopes = fa_make_tensor(sl, FA_FLOAT32, dev, 1, &c.hq);
    if (c.alibi == Alibi::kBatch) {
      int64_t s[2] = {batch, c.hq};
      p.attn.alibi_slopes = fa_make_tensor(sl, FA_FLOAT32, dev, 2, s);
    }
    return p;
  };

  fa_fwd_params gp = make_params(FA_DEVICE_CUDA, dq.ptr, dk.ptr, dv.ptr, dout.ptr, dlse.ptr, dcu_q.ptr, dcu_k.ptr,
                                 dused.ptr, dslopes.ptr, dsinks.ptr);
  fa_exec exec = fa_exec_default();
  exec.backend = c.backend;
  exec.num_splits = c.num_splits;
  const fa_status status = fa_forward(&gp, &exec);
  if (status == FA_ERROR_UNSUPPORTED && c.backend == FA_BACKEND_CUDA_SM90 && sm90_unavailable_message(fa_last_error()))
    GTEST_SKIP() << fa_last_error();
  ASSERT_EQ(status, FA_OK) << fa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (backend_label(c.backend) != nullptr) EXPECT_STREQ(fa_backend_name(&gp, &exec), backend_label(c.backend));
  std::vector<uint16_t> out = dout.download();
  std::vector<float> lse = dlse.download();

  // The reference reads host memory: the same call described with host tensors, validated the CPU way.
  std::vector<uint16_t> host_out(no);
  std::vector<float> host_lse(nl);
  fa_fwd_params hp = make_params(FA_DEVICE_CPU, hq.data(), hk.data(), hv.data(), host_out.data(), host_lse.data(),
                                 cu_q.data(), cu_k.data(), used.data(), slopes.data(), sink_logits.data());
  Problem prob;
  const flashattn::detail::Requirements cpu_req{0, 1, true, "cpu"};
  auto e = flashattn::detail::validate(hp.attn, hp.out, hp.lse, nullptr, nullptr, nullptr, nullptr,
                                       flashattn::detail::Direction::kForward, cpu_req, varlen ? cu_q.data() : nullptr,
                                       varlen ? cu_k.data() : nullptr, used.empty() ? nullptr : used.data(), &prob);
  ASSERT_TRUE(e.ok()) << e.message;

  // Rows to check.
  struct Row {
    int64_t b, h, i;
  };
  std::vector<Row> rows;
  const bool full = c.hq * rows_q <= kFullCheckRows;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lq = prob.len_q(b);
    for (int64_t h = 0; h < c.hq; ++h) {
      if (full) {
        for (int64_t i = 0; i < lq; ++i) rows.push_back({b, h, i});
      } else if (lq > 0) {
        rows.push_back({b, h, 0});
        rows.push_back({b, h, lq - 1});
      }
    }
  }
  if (!full) {
    std::uniform_int_distribution<int64_t> pick_b(0, batch - 1), pick_h(0, c.hq - 1);
    for (int s = 0; s < kSampledRows; ++s) {
      int64_t b = pick_b(rng);
      if (prob.len_q(b) == 0) continue;
      rows.push_back({b, pick_h(rng), std::uniform_int_distribution<int64_t>(0, prob.len_q(b) - 1)(rng)});
    }
  }

  // The float64 reference dominates the run time: rows are independent, so they run in parallel.
  const int64_t n_rows = int64_t(rows.size());
  std::vector<double> exact_all(static_cast<size_t>(n_rows * dim_v)), plain_all(static_cast<size_t>(n_rows * dim_v));
  std::vector<double> lse_exact_all(static_cast<size_t>(n_rows)), lse_plain_all(static_cast<size_t>(n_rows));
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t k = 0; k < n_rows; ++k) {
    const Row& r = rows[size_t(k)];
    ref::forward_row(prob, ref::Rounding::kExact, r.b, r.h, r.i, &exact_all[size_t(k * dim_v)],
                     &lse_exact_all[size_t(k)]);
    ref::forward_row(prob, ref::Rounding::kStorage, r.b, r.h, r.i, &plain_all[size_t(k * dim_v)],
                     &lse_plain_all[size_t(k)]);
  }
  // The LSE is fp32 whatever the inputs: its floor is fp32's.
  Comparison out_cmp(c.dtype), lse_cmp(FA_FLOAT32);
  BadRows bad;
  for (int64_t k = 0; k < n_rows; ++k) {
    const Row& r = rows[size_t(k)];
    const double* exact = &exact_all[size_t(k * dim_v)];
    const double* plain = &plain_all[size_t(k * dim_v)];
    const double lse_exact = lse_exact_all[size_t(k)], lse_plain = lse_plain_all[size_t(k)];
    const int64_t g = varlen ? cu_q[size_t(r.b)] + r.i : r.i;
    const int64_t out_off = (varlen ? g : r.b * rows_q + g) * (c.hq * dim_v + pad) + r.h * dim_v;
    const int64_t lse_off = varlen ? r.h * rows_q + g : (r.b * c.hq + r.h) * rows_q + g;
    bool row_ok = true;
    std::string why;
    bool row_nonzero = false;
    for (int64_t col = 0; col < dim_v; ++col) {
      const double ours = from_storage(c.dtype, out[size_t(out_off + col)]);
      if (std::isnan(ours)) row_ok = false, why = "NaN output";
      row_nonzero |= ours != 0;
      out_cmp.add(ours, exact[size_t(col)], plain[size_t(col)]);
    }
    const double lo = lse[size_t(lse_off)];
    lse_cmp.add(lo, lse_exact, lse_plain);
    if (std::isinf(lse_exact)) {  // no visible key: exact values, not merely within the tolerance
      if (!(std::isinf(lo) && lo < 0))
        row_ok = false, why = "fully masked row must have lse -inf, got " + std::to_string(lo);
      if (row_nonzero) row_ok = false, why = "fully masked row must be 0";
    } else if (std::isnan(lo)) {
      row_ok = false, why = "NaN lse";
    }
    ++bad.rows;
    if (!row_ok) {
      ++bad.bad;
      if (bad.first.empty())
        bad.first = "b" + std::to_string(r.b) + " h" + std::to_string(r.h) + " i" + std::to_string(r.i) + ": " + why;
    }
  }
  // The plain error is the worst over the checked rows (as the FlashAttention tests take it per tensor).
  EXPECT_EQ(bad.bad, 0) << bad.first;
  EXPECT_TRUE(out_cmp.passed()) << "out: " << out_cmp.summary() << " over " << bad.rows << " rows";
  EXPECT_TRUE(lse_cmp.passed()) << "lse: " << lse_cmp.summary();
  testing::Test::RecordProperty("out_err", std::to_string(out_cmp.max_err()));
  testing::Test::RecordProperty("out_plain_err", std::to_string(out_cmp.plain_max_err()));
}

// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> forward_cases() {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 17}, {239, 1}, {113, 203}, {1023, 1024}, {1024, 1023}};
  const int64_t hdims[] = {64, 128, 256, 72, 128, 64};
  const MaskKind masks[] = {{"none", false, false, -1, -1},
                            {"causal_br", true, false, -1, -1},
                            {"causal_tl", true, true, -1, -1},
                            {"window", false, false, 37, 5},
                            {"window_left", true, true, 64, -1},
                            {"window_right", false, false, -1, 3}};
  std::vector<Case> v = shape_mask_grid(shapes, hdims, masks);
  // Every head dim, both dtypes' most common masks.
  for (int64_t d : {8, 32, 64, 72, 96, 120, 128, 160, 192, 256}) {
    for (bool causal : {false, true}) {
      Case c;
      c.sq = 200, c.sk = 333, c.d = c.dv = d, c.causal = causal;
      c.name = "hdim" + std::to_string(d) + (causal ? "_causal" : "_full");
      v.push_back(c);
    }
  }
  auto add = [&](Case c) { v.push_back(c); };
  // Above d128 the unmasked sm80 tile depends on the key length (fwd_compact: compact up to kShortKeys keys, which
  // the shapes above cover): the long-key tile, plain and padded.
  for (int64_t d : {256, 200}) {
    Case c; c.sq = 150, c.sk = 1500, c.d = c.dv = d; c.name = "d" + std::to_string(d) + "_long_keys"; add(c);
  }
  // sm90: sequences up to fwd_short_seqlen / fwd_narrow_seqlen take the short / narrow tile entries (sm90/tiles.hpp),
  // which the shapes above cover; past them the wide (no window) and windowed entries, whose tiles differ at d64 and
  // d128.
  for (int64_t d : {64, 128}) {
    for (bool causal : {false, true}) {
      Case c; c.sq = 300, c.d = c.dv = d, c.causal = causal;
      c.sk = std::max({flashattn::cuda::sm90::fwd_short_seqlen(int(d), causal, false),
                       flashattn::cuda::sm90::fwd_narrow_seqlen(int(d), causal, false), int64_t(1024)}) + 77;
      c.name = "d" + std::to_string(d) + (causal ? "_causal" : "_full") + "_past_short"; add(c);
    }
  }
  { Case c; c.sq = c.sk = 1100; c.d = c.dv = 64; c.causal = true; c.name = "d64_causal_1100"; add(c); }
  {  // dv != d
    Case c; c.name = "d128_dv64"; c.sq = 150, c.sk = 300, c.d = 128, c.dv = 64; add(c);
    c.name = "d64_dv128_causal"; c.d = 64, c.dv = 128, c.causal = true; add(c);
    c.name = "d72_dv200_fp16"; c.dtype = FA_FLOAT16; c.d = 72, c.dv = 200, c.causal = false; add(c);
  }
  {  // GQA / MQA
    Case c; c.sq = 130, c.sk = 260, c.d = c.dv = 64;
    c.name = "gqa_8to1"; c.hq = 8, c.hkv = 1; add(c);
    c.name = "gqa_6to2_causal"; c.hq = 6, c.hkv = 2, c.causal = true; add(c);
    c.name = "mqa_4to1_d128"; c.hq = 4, c.hkv = 1, c.d = c.dv = 128, c.causal = false; add(c);
  }
  {  // softcap, ALiBi
    Case c; c.sq = 177, c.sk = 301, c.d = c.dv = 128;
    c.name = "softcap"; c.softcap = 5.f; add(c);
    c.name = "softcap_causal_fp16"; c.dtype = FA_FLOAT16; c.causal = true; add(c);
    c.softcap = 0.f; c.dtype = FA_BFLOAT16;
    c.name = "alibi"; c.alibi = Alibi::kHeads; c.causal = false; add(c);
    c.name = "alibi_batch_causal"; c.alibi = Alibi::kBatch; c.batch = 2; c.causal = true; add(c);
    c.name = "alibi_softcap_window"; c.alibi = Alibi::kHeads; c.softcap = 3.f; c.wl = 50, c.wr = 10; c.causal = false; add(c);
  }
  {  // varlen, seqused_k, strided
    Case c; c.d = c.dv = 64;
    c.name = "varlen"; c.lens_q = {1, 17, 0, 239, 128, 300}; c.lens_k = {1, 33, 5, 239, 1, 129}; add(c);
    c.name = "varlen_causal_d128"; c.d = c.dv = 128; c.causal = true; add(c);
    c.name = "varlen_window_tl_gqa"; c.hq = 4, c.hkv = 2; c.causal = false; c.wl = 20, c.wr = 20; c.top_left = true; add(c);
    // Head dims whose rows are not a power-of-two count of 16-byte vectors (the d96/d192 kernels of
    // FLASHATTN_KERNELS=all) through the predicated-store epilogue.
    c.top_left = false; c.wl = c.wr = -1; c.hq = c.hkv = 2;
    c.name = "varlen_d96"; c.d = c.dv = 96; add(c);
    c.name = "varlen_d192_dv128_causal"; c.d = 192, c.dv = 128; c.causal = true; add(c);
    Case u; u.d = u.dv = 128; u.batch = 3; u.sq = 70, u.sk = 200;
    u.name = "seqused_k"; u.seqused_k = {0, 77, 200}; add(u);
    u.name = "seqused_k_causal_varlen"; u.lens_q = {50, 64, 3}; u.lens_k = {100, 64, 130}; u.seqused_k = {60, 0, 130}; u.causal = true; add(u);
    u.name = "seqused_k_causal_varlen_nan_tail"; u.nan_past_used = true; add(u);
    Case n; n.d = n.dv = 64; n.batch = 3; n.sq = 70, n.sk = 300; n.hq = 4, n.hkv = 2; n.seqused_k = {0, 77, 211};
    n.name = "seqused_k_gqa_nan_tail"; n.nan_past_used = true; add(n);
    n.name = "seqused_k_window_nan_tail_d256"; n.d = n.dv = 256; n.wl = 100, n.wr = 0; add(n);
    Case s; s.sq = 97, s.sk = 143, s.d = s.dv = 64; s.row_pad = 8; s.hq = 3, s.hkv = 3;
    s.name = "strided_rows"; add(s);
  }
  {  // GQA with short query sequences: cuda-sm90 packs the group's heads into the tile rows
    Case c; c.batch = 2, c.sq = 1, c.sk = 1000, c.hq = 32, c.hkv = 8, c.d = c.dv = 128;
    c.name = "packed_decode_32to8"; add(c);
    c.name = "packed_decode_32to8_causal"; c.causal = true; add(c);
    Case w; w.sq = 7, w.sk = 300, w.hq = 16, w.hkv = 2, w.d = w.dv = 64; w.wl = 20, w.wr = 0;
    w.name = "packed_16to2_window"; add(w);
    Case g; g.sq = 5, g.sk = 77, g.hq = 12, g.hkv = 2, g.d = g.dv = 256; g.softcap = 4.f; g.dtype = FA_FLOAT16;
    g.name = "packed_group6_d256_softcap_fp16"; add(g);
    Case v; v.hq = 8, v.hkv = 2, v.d = v.dv = 128; v.causal = true;
    v.lens_q = {1, 5, 16, 0}; v.lens_k = {100, 1, 400, 9};
    v.name = "packed_varlen_causal"; add(v);
    Case u; u.batch = 3, u.sq = 3, u.sk = 200, u.hq = 4, u.hkv = 1, u.d = u.dv = 64; u.seqused_k = {0, 50, 200};
    u.name = "packed_mqa_seqused_k"; add(u);
    u.name = "packed_mqa_seqused_k_nan_tail"; u.seqused_k = {0, 50, 171}; u.nan_past_used = true; add(u);
    Case e; e.sq = 3, e.sk = 150, e.hq = 8, e.hkv = 2, e.d = e.dv = 96;
    e.name = "packed_d96"; add(e);
    e.name = "packed_d192_dv128_causal"; e.d = 192, e.dv = 128; e.causal = true; add(e);
    Case a; a.sq = 9, a.sk = 64, a.hq = 8, a.hkv = 2, a.d = a.dv = 128; a.alibi = Alibi::kHeads;
    a.name = "gqa_short_alibi_unpacked"; add(a);
    // d128 packed rows up to 64 take the decode tiles (one consumer warpgroup, two CTAs per SM; tiles.hpp), 68 rows
    // the windowed ones. More decode tiles than the 264 CTA slots: persistent CTAs walk several.
    Case m; m.sq = 17, m.sk = 500, m.hq = 8, m.hkv = 2, m.d = m.dv = 128; m.causal = true;
    m.name = "packed_68_rows_windowed_tiles"; add(m);
    Case t; t.batch = 40, t.sq = 1, t.sk = 333, t.hq = 32, t.hkv = 8, t.d = t.dv = 128;
    t.name = "packed_decode_many_tiles"; add(t);
    t.name = "packed_decode_many_tiles_d64_causal"; t.d = t.dv = 64; t.causal = true; add(t);
  }
  {  // split-KV (cuda-sm90; a hint the sm80 kernels ignore): key blocks of each tile split over CTAs, partials
     // merged by the combine kernel. Uneven shares, splits left without blocks (window, seqused_k, more splits
     // than blocks), packed and unpacked tiles, varlen, every mask kind.
    Case c; c.batch = 1, c.sq = 1, c.sk = 9000, c.hq = 32, c.hkv = 8, c.d = c.dv = 128;
    c.name = "split_decode_auto_32to8"; add(c);
    c.name = "split_decode_7_causal"; c.num_splits = 7; c.causal = true; add(c);
    c.name = "split_decode_unsplit"; c.num_splits = 1; c.causal = false; add(c);
    Case u; u.sq = 17, u.sk = 1000, u.hq = 2, u.hkv = 2, u.d = u.dv = 64;
    u.name = "split3_d64_causal_tl"; u.num_splits = 3; u.causal = true; u.top_left = true; add(u);
    u.name = "split5_d256_window"; u.num_splits = 5; u.causal = false; u.top_left = false;
    u.d = u.dv = 256; u.wl = 100, u.wr = 0; add(u);  // 1-2 of 5 splits see keys
    u.name = "split128_more_than_blocks_fp16"; u.num_splits = 128; u.wl = u.wr = -1; u.d = u.dv = 128;
    u.dtype = FA_FLOAT16; u.sk = 300; add(u);
    u.name = "split4_softcap_alibi"; u.num_splits = 4; u.dtype = FA_BFLOAT16; u.sk = 700; u.softcap = 3.f; u.alibi = Alibi::kBatch;
    u.batch = 2; add(u);
    Case n; n.d = n.dv = 128; n.batch = 3; n.sq = 4, n.sk = 2000; n.hq = 8, n.hkv = 2; n.seqused_k = {0, 129, 1999};
    n.name = "split6_seqused_k_nan_tail"; n.num_splits = 6; n.nan_past_used = true; add(n);
    Case v; v.hq = 8, v.hkv = 2, v.d = v.dv = 128; v.causal = true; v.num_splits = 4;
    v.lens_q = {1, 5, 130, 0}; v.lens_k = {1000, 1, 900, 9};
    v.name = "split4_varlen_causal"; add(v);
    v.name = "split4_varlen_dv64"; v.causal = false; v.dv = 64; add(v);
    // Decode tiles of at most 8 rows merge in the forward (plan.fused_combine; the last warpgroup of a tile's splits
    // to store merges): rows 1-2 a warp, varlen (an empty sequence, one key), seqused_k (none, a NaN tail),
    // sinks, d64; more (tile, split) pairs than CTA slots take the combine kernel again.
    Case f; f.batch = 2, f.sq = 1, f.sk = 3000, f.hq = 8, f.hkv = 2, f.d = f.dv = 128;
    f.name = "fused_merge_decode_4_rows"; add(f);
    f.name = "fused_merge_decode_6_rows_causal"; f.sq = 3; f.hq = 4; f.causal = true; add(f);
    f.name = "fused_merge_decode_8_rows_sinks"; f.sq = 1; f.hq = 16; f.causal = false; f.sinks = true; add(f);
    f.name = "fused_merge_decode_d64_split5"; f.sinks = false; f.hq = 8; f.d = f.dv = 64; f.num_splits = 5; add(f);
    f.name = "fused_merge_decode_seqused_k_nan_tail"; f.d = f.dv = 128; f.num_splits = 0; f.batch = 3;
    f.seqused_k = {0, 700, 2999}; f.nan_past_used = true; add(f);
    Case fv; fv.hq = 8, fv.hkv = 2, fv.d = fv.dv = 128; fv.num_splits = 4;
    fv.lens_q = {1, 0, 2, 1}; fv.lens_k = {1500, 9, 900, 1};
    fv.name = "fused_merge_varlen_decode"; add(fv);
    Case fm; fm.batch = 100, fm.sq = 1, fm.sk = 600, fm.hq = 8, fm.hkv = 2, fm.d = fm.dv = 128; fm.num_splits = 3;
    fm.name = "split3_decode_more_than_slots"; add(fm);
  }
  {  // learnable sinks: in the softmax's finish (both families), in the combine under split-KV, per row of a
     // packed tile (rows of several heads); rows with no visible key get lse = sink
    Case c; c.sq = 130, c.sk = 90, c.d = c.dv = 64; c.hq = 4, c.hkv = 2; c.sinks = true; c.causal = true;
    c.name = "sinks_causal_empty_rows"; add(c);
    c.name = "sinks_window_softcap_d128"; c.causal = false; c.wl = 20, c.wr = 3; c.softcap = 4.f; c.d = c.dv = 128; add(c);
    Case g; g.sq = 3, g.sk = 2000, g.hq = 16, g.hkv = 2, g.d = g.dv = 128; g.sinks = true;
    g.name = "sinks_packed_decode_split"; add(g);
    g.name = "sinks_packed_decode_unsplit"; g.num_splits = 1; add(g);
    Case v; v.hq = 4, v.hkv = 4, v.d = v.dv = 64; v.sinks = true; v.lens_q = {5, 0, 40}; v.lens_k = {300, 7, 1};
    v.name = "sinks_varlen_split3"; v.num_splits = 3; v.causal = true; add(v);
  }
  {  // logits spread over tens of binary orders (q_gain): a row's running max jumps between key blocks, both by more
     // and by less than 8 binary orders of the scaled scores (fwd_policies.cuh OnlineSoftmax rescales O), in every
     // entry (wide, windowed, short, decode with split partials) and both 16-bit types
    Case c; c.sq = 300, c.sk = 1500, c.d = c.dv = 128; c.q_gain = 30.f;
    c.name = "large_logits_d128"; add(c);
    c.name = "large_logits_d128_causal_fp16"; c.causal = true; c.dtype = FA_FLOAT16; add(c);
    c.name = "large_logits_d64_window"; c.causal = false; c.dtype = FA_BFLOAT16; c.d = c.dv = 64; c.wl = 700, c.wr = 0; add(c);
    c.name = "large_logits_d256"; c.d = c.dv = 256; c.wl = c.wr = -1; add(c);
    c.name = "large_logits_short_d128"; c.d = c.dv = 128; c.sq = c.sk = 500; add(c);
    Case g; g.batch = 2, g.sq = 1, g.sk = 5000, g.hq = 8, g.hkv = 2, g.d = g.dv = 128; g.q_gain = 30.f;
    g.name = "large_logits_decode_split"; add(g);
  }
  {  // more tiles than SMs: persistent CTAs walk several tiles (Q reloads, pipeline phases across tiles)
    Case c; c.batch = 2, c.hq = 8, c.hkv = 2, c.sq = 2000, c.sk = 2100, c.d = c.dv = 128;
    c.name = "many_tiles_gqa"; add(c);
    c.name = "many_tiles_gqa_causal"; c.causal = true; add(c);
    c.name = "many_tiles_d64_window"; c.d = c.dv = 64; c.causal = false; c.wl = 300, c.wr = 40; add(c);
    c.name = "many_tiles_d256_causal_fp16"; c.dtype = FA_FLOAT16; c.d = c.dv = 256; c.causal = true; c.wl = c.wr = -1; add(c);
    Case u; u.d = u.dv = 128; u.hq = 16, u.hkv = 16; u.causal = true;
    u.lens_q = {1500, 1, 700, 2048, 33, 999}; u.lens_k = {1500, 64, 900, 2048, 1, 1200};
    u.name = "many_tiles_varlen_causal"; add(u);
  }
  return v;
}
// clang-format on

// Dropout (the Dropout variants of both families): the reference draws the same mask (core/dropout.hpp), so the
// outputs match it element for element under the usual tolerance. Odd shapes and every mask, head dims of each tile
// (64, 128, 256) and a padded one, GQA, varlen with seqused_k, softcap + ALiBi, sinks, and an offset with high bits
// (the key's second word).
// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> dropout_cases() {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 17}, {239, 1}, {113, 203}, {255, 256}, {300, 129}};
  const int64_t hdims[] = {64, 128, 256, 72, 64, 128};
  std::vector<Case> v = shape_mask_grid(shapes, hdims, kCommonMasks);
  for (Case& c : v) c.dropout_p = 0.17f, c.name += "_dropout";
  auto add = [&](Case c) { c.dropout_p = c.dropout_p > 0.f ? c.dropout_p : 0.1f; v.push_back(c); };
  Case g; g.sq = 130, g.sk = 260, g.hq = 8, g.hkv = 2, g.d = g.dv = 128, g.causal = true;
  g.name = "dropout_gqa_causal"; add(g);
  g.name = "dropout_p05_offset_high_bits"; g.dropout_p = 0.5f; g.dropout_seed = 0x123456789abcdefull; g.dropout_offset = (uint64_t(3) << 40) + 77; add(g);
  g.name = "dropout_p05_rng_tensor"; g.dropout_rng = true; add(g);
  Case m; m.sq = 120, m.sk = 201, m.d = m.dv = 64; m.softcap = 5.f; m.alibi = Alibi::kHeads;
  m.name = "dropout_softcap_alibi"; add(m);
  Case s; s.sq = 130, s.sk = 90, s.hq = 4, s.hkv = 2; s.sinks = true; s.causal = true;
  s.name = "dropout_sinks_causal"; add(s);
  Case u; u.d = u.dv = 64; u.lens_q = {1, 17, 0, 239, 128}; u.lens_k = {1, 33, 5, 239, 300}; u.seqused_k = {1, 20, 5, 0, 250}; u.causal = true;
  u.name = "dropout_varlen_seqused_causal"; add(u);
  return v;
}
// clang-format on

class Forward : public testing::TestWithParam<Case> {};
TEST_P(Forward, MatchesReference) {
  SKIP_WITHOUT_GPU();
  run_case(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Sm80Dropout, Forward, testing::ValuesIn(for_backends(dropout_cases(), {FA_BACKEND_CUDA_SM80})),
                         case_name);

// The sm90 dropout kernels (no score mods: dropout with softcap/ALiBi runs on sm80, ForwardDropout below): the same
// table, plus key ranges split over CTAs (split-KV, GQA decode: dropout tiles are never packed) and keys of many
// blocks at each tile's width.
// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> sm90_dropout_cases() {
  std::vector<Case> v;
  for (const Case& c : dropout_cases())
    if (c.softcap == 0.f && c.alibi == Alibi::kNone) v.push_back(c);
  Case s; s.sq = 1, s.sk = 1100, s.hq = 8, s.hkv = 2, s.d = s.dv = 128; s.num_splits = 3; s.dropout_p = 0.25f;
  s.name = "dropout_split3_gqa_decode"; v.push_back(s);
  Case w; w.d = w.dv = 64; w.lens_q = {3, 40}; w.lens_k = {500, 9}; w.num_splits = 4; w.causal = true; w.dropout_p = 0.3f;
  w.name = "dropout_split4_varlen_causal_d64"; v.push_back(w);
  for (int64_t d : {64, 128, 256}) {
    Case l; l.sq = 700, l.sk = 1030, l.d = l.dv = d; l.dropout_p = 0.1f;
    l.name = "dropout_long_d" + std::to_string(d); v.push_back(l);
    l.name = "dropout_long_causal_d" + std::to_string(d); l.causal = true; v.push_back(l);
  }
  return v;
}
// clang-format on
INSTANTIATE_TEST_SUITE_P(Sm90Dropout, Forward,
                         testing::ValuesIn(for_backends(sm90_dropout_cases(), {FA_BACKEND_CUDA_SM90})), case_name);

// AUTO plans dropout on the GPU's own family: cuda-sm90 on Hopper, except with softcap/ALiBi (no such sm90 kernel),
// which runs on cuda-sm80; cuda-sm90 asked for by name refuses that one with an error naming dropout_p.
TEST(ForwardDropout, AutoRunsScoreModsOnSm80) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.sq = 70, c.sk = 90, c.d = c.dv = 64, c.dropout_p = 0.2f, c.backend = FA_BACKEND_AUTO, c.name = "auto_dropout";
  run_case(c);
  c.softcap = 3.f, c.name = "auto_dropout_softcap";
  run_case(c);
  DeviceBuffer<uint16_t> q(70 * 64), k(90 * 64), v(90 * 64), out(70 * 64);
  fa_fwd_params p{};
  p.attn = fa_attention_default();
  int64_t qs[4] = {1, 70, 1, 64}, ks[4] = {1, 90, 1, 64};
  p.attn.q = fa_make_tensor(q.ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, qs);
  p.attn.k = fa_make_tensor(k.ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, ks);
  p.attn.v = fa_make_tensor(v.ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, ks);
  p.out = fa_make_tensor(out.ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, qs);
  p.attn.dropout_p = 0.2f;
  fa_exec exec = fa_exec_default();
  fa_plan_info plan{};
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(fa_forward_plan(&p, &exec, &plan), FA_OK) << fa_last_error();
  const std::string family = plan.kernels;
  if (major == 9 && family != "cuda-sm80") EXPECT_EQ(family, "cuda-sm90");  // sm80 only in a build without sm90a
  p.attn.softcap = 3.f;
  ASSERT_EQ(fa_forward_plan(&p, &exec, &plan), FA_OK) << fa_last_error();
  EXPECT_STREQ(plan.kernels, "cuda-sm80");
  if (major == 9 && family == "cuda-sm90") {
    exec.backend = FA_BACKEND_CUDA_SM90;
    EXPECT_EQ(fa_forward(&p, &exec), FA_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(fa_last_error()).find("dropout_p"), std::string::npos) << fa_last_error();
  }
}
INSTANTIATE_TEST_SUITE_P(Sm80, Forward, testing::ValuesIn(for_backends(forward_cases(), {FA_BACKEND_CUDA_SM80})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Sm90, Forward, testing::ValuesIn(for_backends(forward_cases(), {FA_BACKEND_CUDA_SM90})),
                         case_name);

// The small subset for compute-sanitizer (memcheck, racecheck): every kernel path at sizes that run fast
// under instrumentation. --gtest_filter='Sanitizer*'
// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> sanitizer_cases() {
  std::vector<Case> v;
  for (int64_t d : {64, 128, 256}) {
    Case c; c.sq = 130, c.sk = 70, c.d = c.dv = d;
    c.name = "d" + std::to_string(d) + "_full"; v.push_back(c);
    c.name = "d" + std::to_string(d) + "_causal"; c.causal = true; v.push_back(c);
  }
  // sm90: the wide and windowed tile entries (the cases above take the short or narrow one, sm90/tiles.hpp).
  for (int64_t d : {64, 128}) {
    for (bool causal : {false, true}) {
      Case c; c.sq = 70, c.d = c.dv = d, c.causal = causal;
      c.sk = std::max({flashattn::cuda::sm90::fwd_short_seqlen(int(d), causal, false),
                       flashattn::cuda::sm90::fwd_narrow_seqlen(int(d), causal, false), int64_t(1024)}) + 77;
      c.name = "d" + std::to_string(d) + (causal ? "_causal" : "_full") + "_past_short"; v.push_back(c);
    }
  }
  // Several tiles per persistent CTA (600 tiles on 132 SMs): each Q buffer of the two-buffer kernels (d64 wide, d128
  // short and windowed; sm90/fwd_traits.cuh kQStages) is released and reloaded, with its index and phase hand-offs.
  for (int64_t d : {64, 128}) {
    Case c; c.sq = 130, c.sk = 70, c.hq = c.hkv = d == 64 ? 600 : 300, c.d = c.dv = d;
    c.name = "d" + std::to_string(d) + "_many_tiles"; v.push_back(c);
    if (d == 128) { c.name = "d128_many_tiles_causal"; c.causal = true; v.push_back(c); }
  }
  // A head dim below the compiled one (200 in the d256 kernel, the Padded kernel variant): its column-predicated
  // loads and stores must stay inside the tensors.
  Case pad; pad.sq = 130, pad.sk = 70, pad.d = pad.dv = 200; pad.name = "d200_padded"; v.push_back(pad);
  Case c; c.d = c.dv = 72; c.lens_q = {3, 140}; c.lens_k = {70, 9}; c.wl = 10, c.wr = 4; c.alibi = Alibi::kHeads; c.softcap = 2.f;
  c.name = "varlen_window_alibi_softcap_d72"; v.push_back(c);
  // Split-KV partials and their combine: packed decode, and varlen with a split left empty.
  Case s; s.sq = 1, s.sk = 1100, s.hq = 8, s.hkv = 2, s.d = s.dv = 128; s.num_splits = 3;
  s.name = "split3_packed_decode"; v.push_back(s);
  Case w; w.d = w.dv = 64; w.lens_q = {3, 40}; w.lens_k = {500, 9}; w.num_splits = 4; w.causal = true;
  w.name = "split4_varlen_causal_d64"; v.push_back(w);
  return v;
}
// clang-format on
// Both families, the sm80 dropout kernel (causal d128, padded varlen with ALiBi) and the sm90 ones (causal d128,
// padded varlen, split-KV decode).
std::vector<Case> all_sanitizer_cases() {
  std::vector<Case> v = for_backends(sanitizer_cases(), {FA_BACKEND_CUDA_SM80, FA_BACKEND_CUDA_SM90});
  Case c;
  c.sq = 130, c.sk = 70, c.d = c.dv = 128, c.causal = true, c.dropout_p = 0.2f;
  c.name = "dropout_causal_d128";
  Case u;
  u.d = u.dv = 72, u.lens_q = {3, 140}, u.lens_k = {70, 9}, u.alibi = Alibi::kHeads, u.dropout_p = 0.3f;
  u.name = "dropout_varlen_alibi_d72";
  for (const Case& d : for_backends({c, u}, {FA_BACKEND_CUDA_SM80})) v.push_back(d);
  Case n = u;
  n.alibi = Alibi::kNone, n.name = "dropout_varlen_d72";
  Case s;
  s.sq = 1, s.sk = 1100, s.hq = 8, s.hkv = 2, s.d = s.dv = 128, s.num_splits = 3, s.dropout_p = 0.25f;
  s.name = "dropout_split3_gqa_decode";
  for (const Case& d : for_backends({c, n, s}, {FA_BACKEND_CUDA_SM90})) v.push_back(d);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Sanitizer, Forward, testing::ValuesIn(all_sanitizer_cases()), case_name);

// ----------------------------------------------------------------------------- CUDA-specific validation
struct SmallCall {
  DeviceBuffer<uint16_t> buf{4096 * 8};
  fa_fwd_params p{};
  SmallCall(fa_dtype dt = FA_BFLOAT16) {
    p.attn = fa_attention_default();
    int64_t s[4] = {1, 16, 2, 64};
    char* base = reinterpret_cast<char*>(buf.ptr);
    p.attn.q = fa_make_tensor(base, dt, FA_DEVICE_CUDA, 4, s);
    p.attn.k = fa_make_tensor(base + 8192, dt, FA_DEVICE_CUDA, 4, s);
    p.attn.v = fa_make_tensor(base + 16384, dt, FA_DEVICE_CUDA, 4, s);
    p.out = fa_make_tensor(base + 24576, dt, FA_DEVICE_CUDA, 4, s);
  }
  // q, k, v and out of other shapes, bf16, in `base`'s four regions of `region` elements (separate memory per
  // tensor: validate.cpp refuses overlaps).
  void place(uint16_t* base, int64_t region, int64_t (&q)[4], int64_t (&kv)[4]) {
    p.attn.q = fa_make_tensor(base, FA_BFLOAT16, FA_DEVICE_CUDA, 4, q);
    p.attn.k = fa_make_tensor(base + region, FA_BFLOAT16, FA_DEVICE_CUDA, 4, kv);
    p.attn.v = fa_make_tensor(base + 2 * region, FA_BFLOAT16, FA_DEVICE_CUDA, 4, kv);
    p.out = fa_make_tensor(base + 3 * region, FA_BFLOAT16, FA_DEVICE_CUDA, 4, q);
  }
};

TEST(Sm80Validation, Float32IsUnsupported) {
  SKIP_WITHOUT_GPU();
  SmallCall call(FA_FLOAT32);
  EXPECT_EQ(fa_forward(&call.p, nullptr), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("float32"), std::string::npos) << fa_last_error();
}

TEST(Sm80Validation, MisalignedPointer) {
  SKIP_WITHOUT_GPU();
  SmallCall call;
  call.p.attn.k.data = static_cast<char*>(call.p.attn.k.data) + 2;  // element-aligned, not 16-byte aligned
  EXPECT_EQ(fa_forward(&call.p, nullptr), FA_ERROR_INVALID_ARGUMENT);
  const std::string msg = fa_last_error();
  EXPECT_NE(msg.find("k:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16 bytes"), std::string::npos) << msg;
}

TEST(Sm80Validation, StrideNotMultipleOf8) {
  SKIP_WITHOUT_GPU();
  SmallCall call;
  call.p.attn.v.stride[2] = 68;  // heads 68 elements apart: rows of V not on 16-byte boundaries
  call.p.attn.v.stride[1] = 136;
  call.p.attn.v.stride[0] = 16 * 136;
  EXPECT_EQ(fa_forward(&call.p, nullptr), FA_ERROR_INVALID_ARGUMENT);
  const std::string msg = fa_last_error();
  EXPECT_NE(msg.find("v:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of 8"), std::string::npos) << msg;
}

TEST(Sm80Validation, HostPointerLabelledCuda) {
  SKIP_WITHOUT_GPU();
  SmallCall call;
  alignas(16) static uint16_t host[16 * 2 * 64];
  call.p.attn.q.data = host;
  EXPECT_EQ(fa_forward(&call.p, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("q:"), std::string::npos) << fa_last_error();
}

TEST(Sm80Validation, VarlenDuringGraphCaptureIsRejected) {
  SKIP_WITHOUT_GPU();
  SmallCall call;
  DeviceBuffer<int32_t> cu(2);
  cu.upload({0, 16});
  int64_t s3[3] = {16, 2, 64};
  for (fa_tensor* t : {&call.p.attn.q, &call.p.attn.k, &call.p.attn.v, &call.p.out}) {
    void* d = t->data;
    *t = fa_make_tensor(d, FA_BFLOAT16, FA_DEVICE_CUDA, 3, s3);
  }
  call.p.attn.cu_seqlens_q = vec_i32(cu.ptr, FA_DEVICE_CUDA, 2);
  call.p.attn.cu_seqlens_k = vec_i32(cu.ptr, FA_DEVICE_CUDA, 2);
  call.p.attn.max_seqlen_q = call.p.attn.max_seqlen_k = 16;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  fa_exec exec = fa_exec_default();
  exec.stream = stream;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  const fa_status st = fa_forward(&call.p, &exec);
  const std::string msg = fa_last_error();
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_EQ(st, FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("capturing"), std::string::npos) << msg;
  // And outside capture the same call runs.
  EXPECT_EQ(fa_forward(&call.p, nullptr), FA_OK) << fa_last_error();
}

// One fa_forward captured on `stream` into an instantiated graph (the test fails where a step does).
void capture_forward(const fa_fwd_params& p, const fa_exec& exec, cudaStream_t stream, cudaGraphExec_t* instance) {
  *instance = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  const fa_status st = fa_forward(&p, &exec);
  const std::string msg = fa_last_error();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(st, FA_OK) << msg;
  ASSERT_EQ(cudaGraphInstantiate(instance, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
}

// seqused_k is not read on the host for CUDA calls: out-of-range entries are clamped to [0, seqlen_k] on the
// device (validate.cpp), and a batched call with seqused_k can be captured in a CUDA graph (decode loops).
TEST(CudaSequsedK, ClampedOnDeviceAndCapturable) {
  SKIP_WITHOUT_GPU();
  for (const fa_backend backend : {FA_BACKEND_CUDA_SM80, FA_BACKEND_AUTO}) {
    SmallCall call;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<uint16_t> h(call.buf.n);
    for (auto& x : h) x = to_storage(FA_BFLOAT16, normal(rng));
    call.buf.upload(h);
    DeviceBuffer<int32_t> used(1);
    call.p.attn.seqused_k = vec_i32(used.ptr, FA_DEVICE_CUDA, 1);
    fa_exec exec = fa_exec_default();
    exec.backend = backend;
    const size_t n_out = 16 * 2 * 64;
    auto run = [&](int32_t u) {
      used.upload({u});
      EXPECT_EQ(fa_forward(&call.p, &exec), FA_OK) << fa_last_error();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint16_t> all = call.buf.download();
      return std::vector<uint16_t>(all.begin() + 24576 / 2, all.begin() + 24576 / 2 + n_out);
    };
    const auto zero = run(0), full = run(16), some = run(5);
    EXPECT_EQ(run(-3), zero) << "negative entries mean no key";
    EXPECT_EQ(run(1000), full) << "entries past the keys mean all keys";
    EXPECT_NE(some, full);

    // Captured: the graph replays with the entry as it is at replay time.
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    exec.stream = stream;
    used.upload({16});
    cudaGraphExec_t instance = nullptr;
    ASSERT_NO_FATAL_FAILURE(capture_forward(call.p, exec, stream, &instance));
    used.upload({5});
    ASSERT_EQ(cudaGraphLaunch(instance, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<uint16_t> all = call.buf.download();
    EXPECT_EQ(std::vector<uint16_t>(all.begin() + 24576 / 2, all.begin() + 24576 / 2 + n_out), some);
    cudaGraphExecDestroy(instance);
    cudaStreamDestroy(stream);
  }
}

// Backend::tile_shape reports the same constexpr tiles the kernel is compiled with.
TEST(Sm80Validation, TileShapeReported) {
  SKIP_WITHOUT_GPU();
#if defined(FA_TEST_KERNEL_SET_CI)
  // Its calls need the sm80 d64 and d256 kernels; the ci set has d128 only, where a d64 call runs on d128's tiles.
  GTEST_SKIP() << "FLASHATTN_KERNELS=ci builds no sm80 d64/d256 kernel";
#endif
  SmallCall call;  // head_dim 64: served by the d64 kernel
  fa_exec exec = fa_exec_default();
  exec.backend = FA_BACKEND_CUDA_SM80;
  for (const bool causal : {false, true}) {  // the tile depends on the mask
    call.p.attn.causal = causal ? 1 : 0;
    int bq = 0, bk = 0;
    fa_forward_tile_shape(&call.p, &exec, &bq, &bk);
    const flashattn::cuda::sm80::FwdTiles d64 = flashattn::cuda::sm80::fwd_tiles(64, causal);
    EXPECT_EQ(bq, d64.block_q) << "causal " << causal;
    EXPECT_EQ(bk, d64.block_k) << "causal " << causal;
  }
  // Above d128 unmasked calls take the compact tile up to kShortKeys keys (the launch reads the same rule). Only
  // the shapes are read: nothing is launched.
  namespace sm80 = flashattn::cuda::sm80;
  static_assert(sm80::compact_for_short_keys(256), "the d256 unmasked tile depends on the key length");
  call.p.attn.causal = 0;
  constexpr int64_t kRegion = (sm80::kShortKeys + 1) * 256;
  DeviceBuffer<uint16_t> big(size_t(4 * kRegion));
  for (const int64_t keys : {int64_t(sm80::kShortKeys), int64_t(sm80::kShortKeys) + 1}) {
    int64_t sq[4] = {1, 16, 1, 256}, sk[4] = {1, keys, 1, 256};
    call.place(big.ptr, kRegion, sq, sk);
    int bq = 0, bk = 0;
    fa_forward_tile_shape(&call.p, &exec, &bq, &bk);
    const sm80::FwdTiles want = sm80::fwd_tiles(256, keys <= sm80::kShortKeys);
    EXPECT_EQ(bq, want.block_q) << keys << " keys";
    EXPECT_EQ(bk, want.block_k) << keys << " keys";
  }
}

// Runs the call on cuda-sm90 and reads the tile shape reported for it; false where this device or build has no sm90
// kernels (fa_last_error says why).
bool sm90_tile_shape(SmallCall& call, int* bq, int* bk) {
  fa_exec exec = fa_exec_default();
  exec.backend = FA_BACKEND_CUDA_SM90;
  if (fa_forward(&call.p, &exec) == FA_ERROR_UNSUPPORTED && sm90_unavailable_message(fa_last_error())) return false;
  fa_forward_tile_shape(&call.p, &exec, bq, bk);
  return true;
}

// The sm90 dropout kernels take the windowed tile table entry under every mask (tiles.hpp): what the plan reports.
TEST(ForwardDropout, Sm90TileShapeReported) {
  SKIP_WITHOUT_GPU();
  SmallCall call;
  int64_t d128[4] = {1, 16, 2, 128};  // d128: its windowed and unmasked entries differ (each tensor 8 KiB of buf)
  for (fa_tensor* t : {&call.p.attn.q, &call.p.attn.k, &call.p.attn.v, &call.p.out})
    *t = fa_make_tensor(t->data, FA_BFLOAT16, FA_DEVICE_CUDA, 4, d128);
  call.p.attn.dropout_p = 0.1f;
  int bq = 0, bk = 0;
  if (!sm90_tile_shape(call, &bq, &bk)) GTEST_SKIP() << fa_last_error();
  using flashattn::cuda::sm90::FwdEntry;
  constexpr flashattn::cuda::sm90::FwdTiles kD128 = flashattn::cuda::sm90::fwd_tiles(128, FwdEntry::kWindowed);
  static_assert(kD128.block_k != flashattn::cuda::sm90::fwd_tiles(128, FwdEntry::kWide).block_k);
  EXPECT_EQ(bq, kD128.block_q());
  EXPECT_EQ(bk, kD128.block_k);
}

// GQA decode: packed rows up to 64 (query positions x group) take the decode entry, more the windowed one.
TEST(Sm80Validation, Sm90DecodeTileShapeReported) {
  SKIP_WITHOUT_GPU();
  using flashattn::cuda::sm90::fwd_tiles;
  using flashattn::cuda::sm90::FwdEntry;
  static_assert(fwd_tiles(128, FwdEntry::kDecode).block_q() != fwd_tiles(128, FwdEntry::kWindowed).block_q());
  SmallCall call;
  constexpr int64_t kRegion = 17 * 8 * 128;  // the largest q below
  DeviceBuffer<uint16_t> big(size_t(4 * kRegion));
  for (const int64_t positions : {int64_t(1), int64_t(16), int64_t(17)}) {  // x group 4: 4, 64 and 68 rows
    int64_t sq[4] = {1, positions, 8, 128}, skv[4] = {1, 4, 2, 128};
    call.place(big.ptr, kRegion, sq, skv);
    int bq = 0, bk = 0;
    if (!sm90_tile_shape(call, &bq, &bk)) GTEST_SKIP() << fa_last_error();
    const auto want = fwd_tiles(128, positions * 4 <= 64 ? FwdEntry::kDecode : FwdEntry::kWindowed);
    EXPECT_EQ(bq, want.block_q()) << positions << " positions";
    EXPECT_EQ(bk, want.block_k) << positions << " positions";
  }
}

// d64 causal: 16 rows take the narrow entry (one warpgroup, three CTAs per SM), rows past fwd_narrow_seqlen the
// windowed one (three warpgroups). Only planned: nothing is launched.
TEST(Sm80Validation, Sm90TileShapeReported) {
  SKIP_WITHOUT_GPU();
#if !defined(FA_TEST_SM90_HDIM64)
  GTEST_SKIP() << "FLASHATTN_SM90_HDIMS builds no sm90 d64 kernel (d64 calls run padded)";
#endif
  using flashattn::cuda::sm90::fwd_tiles;
  using flashattn::cuda::sm90::FwdEntry;
  static_assert(fwd_tiles(64, FwdEntry::kNarrow).block_q() != fwd_tiles(64, FwdEntry::kWindowed).block_q());
  static_assert(flashattn::cuda::sm90::fwd_short_seqlen(64, true, false) == 0, "d64 causal: no short entry");
  SmallCall call;
  call.p.attn.causal = 1;
  int bq = 0, bk = 0;
  if (!sm90_tile_shape(call, &bq, &bk)) GTEST_SKIP() << fa_last_error();
  EXPECT_EQ(bq, fwd_tiles(64, FwdEntry::kNarrow).block_q());
  EXPECT_EQ(bk, fwd_tiles(64, FwdEntry::kNarrow).block_k);
  const int64_t rows = flashattn::cuda::sm90::fwd_narrow_seqlen(64, true, false) + 1;
  int64_t d64_long[4] = {1, rows, 2, 64};
  const int64_t region = rows * 2 * 64;
  DeviceBuffer<uint16_t> big(size_t(4 * region));
  call.place(big.ptr, region, d64_long, d64_long);
  ASSERT_TRUE(sm90_tile_shape(call, &bq, &bk)) << fa_last_error();
  EXPECT_EQ(bq, fwd_tiles(64, FwdEntry::kWindowed).block_q());
  EXPECT_EQ(bk, fwd_tiles(64, FwdEntry::kWindowed).block_k);
}

// The sm90 forward's counters are kept per stream at zero between launches (Workspace): the causal schedule's tile
// counter (sm90/tile_scheduler.cuh) and the fused split-KV merge's arrivals (sm90/fwd_epilogue.cuh). Each launch
// returns them to zero, and captured launches zero their own first. A launch that found one off zero would skip
// tiles or merge a tile early (or never), leaving rows as the NaN poison or wrong. The shapes alternate on one
// stream, eagerly and with the last one captured and replayed between eager calls of the first, each output finite
// and bit-equal to that shape's first run.
struct CounterShape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool causal;
  int num_splits;  // exec.num_splits (0: the plan's)
};
void alternate_on_one_stream(const std::vector<CounterShape>& shapes) {
  constexpr int64_t kDim = 128;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Call {
    std::unique_ptr<DeviceBuffer<uint16_t>> q, k, v, out;
    fa_fwd_params p{};
    fa_exec exec{};
  };
  std::vector<Call> calls(shapes.size());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const CounterShape& sh = shapes[i];
    int64_t dims_q[4] = {sh.batch, sh.seqlen_q, sh.heads_q, kDim};
    int64_t dims_kv[4] = {sh.batch, sh.seqlen_k, sh.heads_kv, kDim};
    const size_t n_q = size_t(sh.batch * sh.seqlen_q * sh.heads_q * kDim);
    const size_t n_kv = size_t(sh.batch * sh.seqlen_k * sh.heads_kv * kDim);
    Call& c = calls[i];
    c.p.attn = fa_attention_default();
    c.p.attn.causal = sh.causal ? 1 : 0;
    c.q = std::make_unique<DeviceBuffer<uint16_t>>(n_q);
    c.out = std::make_unique<DeviceBuffer<uint16_t>>(n_q);
    c.k = std::make_unique<DeviceBuffer<uint16_t>>(n_kv);
    c.v = std::make_unique<DeviceBuffer<uint16_t>>(n_kv);
    for (auto* b : {&c.q, &c.k, &c.v}) {
      std::vector<uint16_t> h((*b)->n);
      for (auto& x : h) x = to_storage(FA_BFLOAT16, normal(rng));
      (*b)->upload(h);
    }
    c.p.attn.q = fa_make_tensor(c.q->ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, dims_q);
    c.p.attn.k = fa_make_tensor(c.k->ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, dims_kv);
    c.p.attn.v = fa_make_tensor(c.v->ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, dims_kv);
    c.p.out = fa_make_tensor(c.out->ptr, FA_BFLOAT16, FA_DEVICE_CUDA, 4, dims_q);
    c.exec = fa_exec_default();
    c.exec.backend = FA_BACKEND_CUDA_SM90;
    c.exec.stream = stream;
    c.exec.num_splits = sh.num_splits;
  }
  auto poison = [&](Call& c) {
    ASSERT_EQ(cudaMemsetAsync(c.out->ptr, 0xff, c.out->n * sizeof(uint16_t), stream), cudaSuccess);
  };
  auto result = [&](Call& c) {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return c.out->download();
  };
  std::vector<std::vector<uint16_t>> first(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    poison(calls[i]);
    const fa_status st = fa_forward(&calls[i].p, &calls[i].exec);
    if (st == FA_ERROR_UNSUPPORTED && sm90_unavailable_message(fa_last_error())) GTEST_SKIP() << fa_last_error();
    ASSERT_EQ(st, FA_OK) << fa_last_error();
    first[i] = result(calls[i]);
    for (const uint16_t x : first[i]) ASSERT_TRUE(std::isfinite(from_storage(FA_BFLOAT16, x))) << "shape " << i;
  }
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < calls.size(); ++i) {
      poison(calls[i]);
      ASSERT_EQ(fa_forward(&calls[i].p, &calls[i].exec), FA_OK) << fa_last_error();
      EXPECT_EQ(result(calls[i]), first[i]) << "round " << round << ", shape " << i;
    }
  // The last shape captured, replayed between eager calls of the first.
  Call& captured = calls.back();
  cudaGraphExec_t instance = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture_forward(captured.p, captured.exec, stream, &instance));
  for (int round = 0; round < 2; ++round) {
    poison(captured);
    ASSERT_EQ(cudaGraphLaunch(instance, stream), cudaSuccess);
    EXPECT_EQ(result(captured), first.back()) << "replay " << round;
    poison(calls[0]);
    ASSERT_EQ(fa_forward(&calls[0].p, &calls[0].exec), FA_OK) << fa_last_error();
    EXPECT_EQ(result(calls[0]), first[0]) << "eager call after replay " << round;
  }
  cudaGraphExecDestroy(instance);
  cudaStreamDestroy(stream);
}

// Causal: 4 tiles, and 288 tiles (more than one per SM, so CTAs claim).
TEST(Sm90TileCounter, ReturnsToZeroAcrossLaunches) {
  SKIP_WITHOUT_GPU();
  alternate_on_one_stream({{1, 200, 200, 2, 2, true, 0}, {4, 1100, 1100, 8, 8, true, 0}});
}

// Split GQA decode merged in the forward (plan.fused_combine): 8 tiles of the plan's splits; 80 tiles of 3 splits
// (240 CTAs: more arrival counters than the per-stream array's first size, so it grows); a causal call between
// them, whose tile counter shares the array; 6 tiles of 5 splits captured.
TEST(Sm90MergeCounters, ReturnToZeroAcrossLaunches) {
  SKIP_WITHOUT_GPU();
  alternate_on_one_stream({{1, 1, 5000, 32, 8, false, 0},
                           {40, 1, 700, 8, 2, false, 3},
                           {2, 300, 300, 4, 4, true, 0},
                           {3, 1, 3000, 8, 2, true, 5}});
}

// On a GPU other than sm90 (or in a build without the Hopper kernels) an explicit cuda-sm90 request is refused
// with a message naming the backend; on sm90 it runs, and AUTO picks it.
TEST(Sm80Validation, Sm90RequestMatchesDevice) {
  SKIP_WITHOUT_GPU();
  SmallCall call;
  fa_exec exec = fa_exec_default();
  exec.backend = FA_BACKEND_CUDA_SM90;
  const fa_status st = fa_forward(&call.p, &exec);
  if (st == FA_ERROR_UNSUPPORTED) {
    EXPECT_NE(std::string(fa_last_error()).find("sm90"), std::string::npos) << fa_last_error();
    return;
  }
  EXPECT_EQ(st, FA_OK) << fa_last_error();
  EXPECT_STREQ(fa_backend_name(&call.p, nullptr), "cuda-sm90");
}

}  // namespace
