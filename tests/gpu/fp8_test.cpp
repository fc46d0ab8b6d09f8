// GPU correctness of the FP8 forward (e4m3 q/k/v, bfloat16 out; the cuda-sm90 family) against the float64 reference
// of the dequantised inputs, with the suites' one rule (docs/testing.md): max |ours - exact| <= 2 * max |plain -
// exact| + one bfloat16 ulp, the plain implementation being FlashAttention-3's (probabilities rounded to e4m3 against
// the row maximum, reference.cpp). Fresh random codes per case (seeded by its name), outputs poisoned with NaN, odd
// shapes, every mask, GQA with both factor shapes, seqused_k with NaN cache rows, split-KV, sinks; and
// fa_quantize_fp8 on the GPU writing the CPU's bytes. Skips without an sm90 device unless FLASHATTN_REQUIRE_SM90=1.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/problem.hpp"
#include "cpu/numeric.hpp"
#include "cpu/reference.hpp"
#include "flashattn/flashattn.h"
#include "gpu_support.hpp"

namespace {

using namespace flashattn::gpu_testing;
namespace ref = flashattn::reference;

constexpr int64_t kFullCheckRows = 3000;
constexpr int kSampledRows = 300;

struct Fp8Case {
  std::string name;
  int64_t batch = 1, sq = 17, sk = 17, hq = 2, hkv = 2, d = 128, dv = 0;
  bool causal = false, top_left = false;
  int64_t wl = -1, wr = -1;
  int descale = 1;  // 0: none, 1: q/k/v per KV head, 2: q per query head
  std::vector<int32_t> seqused_k;
  std::vector<int32_t> lens_q, lens_k;  // varlen (batch, sq, sk unused) when given
  int64_t page_size = 0;                // > 0: K/V in pages of this many keys (batched), sk keys used per sequence
  bool sinks = false;
  float softcap = 0.f;
  bool alibi = false;  // slopes per query head
  int num_splits = 0;
  float q_gain = 1.f;  // q's factors times this: logits spread over tens of binary orders (see tests/case.hpp)
  int64_t value_dim() const { return dv ? dv : d; }
  bool varlen() const { return !lens_q.empty(); }
};

fa_tensor dense(void* data, fa_dtype t, fa_device dev, std::initializer_list<int64_t> shape) {
  std::vector<int64_t> s(shape);
  return fa_make_tensor(data, t, dev, int(s.size()), s.data());
}

void run_fp8(const Fp8Case& c) {
  const bool varlen = c.varlen();
  const int64_t dv = c.value_dim(), B = varlen ? int64_t(c.lens_q.size()) : c.batch;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (size_t b = 0; b < c.lens_q.size(); ++b) {
    cu_q.push_back(cu_q.back() + c.lens_q[b]);
    cu_k.push_back(cu_k.back() + c.lens_k[b]);
  }
  // Rows of each tensor (batched: per batch entry), and where row i of sequence b lives.
  const int64_t rows_q = varlen ? cu_q.back() : c.sq, rows_k = varlen ? cu_k.back() : c.sk, nb = varlen ? 1 : B;
  auto len_q = [&](int64_t b) { return varlen ? int64_t(c.lens_q[size_t(b)]) : c.sq; };
  auto len_k = [&](int64_t b) { return varlen ? int64_t(c.lens_k[size_t(b)]) : c.sk; };
  auto q_row = [&](int64_t b, int64_t i) { return varlen ? cu_q[size_t(b)] + i : b * c.sq + i; };
  auto k_row = [&](int64_t b, int64_t j) { return varlen ? cu_k[size_t(b)] + j : b * c.sk + j; };
  auto lse_at = [&](int64_t b, int64_t h, int64_t i) {
    return varlen ? h * rows_q + cu_q[size_t(b)] + i : (b * c.hq + h) * c.sq + i;
  };
  const size_t nq = size_t(nb * rows_q * c.hq * c.d), nk = size_t(nb * rows_k * c.hkv * c.d);
  const size_t nv = size_t(nb * rows_k * c.hkv * dv), no = size_t(nb * rows_q * c.hq * dv);
  const size_t nl = size_t(nb * c.hq * rows_q);
  std::mt19937 rng(std::hash<std::string>{}(c.name));
  std::normal_distribution<float> normal(0.f, 1.f);
  auto codes = [&](size_t n) {
    std::vector<uint8_t> h(n);
    for (auto& x : h) x = flashattn::cpu::float_to_e4m3(normal(rng) * 64.f);
    return h;
  };
  std::vector<uint8_t> hq = codes(nq), hk = codes(nk), hv = codes(nv);
  for (int64_t b = 0; b < int64_t(c.seqused_k.size()); ++b)  // e4m3 NaN (0xff) in the unused cache rows
    for (int64_t j = c.seqused_k[size_t(b)]; j < len_k(b); ++j) {
      std::fill_n(hk.begin() + k_row(b, j) * c.hkv * c.d, c.hkv * c.d, uint8_t(0xff));
      std::fill_n(hv.begin() + k_row(b, j) * c.hkv * dv, c.hkv * dv, uint8_t(0xff));
    }
  // Paged: the same rows in pages of a shuffled block table (one spare page), the cache's key length sk via seqused_k.
  const bool paged = c.page_size > 0;
  const int64_t pages_per = paged ? (c.sk + c.page_size - 1) / c.page_size : 0, num_pages = B * pages_per + 1;
  std::vector<int32_t> table;
  std::vector<int32_t> used(c.seqused_k);
  if (paged) {
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    for (int64_t i = 0; i < num_pages; ++i) perm[size_t(i)] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(perm.begin(), perm.begin() + B * pages_per);
    std::vector<uint8_t> pk = codes(size_t(num_pages * c.page_size * c.hkv * c.d)),
                         pv = codes(size_t(num_pages * c.page_size * c.hkv * dv));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < c.sk; ++j) {
        const int64_t page = table[size_t(b * pages_per + j / c.page_size)],
                      slot = page * c.page_size + j % c.page_size;
        std::copy_n(hk.begin() + k_row(b, j) * c.hkv * c.d, c.hkv * c.d, pk.begin() + slot * c.hkv * c.d);
        std::copy_n(hv.begin() + k_row(b, j) * c.hkv * dv, c.hkv * dv, pv.begin() + slot * c.hkv * dv);
      }
    hk.swap(pk);
    hv.swap(pv);
    if (used.empty()) used.assign(size_t(B), int32_t(c.sk));
  }
  std::uniform_real_distribution<float> factor(0.5f / 64.f, 2.f / 64.f);
  const int64_t q_heads = c.descale == 2 ? c.hq : c.hkv;
  std::vector<float> qd(size_t(B * q_heads)), kd(size_t(B * c.hkv)), vd(size_t(B * c.hkv)), sinks(size_t(c.hq));
  for (auto* f : {&qd, &kd, &vd})
    for (float& x : *f) x = factor(rng) * (f == &qd ? c.q_gain : 1.f);
  for (float& s : sinks) s = std::uniform_real_distribution<float>(-2.f, 4.f)(rng);
  std::vector<float> slopes(size_t(c.hq));
  for (float& s : slopes) s = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);

  DeviceBuffer<uint8_t> dq(nq), dk(hk.size()), dvv(hv.size());
  DeviceBuffer<uint16_t> dout(no);
  DeviceBuffer<float> dlse(nl), dqd(qd.size()), dkd(kd.size()), dvd(vd.size()), dsinks(sinks.size()),
      dslopes(slopes.size());
  dslopes.upload(slopes);
  DeviceBuffer<int32_t> dused(used.size()), dcu_q(cu_q.size()), dcu_k(cu_k.size()), dtable(table.size());
  if (paged) dtable.upload(table);
  dcu_q.upload(cu_q);
  dcu_k.upload(cu_k);
  dq.upload(hq);
  dk.upload(hk);
  dvv.upload(hv);
  dqd.upload(qd);
  dkd.upload(kd);
  dvd.upload(vd);
  dsinks.upload(sinks);
  if (!used.empty()) dused.upload(used);
  ASSERT_EQ(cudaMemset(dout.ptr, 0xff, no * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse.ptr, 0xff, nl * sizeof(float)), cudaSuccess);

  auto params = [&](fa_device dev, void* q, void* k, void* v, void* out, void* lse, void* qdp, void* kdp, void* vdp,
                    void* usedp, void* sinkp, void* cuq, void* cuk, void* tablep, void* slopep) {
    fa_fwd_params p{};
    p.attn = fa_attention_default();
    if (varlen) {
      p.attn.q = dense(q, FA_FLOAT8_E4M3, dev, {rows_q, c.hq, c.d});
      p.attn.k = dense(k, FA_FLOAT8_E4M3, dev, {rows_k, c.hkv, c.d});
      p.attn.v = dense(v, FA_FLOAT8_E4M3, dev, {rows_k, c.hkv, dv});
      p.out = dense(out, FA_BFLOAT16, dev, {rows_q, c.hq, dv});
      p.lse = dense(lse, FA_FLOAT32, dev, {c.hq, rows_q});
      p.attn.cu_seqlens_q = dense(cuq, FA_INT32, dev, {B + 1});
      p.attn.cu_seqlens_k = dense(cuk, FA_INT32, dev, {B + 1});
      p.attn.max_seqlen_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
      p.attn.max_seqlen_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
    } else if (paged) {
      p.attn.q = dense(q, FA_FLOAT8_E4M3, dev, {B, c.sq, c.hq, c.d});
      p.attn.k = dense(k, FA_FLOAT8_E4M3, dev, {num_pages, c.page_size, c.hkv, c.d});
      p.attn.v = dense(v, FA_FLOAT8_E4M3, dev, {num_pages, c.page_size, c.hkv, dv});
      p.attn.block_table = dense(tablep, FA_INT32, dev, {B, pages_per});
      p.out = dense(out, FA_BFLOAT16, dev, {B, c.sq, c.hq, dv});
      p.lse = dense(lse, FA_FLOAT32, dev, {B, c.hq, c.sq});
    } else {
      p.attn.q = dense(q, FA_FLOAT8_E4M3, dev, {B, c.sq, c.hq, c.d});
      p.attn.k = dense(k, FA_FLOAT8_E4M3, dev, {B, c.sk, c.hkv, c.d});
      p.attn.v = dense(v, FA_FLOAT8_E4M3, dev, {B, c.sk, c.hkv, dv});
      p.out = dense(out, FA_BFLOAT16, dev, {B, c.sq, c.hq, dv});
      p.lse = dense(lse, FA_FLOAT32, dev, {B, c.hq, c.sq});
    }
    if (c.descale) {
      p.attn.q_descale = dense(qdp, FA_FLOAT32, dev, {B, q_heads});
      p.attn.k_descale = dense(kdp, FA_FLOAT32, dev, {B, c.hkv});
      p.attn.v_descale = dense(vdp, FA_FLOAT32, dev, {B, c.hkv});
    }
    if (!used.empty()) p.attn.seqused_k = dense(usedp, FA_INT32, dev, {B});
    if (c.sinks) p.attn.sinks = dense(sinkp, FA_FLOAT32, dev, {c.hq});
    if (c.alibi) p.attn.alibi_slopes = dense(slopep, FA_FLOAT32, dev, {c.hq});
    p.attn.softcap = c.softcap;
    p.attn.causal = c.causal;
    p.attn.causal_alignment = c.top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
    p.attn.window_left = c.wl;
    p.attn.window_right = c.wr;
    return p;
  };
  fa_fwd_params gp = params(FA_DEVICE_CUDA, dq.ptr, dk.ptr, dvv.ptr, dout.ptr, dlse.ptr, dqd.ptr, dkd.ptr, dvd.ptr,
                            dused.ptr, dsinks.ptr, dcu_q.ptr, dcu_k.ptr, dtable.ptr, dslopes.ptr);
  fa_exec exec = fa_exec_default();
  exec.num_splits = c.num_splits;
  const fa_status status = fa_forward(&gp, &exec);
  // Skips off Hopper and, on Hopper, in a ci kernel set without this head dim (FLASHATTN_REQUIRE_SM90 otherwise).
  if (status == FA_ERROR_UNSUPPORTED && (!sm90_required() || sm90_unavailable_message(fa_last_error())))
    GTEST_SKIP() << fa_last_error();
  ASSERT_EQ(status, FA_OK) << fa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_STREQ(fa_backend_name(&gp, &exec), "cuda-sm90");
  const std::vector<uint16_t> out = dout.download();
  const std::vector<float> lse = dlse.download();

  std::vector<uint16_t> host_out(no);
  std::vector<float> host_lse(nl);
  fa_fwd_params hp =
      params(FA_DEVICE_CPU, hq.data(), hk.data(), hv.data(), host_out.data(), host_lse.data(), qd.data(), kd.data(),
             vd.data(), used.data(), sinks.data(), cu_q.data(), cu_k.data(), table.data(), slopes.data());
  flashattn::detail::Problem prob;
  const flashattn::detail::Requirements cpu_req{0, 1, true, "cpu"};
  auto e = flashattn::detail::validate(hp.attn, hp.out, hp.lse, nullptr, nullptr, nullptr, nullptr,
                                       flashattn::detail::Direction::kForward, cpu_req, varlen ? cu_q.data() : nullptr,
                                       varlen ? cu_k.data() : nullptr, used.empty() ? nullptr : used.data(), &prob);
  ASSERT_TRUE(e.ok()) << e.message;

  struct Row {
    int64_t b, h, i;
  };
  std::vector<Row> rows;
  const bool full = nb * c.hq * rows_q <= kFullCheckRows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < c.hq && len_q(b) > 0; ++h)
      if (full) {
        for (int64_t i = 0; i < len_q(b); ++i) rows.push_back({b, h, i});
      } else {
        rows.push_back({b, h, 0});
        rows.push_back({b, h, len_q(b) - 1});
      }
  for (int s = 0; !full && s < kSampledRows; ++s) {
    const int64_t b = std::uniform_int_distribution<int64_t>(0, B - 1)(rng);
    if (len_q(b) == 0) continue;
    rows.push_back({b, std::uniform_int_distribution<int64_t>(0, c.hq - 1)(rng),
                    std::uniform_int_distribution<int64_t>(0, len_q(b) - 1)(rng)});
  }
  const int64_t n_rows = int64_t(rows.size());
  const size_t n_vals = static_cast<size_t>(n_rows * dv), n_stats = static_cast<size_t>(n_rows);
  std::vector<double> exact(n_vals), plain(n_vals), lse_exact(n_stats), lse_plain(n_stats);
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t k = 0; k < n_rows; ++k) {
    const Row& r = rows[size_t(k)];
    ref::forward_row(prob, ref::Rounding::kExact, r.b, r.h, r.i, &exact[size_t(k * dv)], &lse_exact[size_t(k)]);
    ref::forward_row(prob, ref::Rounding::kStorage, r.b, r.h, r.i, &plain[size_t(k * dv)], &lse_plain[size_t(k)]);
  }
  Comparison out_cmp(FA_FLOAT8_E4M3), lse_cmp(FA_FLOAT32);
  int64_t bad = 0;
  for (int64_t k = 0; k < n_rows; ++k) {
    const Row& r = rows[size_t(k)];
    const int64_t o = (q_row(r.b, r.i) * c.hq + r.h) * dv;
    for (int64_t col = 0; col < dv; ++col) {
      const double ours = from_storage(FA_BFLOAT16, out[size_t(o + col)]);
      bad += std::isnan(ours);
      out_cmp.add(ours, exact[size_t(k * dv + col)], plain[size_t(k * dv + col)]);
    }
    lse_cmp.add(lse[size_t(lse_at(r.b, r.h, r.i))], lse_exact[size_t(k)], lse_plain[size_t(k)]);
  }
  EXPECT_EQ(bad, 0) << "NaN outputs";
  EXPECT_TRUE(out_cmp.passed()) << "out: " << out_cmp.summary() << " over " << n_rows << " rows";
  EXPECT_TRUE(lse_cmp.passed()) << "lse: " << lse_cmp.summary();
  testing::Test::RecordProperty("out_err", std::to_string(out_cmp.max_err()));
  testing::Test::RecordProperty("out_plain_err", std::to_string(out_cmp.plain_max_err()));
}

std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> v;
  struct Mask {
    const char* name;
    bool causal, top_left;
    int64_t wl, wr;
  };
  const Mask masks[] = {{"none", false, false, -1, -1},
                        {"causal_br", true, false, -1, -1},
                        {"causal_tl", true, true, -1, -1},
                        {"window", false, false, 37, 5}};
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 17}, {239, 1}, {1, 239}, {113, 203}, {1023, 1024}};
  for (int64_t d : {64, 128, 256})
    for (auto [sq, sk] : shapes)
      for (const Mask& m : masks) {
        Fp8Case c;
        c.sq = sq, c.sk = sk, c.d = d;
        c.batch = sq * sk < 10000 ? 2 : 1;
        c.causal = m.causal, c.top_left = m.top_left, c.wl = m.wl, c.wr = m.wr;
        c.name = "fp8_" + std::to_string(sq) + "x" + std::to_string(sk) + "_d" + std::to_string(d) + "_" + m.name;
        v.push_back(c);
      }
  auto add = [&](const std::string& name, auto&& edit) {
    Fp8Case c;
    c.name = name;
    edit(c);
    v.push_back(c);
  };
  add("fp8_gqa6x2_qdescale_per_kv_head",
      [](Fp8Case& c) { c.hq = 6, c.hkv = 2, c.sq = 70, c.sk = 300, c.causal = true; });
  add("fp8_gqa8x1_qdescale_per_query_head",
      [](Fp8Case& c) { c.hq = 8, c.hkv = 1, c.sq = 70, c.sk = 300, c.descale = 2; });
  add("fp8_no_descale", [](Fp8Case& c) {
    c.sq = 90, c.sk = 150;
    c.descale = 0;
  });
  add("fp8_padded_d80_dv48", [](Fp8Case& c) { c.sq = 60, c.sk = 200, c.d = 80, c.dv = 48; });
  add("fp8_d96_dv128_causal", [](Fp8Case& c) { c.sq = 200, c.sk = 200, c.d = 96, c.dv = 128, c.causal = true; });
  add("fp8_seqused_nan_tail", [](Fp8Case& c) { c.batch = 3, c.sq = 5, c.sk = 300, c.seqused_k = {300, 129, 0}; });
  add("fp8_sinks_causal", [](Fp8Case& c) { c.sq = 100, c.sk = 100, c.sinks = true, c.causal = true; });
  add("fp8_decode_split_kv", [](Fp8Case& c) { c.sq = 1, c.sk = 5000, c.hq = 8, c.hkv = 2; });
  add("fp8_large_logits_d128", [](Fp8Case& c) { c.sq = 300, c.sk = 1500, c.q_gain = 30.f; });
  add("fp8_large_logits_d128_causal", [](Fp8Case& c) { c.sq = 300, c.sk = 1500, c.q_gain = 30.f, c.causal = true; });
  add("fp8_decode_split_kv_forced", [](Fp8Case& c) { c.sq = 3, c.sk = 2000, c.num_splits = 7, c.causal = true; });
  add("fp8_long_2048", [](Fp8Case& c) { c.sq = 2048, c.sk = 2048, c.hq = 4, c.hkv = 4; });
  // Varlen: sequences of odd lengths (empty ones included) packed back to back, so that a key block of one reaches
  // past its end into the next one's rows in K (masked) and would in V (the transposed copy pads each sequence).
  add("fp8_varlen_causal",
      [](Fp8Case& c) { c.lens_q = {1, 17, 0, 239, 64}, c.lens_k = {5, 17, 9, 300, 1}, c.causal = true; });
  add("fp8_varlen_window_gqa", [](Fp8Case& c) {
    c.lens_q = {130, 7, 400}, c.lens_k = {200, 385, 383}, c.hq = 6, c.hkv = 2, c.wl = 50, c.wr = 3;
  });
  add("fp8_varlen_d64_seqused_nan",
      [](Fp8Case& c) { c.lens_q = {3, 9}, c.lens_k = {500, 90}, c.d = 64, c.seqused_k = {129, 90}; });
  add("fp8_varlen_d256_long", [](Fp8Case& c) { c.lens_q = {1000, 1500}, c.lens_k = {1100, 1500}, c.d = 256; });
  // d128 without a window (the wide entry, whose block_k sets where the transposed copy starts each sequence): 225
  // and 447 keys (partial last blocks for 192- and for 224-key blocks), an empty sequence, one key, and NaN tails
  // past seqused_k; where the copy puts each sequence and where the kernel reads it must agree at every length.
  add("fp8_varlen_d128_wide_seqused_nan", [](Fp8Case& c) {
    c.lens_q = {40, 3, 0, 300, 17}, c.lens_k = {225, 1, 0, 447, 300}, c.seqused_k = {225, 1, 0, 400, 129};
  });
  // Paged caches, every load path of K: whole-block TMA boxes (page 256 at d64: a multiple of block_k 128), 16-row
  // boxes (pages 16, 48; d128 non-causal has 192-key blocks), the producer warp's cp.async rows (pages 1, 3); V is
  // the transposed copy gathered through the table. d128 without a window also at pages 3 and 448 (rows; 16-row
  // boxes, or whole blocks where block_k divides 448).
  const std::tuple<int64_t, int64_t, bool> paged_cases[] = {{256, 64, false}, {16, 128, false}, {48, 128, true},
                                                            {1, 256, false},  {3, 64, true},    {256, 128, false},
                                                            {3, 128, false},  {448, 128, false}};
  for (const auto& pc : paged_cases) {
    const int64_t page = std::get<0>(pc), d = std::get<1>(pc);
    const bool causal = std::get<2>(pc);
    add("fp8_paged" + std::to_string(page) + "_d" + std::to_string(d) + (causal ? "_causal" : ""), [&](Fp8Case& c) {
      c.batch = 2, c.sq = 33, c.sk = 700, c.hq = 4, c.hkv = 2, c.d = d, c.page_size = page, c.causal = causal;
    });
  }
  // Score modifiers: q_descale * k_descale inside softcap's tanh, ALiBi in logit units.
  add("fp8_softcap_causal", [](Fp8Case& c) { c.sq = 200, c.sk = 300, c.softcap = 5.f, c.causal = true; });
  add("fp8_alibi_gqa", [](Fp8Case& c) { c.sq = 90, c.sk = 400, c.hq = 6, c.hkv = 2, c.alibi = true; });
  add("fp8_softcap_alibi_d256", [](Fp8Case& c) { c.sq = 64, c.sk = 257, c.d = 256, c.softcap = 20.f, c.alibi = true; });
  add("fp8_softcap_varlen_d64",
      [](Fp8Case& c) { c.lens_q = {7, 100}, c.lens_k = {300, 100}, c.d = 64, c.softcap = 3.f, c.causal = true; });
  add("fp8_paged16_decode_split_seqused", [](Fp8Case& c) {
    c.batch = 3, c.sq = 1, c.sk = 3000, c.hq = 8, c.hkv = 2, c.page_size = 16, c.seqused_k = {3000, 1777, 1};
  });
  return v;
}

class Fp8Forward : public testing::TestWithParam<Fp8Case> {};
TEST_P(Fp8Forward, MatchesReference) {
  SKIP_WITHOUT_GPU();
  run_fp8(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Sm90, Fp8Forward, testing::ValuesIn(fp8_cases()),
                         [](const testing::TestParamInfo<Fp8Case>& i) { return i.param.name; });
// The compute-sanitizer subset: one small case per head dim and the split-KV decode.
INSTANTIATE_TEST_SUITE_P(Fp8Sanitizer, Fp8Forward,
                         testing::Values(
                             [] {
                               Fp8Case c;
                               c.name = "san_fp8_113x203_causal_gqa";
                               c.sq = 113, c.sk = 203, c.hq = 4, c.hkv = 2, c.causal = true;
                               return c;
                             }(),
                             [] {
                               Fp8Case c;
                               c.name = "san_fp8_decode_split_d256";
                               c.sq = 1, c.sk = 3000, c.d = 256, c.seqused_k = {2999};
                               return c;
                             }(),
                             [] {
                               Fp8Case c;
                               c.name = "san_fp8_d64_window";
                               c.sq = 150, c.sk = 90, c.d = 64, c.wl = 20, c.wr = 7;
                               return c;
                             }(),
                             [] {
                               Fp8Case c;
                               c.name = "san_fp8_varlen_causal";
                               c.lens_q = {5, 0, 130}, c.lens_k = {400, 3, 130}, c.causal = true;
                               return c;
                             }(),
                             [] {
                               Fp8Case c;
                               c.name = "san_fp8_paged3";
                               c.batch = 2, c.sq = 9, c.sk = 200, c.page_size = 3;
                               return c;
                             }(),
                             [] {
                               Fp8Case c;
                               c.name = "san_fp8_paged16";
                               c.batch = 2, c.sq = 9, c.sk = 200, c.page_size = 16, c.d = 64;
                               return c;
                             }()),
                         [](const testing::TestParamInfo<Fp8Case>& i) { return i.param.name; });

// What the FP8 path does not take on CUDA yet says so, naming the argument.
TEST(Fp8Forward, UnsupportedOnCudaNamesTheReason) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> q(64 * 4), k(64 * 4), v(64 * 4);
  DeviceBuffer<uint16_t> out(64 * 4);
  fa_fwd_params p{};
  p.attn = fa_attention_default();
  p.attn.q = dense(q.ptr, FA_FLOAT8_E4M3, FA_DEVICE_CUDA, {1, 4, 1, 64});
  p.attn.k = dense(k.ptr, FA_FLOAT8_E4M3, FA_DEVICE_CUDA, {1, 4, 1, 64});
  p.attn.v = dense(v.ptr, FA_FLOAT8_E4M3, FA_DEVICE_CUDA, {1, 4, 1, 64});
  p.out = dense(out.ptr, FA_BFLOAT16, FA_DEVICE_CUDA, {1, 4, 1, 64});
  p.attn.dropout_p = 0.1f;
  EXPECT_EQ(fa_forward(&p, nullptr), FA_ERROR_UNSUPPORTED);
  const std::string dropout = fa_last_error();
  EXPECT_TRUE(dropout.find("dropout_p: the cuda-sm90 FP8 forward has no dropout") != std::string::npos ||
              dropout.find("float8_e4m3fn inputs run on the cuda-sm90 backend only") != std::string::npos)
      << dropout;
}

// fa_quantize_fp8 on the GPU writes the CPU's bytes and factors (the same rotation and rounding), with and without
// the rotation, on x in each storage dtype.
TEST(Fp8Quantize, GpuWritesTheCpuBytes) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, S = 333, H = 3, D = 128;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::bernoulli_distribution outlier(0.001);
  std::vector<float> x(size_t(B * S * H * D));
  for (float& v : x) v = normal(rng) + (outlier(rng) ? 10.f * normal(rng) : 0.f);
  for (fa_dtype t : {FA_FLOAT32, FA_BFLOAT16})
    for (int hadamard : {0, 1}) {
      SCOPED_TRACE(std::string(t == FA_FLOAT32 ? "fp32" : "bf16") + (hadamard ? " hadamard" : ""));
      std::vector<uint8_t> bytes;
      if (t == FA_FLOAT32) {
        bytes.resize(x.size() * 4);
        std::memcpy(bytes.data(), x.data(), bytes.size());
      } else {
        bytes.resize(x.size() * 2);
        for (size_t i = 0; i < x.size(); ++i) {
          const uint16_t h = flashattn::cpu::float_to_bf16(x[i]);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
      }
      DeviceBuffer<uint8_t> dx(bytes.size()), dout(x.size());
      DeviceBuffer<float> ddescale(size_t(B * H));
      dx.upload(bytes);
      std::vector<uint8_t> host_out(x.size());
      std::vector<float> host_descale(size_t(B * H));
      auto params = [&](fa_device dev, void* in, void* out, void* f) {
        fa_quantize_params p{};
        p.x = dense(in, t, dev, {B, S, H, D});
        p.out = dense(out, FA_FLOAT8_E4M3, dev, {B, S, H, D});
        p.descale = dense(f, FA_FLOAT32, dev, {B, H});
        p.hadamard = hadamard;
        p.seed = 77;
        return p;
      };
      fa_quantize_params gp = params(FA_DEVICE_CUDA, dx.ptr, dout.ptr, ddescale.ptr);
      fa_quantize_params hp = params(FA_DEVICE_CPU, bytes.data(), host_out.data(), host_descale.data());
      ASSERT_EQ(fa_quantize_fp8(&gp, nullptr), FA_OK) << fa_last_error();
      ASSERT_EQ(fa_quantize_fp8(&hp, nullptr), FA_OK) << fa_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(ddescale.download(), host_descale);
      const std::vector<uint8_t> got = dout.download();
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != host_out[i];
      EXPECT_EQ(differ, 0u) << "of " << got.size() << " bytes";
    }
}

}  // namespace
