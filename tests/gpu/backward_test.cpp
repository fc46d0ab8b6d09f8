// GPU correctness of fa_backward (cuda-sm80 and cuda-sm90) against the float64 reference (src/cpu/reference.hpp).
// Every case: fresh random q, k, v, dO; out and LSE from the GPU forward (itself checked by forward_test.cpp);
// dq, dk, dv poisoned with NaN before the backward; then per tensor the suites' one rule (docs/testing.md,
// reference::Comparison): max |ours - exact| <= 2 * max |plain low-precision - exact| + one storage ulp at the
// largest reference magnitude, NaN never passes. Deterministic mode is also checked for bit-identical reruns.
// Skips (GTEST_SKIP) when no CUDA device is present.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cpu/numeric.hpp"
#include "cpu/reference.hpp"
#include "flashattn/flashattn.h"
#include "gpu_support.hpp"

namespace {

using namespace flashattn::gpu_testing;
using flashattn::detail::Problem;
namespace ref = flashattn::reference;

std::string bwd_case_name(const testing::TestParamInfo<Case>& i) { return i.param.name; }

void run_backward_case(const Case& c) {
  ASSERT_EQ(fields_not_built_here(c), "") << "the GPU runners do not build these fields";
  CaseGeometry geo(c);  // non-const: the host reference reads cu_seqlens through void*
  auto& [varlen, batch, cu_q, cu_k, rows_q, rows_k, nb] = geo;
  const int64_t pad = c.row_pad, dim_v = c.value_dim();
  const int64_t gq = nb * rows_q, gk = nb * rows_k;  // global rows
  const size_t nq = size_t(gq * (c.hq * c.d + pad)), nk = size_t(gk * (c.hkv * c.d + pad));
  const size_t nv = size_t(gk * (c.hkv * dim_v + pad)), no = size_t(gq * (c.hq * dim_v + pad));
  const size_t nl = size_t(nb * c.hq * rows_q);

  std::mt19937 rng(std::hash<std::string>{}("bwd_" + c.name));
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = to_storage(c.dtype, normal(rng));
    return h;
  };
  std::vector<uint16_t> hq = fill(nq), hk = fill(nk), hv = fill(nv), hdo = fill(no);
  std::vector<float> slopes;
  if (c.alibi != Alibi::kNone) {
    std::uniform_real_distribution<float> u(0.05f, 0.5f);
    slopes.resize(size_t((c.alibi == Alibi::kBatch ? batch : 1) * c.hq));
    for (auto& s : slopes) s = u(rng);
  }
  std::vector<int32_t> used(c.seqused_k.begin(), c.seqused_k.end());
  std::vector<float> sink_logits;
  if (c.sinks) {
    std::uniform_real_distribution<float> u(-2.f, 4.f);
    sink_logits.resize(size_t(c.hq));
    for (auto& s : sink_logits) s = u(rng);
  }

  DeviceBuffer<uint16_t> q(nq), k(nk), v(nv), out(no), dout(no), dq(nq), dk(nk), dv(nv);
  DeviceBuffer<float> lse(nl), sl(slopes.size()), dsink_logits(sink_logits.size()), ddsinks(sink_logits.size());
  DeviceBuffer<int32_t> dcu_q(cu_q.size()), dcu_k(cu_k.size()), dused(used.size());
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && out.ptr && dout.ptr && dq.ptr && dk.ptr && dv.ptr && lse.ptr);
  q.upload(hq);
  k.upload(hk);
  v.upload(hv);
  dout.upload(hdo);
  if (!slopes.empty()) sl.upload(slopes);
  if (!sink_logits.empty()) dsink_logits.upload(sink_logits);
  if (varlen) {
    dcu_q.upload(cu_q);
    dcu_k.upload(cu_k);
  }
  if (!used.empty()) dused.upload(used);
  std::vector<uint64_t> host_rng = {c.dropout_seed, c.dropout_offset};
  DeviceBuffer<uint64_t> drng(2);
  drng.upload(host_rng);

  struct Ptrs {
    void *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *cuq, *cuk, *used, *slopes, *sinks, *dsinks;
  };
  auto make = [&](fa_device dev, const Ptrs& x) {
    fa_bwd_params p{};
    p.attn = fa_attention_default();
    p.attn.q = view(x.q, c.dtype, dev, varlen, batch, rows_q, c.hq, c.d, pad);
    p.attn.k = view(x.k, c.dtype, dev, varlen, batch, rows_k, c.hkv, c.d, pad);
    p.attn.v = view(x.v, c.dtype, dev, varlen, batch, rows_k, c.hkv, dim_v, pad);
    p.out = view(x.out, c.dtype, dev, varlen, batch, rows_q, c.hq, dim_v, pad);
    p.dout = view(x.dout, c.dtype, dev, varlen, batch, rows_q, c.hq, dim_v, pad);
    p.dq = view(x.dq, c.dtype, dev, varlen, batch, rows_q, c.hq, c.d, pad);
    p.dk = view(x.dk, c.dtype, dev, varlen, batch, rows_k, c.hkv, c.d, pad);
    p.dv = view(x.dv, c.dtype, dev, varlen, batch, rows_k, c.hkv, dim_v, pad);
    if (varlen) {
      int64_t s[2] = {c.hq, rows_q};
      p.lse = fa_make_tensor(x.lse, FA_FLOAT32, dev, 2, s);
      int64_t nc = int64_t(cu_q.size());
      p.attn.cu_seqlens_q = fa_make_tensor(x.cuq, FA_INT32, dev, 1, &nc);
      p.attn.cu_seqlens_k = fa_make_tensor(x.cuk, FA_INT32, dev, 1, &nc);
      p.attn.max_seqlen_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
      p.attn.max_seqlen_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
    } else {
      int64_t s[3] = {batch, c.hq, rows_q};
      p.lse = fa_make_tensor(x.lse, FA_FLOAT32, dev, 3, s);
    }
    if (!used.empty()) {
      int64_t nu = int64_t(used.size());
      p.attn.seqused_k = fa_make_tensor(x.used, FA_INT32, dev, 1, &nu);
    }
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
    if (c.alibi == Alibi::kHeads) p.attn.alibi_slopes = fa_make_tensor(x.slopes, FA_FLOAT32, dev, 1, &c.hq);
    if (c.alibi == Alibi::kBatch) {
      int64_t s[2] = {batch, c.hq};
      p.attn.alibi_slopes = fa_make_tensor(x.slopes, FA_FLOAT32, dev, 2, s);
    }
    if (c.sinks) {
      p.attn.sinks = fa_make_tensor(x.sinks, FA_FLOAT32, dev, 1, &c.hq);
      p.dsinks = fa_make_tensor(x.dsinks, FA_FLOAT32, dev, 1, &c.hq);
    }
    return p;
  };

  const Ptrs gpu{q.ptr,  k.ptr,     v.ptr,     out.ptr,   lse.ptr, dout.ptr,         dq.ptr,     dk.ptr,
                 dv.ptr, dcu_q.ptr, dcu_k.ptr, dused.ptr, sl.ptr,  dsink_logits.ptr, ddsinks.ptr};
  fa_bwd_params gp = make(FA_DEVICE_CUDA, gpu);
  fa_fwd_params fp{};
  fp.attn = gp.attn;
  fp.out = gp.out;
  fp.lse = gp.lse;
  fa_exec exec = fa_exec_default();
  exec.deterministic = c.deterministic;
  exec.backend = c.backend;
  const fa_status fwd_status = fa_forward(&fp, &exec);
  if (fwd_status == FA_ERROR_UNSUPPORTED && c.backend == FA_BACKEND_CUDA_SM90 &&
      sm90_unavailable_message(fa_last_error()))
    GTEST_SKIP() << fa_last_error();
  ASSERT_EQ(fwd_status, FA_OK) << fa_last_error();
  // Poison: all-ones bits are NaN in fp16 and bf16.
  ASSERT_EQ(cudaMemset(dq.ptr, 0xff, nq * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dk.ptr, 0xff, nk * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dv.ptr, 0xff, nv * 2), cudaSuccess);
  if (c.sinks) ASSERT_EQ(cudaMemset(ddsinks.ptr, 0xff, sink_logits.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(fa_backward(&gp, &exec), FA_OK) << fa_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The kernels that ran, as the plan names them: cuda-sm90 takes fp16/bf16 at every head dim up to 256 (above 128
  // the head-dim-split mainloop), with or without dropout or deterministic mode, without softcap or ALiBi
  // (plan.cpp); everything else is the sm80 backward.
  fa_plan_info plan{};
  ASSERT_EQ(fa_backward_plan(&gp, &exec, &plan), FA_OK) << fa_last_error();
  const bool sm90_takes =
      c.backend == FA_BACKEND_CUDA_SM90 && std::max(c.d, dim_v) <= 256 && c.softcap == 0.f && c.alibi == Alibi::kNone;
  EXPECT_STREQ(plan.kernels, sm90_takes ? "cuda-sm90" : "cuda-sm80");
  const std::vector<uint16_t> got_q = dq.download(), got_k = dk.download(), got_v = dv.download();
  const std::vector<float> got_dsinks = c.sinks ? ddsinks.download() : std::vector<float>{};

  if (c.deterministic) {  // a second run (poisoned again) must reproduce every bit
    ASSERT_EQ(cudaMemset(dq.ptr, 0xff, nq * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(dk.ptr, 0xff, nk * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(dv.ptr, 0xff, nv * 2), cudaSuccess);
    ASSERT_EQ(fa_backward(&gp, &exec), FA_OK) << fa_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dq.download() == got_q) << "dq differs between two deterministic runs";
    EXPECT_TRUE(dk.download() == got_k) << "dk differs between two deterministic runs";
    EXPECT_TRUE(dv.download() == got_v) << "dv differs between two deterministic runs";
  }

  // The reference reads host memory: the same call with host tensors (out/lse as the GPU forward wrote them).
  std::vector<uint16_t> host_out = out.download();
  std::vector<float> host_lse = lse.download();
  std::vector<uint16_t> unused_q(nq), unused_k(nk), unused_v(nv);
  std::vector<float> unused_dsinks(sink_logits.size());
  const Ptrs host{hq.data(),   hk.data(),       hv.data(),       host_out.data(),    host_lse.data(),
                  hdo.data(),  unused_q.data(), unused_k.data(), unused_v.data(),    cu_q.data(),
                  cu_k.data(), used.data(),     slopes.data(),   sink_logits.data(), unused_dsinks.data()};
  fa_bwd_params hp = make(FA_DEVICE_CPU, host);
  Problem prob;
  const flashattn::detail::Requirements cpu_req{0, 1, true, "cpu"};
  auto e = flashattn::detail::validate(hp.attn, hp.out, hp.lse, &hp.dout, &hp.dq, &hp.dk, &hp.dv,
                                       flashattn::detail::Direction::kBackward, cpu_req, varlen ? cu_q.data() : nullptr,
                                       varlen ? cu_k.data() : nullptr, used.empty() ? nullptr : used.data(), &prob,
                                       c.sinks ? &hp.dsinks : nullptr);
  ASSERT_TRUE(e.ok()) << e.message;
  ref::Grads exact, plain;
  // The float64 reference dominates the run time: the two roundings run side by side.
#pragma omp parallel sections num_threads(2)
  {
#pragma omp section
    ref::backward(prob, ref::Rounding::kExact, &exact);
#pragma omp section
    ref::backward(prob, ref::Rounding::kStorage, &plain);
  }

  // Reference rows are global rows (batched b * S + r), heads outermost; ours: g * (heads*dim + pad) + h*dim + c.
  // Only rows inside a sequence are compared (varlen tensors have no others here).
  // noise: the reference's allowance for dq / dk (Grads::dq_noise: rounding FlashAttention's D = rowsum(dO * O)
  // cannot avoid where the exact gradient cancels), empty for dv.
  auto compare = [&](const char* what, const std::vector<uint16_t>& ours, const std::vector<double>& ex,
                     const std::vector<double>& pl, const std::vector<double>& noise, int64_t heads, int64_t rows,
                     int64_t dim) {
    Comparison cmp(c.dtype);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t g = 0; g < rows; ++g)
        for (int64_t col = 0; col < dim; ++col) {
          const size_t r = size_t((h * rows + g) * dim + col);
          cmp.add(from_storage(c.dtype, ours[size_t(g * (heads * dim + pad) + h * dim + col)]), ex[r], pl[r],
                  noise.empty() ? 0.0 : noise[r]);
        }
    EXPECT_TRUE(cmp.passed()) << what << ": " << cmp.summary();
    testing::Test::RecordProperty(std::string(what) + "_err", std::to_string(cmp.max_err()));
  };
  compare("dq", got_q, exact.dq, plain.dq, exact.dq_noise, c.hq, gq, c.d);
  compare("dk", got_k, exact.dk, plain.dk, exact.dk_noise, c.hkv, gk, c.d);
  compare("dv", got_v, exact.dv, plain.dv, {}, c.hkv, gk, dim_v);
  if (c.sinks) {  // with the storage dtype's floor, as in the CPU suites (tests/attention_case.cpp)
    Comparison cmp(c.dtype);
    for (int64_t h = 0; h < c.hq; ++h) cmp.add(got_dsinks[size_t(h)], exact.dsinks[size_t(h)], plain.dsinks[size_t(h)]);
    EXPECT_TRUE(cmp.passed()) << "dsinks: " << cmp.summary();
  }
}

// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> backward_cases() {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 17}, {239, 1}, {113, 203}, {255, 256}};
  const int64_t hdims[] = {64, 96, 128, 256, 64};
  std::vector<Case> v = shape_mask_grid(shapes, hdims, kCommonMasks);
  auto add = [&](Case c) { v.push_back(c); };
  // 160 and 192: the d192 kernel of FLASHATTN_KERNELS=all (padded and exact); the d256 one otherwise.
  for (int64_t d : {8, 72, 128, 160, 192, 200, 256}) {
    Case c; c.sq = 90, c.sk = 150, c.d = c.dv = d, c.causal = true;
    c.name = "hdim" + std::to_string(d) + "_causal"; add(c);
  }
  {  // dv != d
    Case c; c.sq = 100, c.sk = 150, c.d = 128, c.dv = 64; c.name = "d128_dv64"; add(c);
    c.name = "d64_dv128_causal"; c.d = 64, c.dv = 128, c.causal = true; add(c);
    c.name = "d72_dv200_fp16"; c.dtype = FA_FLOAT16; c.d = 72, c.dv = 200, c.causal = false; add(c);
  }
  {  // GQA / MQA
    Case c; c.sq = 130, c.sk = 160, c.d = c.dv = 64;
    c.name = "gqa_8to1"; c.hq = 8, c.hkv = 1; add(c);
    c.name = "gqa_6to2_causal"; c.hq = 6, c.hkv = 2, c.causal = true; add(c);
    c.name = "gqa_6to2_causal_deterministic"; c.deterministic = true; add(c);
  }
  {  // softcap, ALiBi
    Case c; c.sq = 120, c.sk = 201, c.d = c.dv = 128;
    c.name = "softcap"; c.softcap = 5.f; add(c);
    c.name = "softcap_causal_fp16"; c.dtype = FA_FLOAT16; c.causal = true; add(c);
    c.softcap = 0.f; c.dtype = FA_BFLOAT16;
    c.name = "alibi"; c.alibi = Alibi::kHeads; c.causal = false; add(c);
    c.name = "alibi_batch_causal"; c.alibi = Alibi::kBatch; c.batch = 2; c.causal = true; add(c);
    c.name = "alibi_softcap_window"; c.alibi = Alibi::kHeads; c.softcap = 3.f; c.wl = 50, c.wr = 10; c.causal = false; add(c);
  }
  {  // learnable sinks: dsinks from the backward's D (both families; sm90: d <= 128 without softcap)
    Case c; c.sq = 130, c.sk = 90, c.hq = 4, c.hkv = 2; c.sinks = true; c.causal = true;
    c.name = "sinks_causal_gqa"; add(c);
    c.name = "sinks_window_d128_fp16"; c.causal = false; c.wl = 20, c.wr = 3; c.d = c.dv = 128; c.dtype = FA_FLOAT16; add(c);
    Case v; v.hq = 4, v.hkv = 4; v.sinks = true; v.lens_q = {5, 0, 40}; v.lens_k = {300, 7, 1}; v.causal = true;
    v.name = "sinks_varlen_causal"; add(v);
  }
  {  // varlen, seqused_k, strided, deterministic
    Case c; c.d = c.dv = 64;
    c.name = "varlen"; c.lens_q = {1, 17, 0, 239, 128, 90}; c.lens_k = {1, 33, 5, 239, 1, 129}; add(c);
    c.name = "varlen_causal_d128"; c.d = c.dv = 128; c.causal = true; add(c);
    c.name = "varlen_window_tl_gqa"; c.hq = 4, c.hkv = 2; c.causal = false; c.wl = 20, c.wr = 20; c.top_left = true; add(c);
    c.name = "varlen_window_tl_gqa_deterministic"; c.deterministic = true; add(c);
    // Several query blocks per sequence at d64 (sm90 block_q 128), the last one short: its rows are zeroed
    // (q_tails) while earlier steps' tiles are still in the pipeline.
    Case l; l.d = l.dv = 64; l.lens_q = {300, 129, 257}; l.lens_k = {300, 400, 100}; l.causal = true;
    l.name = "varlen_multiblock_causal"; add(l);
    Case u; u.d = u.dv = 128; u.batch = 3; u.sq = 70, u.sk = 200;
    u.name = "seqused_k"; u.seqused_k = {0, 77, 200}; add(u);
    u.name = "seqused_k_causal_varlen"; u.lens_q = {50, 64, 3}; u.lens_k = {100, 64, 130}; u.seqused_k = {60, 0, 130}; u.causal = true; add(u);
    Case s; s.sq = 97, s.sk = 143, s.d = s.dv = 64; s.row_pad = 8; s.hq = 3, s.hkv = 3;
    s.name = "strided_rows"; add(s);
    s.name = "strided_rows_deterministic"; s.deterministic = true; add(s);
    Case w; w.sq = 255, w.sk = 256, w.d = w.dv = 128; w.causal = true;
    w.name = "d128_causal_deterministic"; w.deterministic = true; add(w);
    w.name = "d256_window_softcap_deterministic"; w.d = w.dv = 256; w.causal = false; w.wl = 40, w.wr = 7; w.softcap = 4.f; add(w);
    // Many key blocks adding into each dQ tile in turn (sm90: ordered behind the tile's counter, highest key block
    // first). A right window edge or causal mask makes a query block's last key block depend on the block
    // (last_key_block), in both causal alignments; causal with more queries than keys leaves the first query blocks
    // without any, and the window's left edge leaves the lowest key blocks out of the later ones.
    Case o; o.sq = 600, o.sk = 900, o.d = o.dv = 64; o.hq = 4, o.hkv = 2; o.deterministic = true;
    o.name = "multiblock_gqa_deterministic"; add(o);
    o.name = "multiblock_causal_more_keys_deterministic"; o.sq = 500, o.sk = 900; o.causal = true; add(o);
    o.name = "multiblock_causal_more_queries_deterministic"; o.sq = 900, o.sk = 500; add(o);
    Case ow; ow.d = ow.dv = 128; ow.lens_q = {300, 517}; ow.lens_k = {700, 260}; ow.wl = 150, ow.wr = 30; ow.deterministic = true;
    ow.name = "varlen_multiblock_window_d128_deterministic"; add(ow);
    ow.name = "varlen_multiblock_window_seqused_k_deterministic"; ow.seqused_k = {650, 200}; add(ow);
    ow.name = "varlen_multiblock_window_d256_deterministic"; ow.d = ow.dv = 256; ow.seqused_k = {}; add(ow);
    o.name = "multiblock_causal_d256_deterministic"; o.d = o.dv = 256; o.sq = 300, o.sk = 400; add(o);
  }
  return v;
}
// clang-format on

// Dropout (the Dropout variants of both families, forward and backward): the reference regenerates the same mask
// (core/dropout.hpp). Odd shapes and every mask, each tile's head dim and a padded one, GQA, varlen, softcap +
// ALiBi, sinks, deterministic dQ, an offset with high bits.
// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> dropout_backward_cases() {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 17}, {239, 1}, {113, 203}, {255, 256}};
  const int64_t hdims[] = {64, 96, 128, 256, 64};
  std::vector<Case> v = shape_mask_grid(shapes, hdims, kCommonMasks);
  for (Case& c : v) c.dropout_p = 0.17f, c.name += "_dropout";
  auto add = [&](Case c) { c.dropout_p = c.dropout_p > 0.f ? c.dropout_p : 0.1f; v.push_back(c); };
  Case g; g.sq = 130, g.sk = 160, g.d = g.dv = 64, g.hq = 6, g.hkv = 2, g.causal = true;
  g.name = "dropout_gqa_causal"; add(g);
  g.name = "dropout_gqa_causal_deterministic"; g.deterministic = true; add(g);
  g.name = "dropout_p05_offset_high_bits"; g.deterministic = false; g.dropout_p = 0.5f; g.dropout_seed = 0x123456789abcdefull; g.dropout_offset = (uint64_t(3) << 40) + 77; add(g);
  g.name = "dropout_p05_rng_tensor"; g.dropout_rng = true; add(g);
  Case m; m.sq = 120, m.sk = 201, m.d = m.dv = 128; m.softcap = 5.f; m.alibi = Alibi::kHeads; m.causal = true;
  m.name = "dropout_softcap_alibi_causal"; add(m);
  Case s; s.sq = 130, s.sk = 90, s.hq = 4, s.hkv = 2; s.sinks = true; s.causal = true;
  s.name = "dropout_sinks_causal_gqa"; add(s);
  Case u; u.d = u.dv = 72; u.lens_q = {1, 17, 0, 239, 128, 90}; u.lens_k = {1, 33, 5, 239, 1, 129}; u.wl = 20, u.wr = 20;
  u.name = "dropout_varlen_window_d72"; add(u);
  return v;
}
// clang-format on

class Backward : public testing::TestWithParam<Case> {};
TEST_P(Backward, MatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_backward_case(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Sm80Dropout, Backward,
                         testing::ValuesIn(for_backends(dropout_backward_cases(), {FA_BACKEND_CUDA_SM80})),
                         bwd_case_name);
// The sm90 dropout kernels: the same table but softcap + ALiBi (whose forward runs on sm80 only; deterministic dQ
// runs the sm80 backward after the sm90 forward), and keys of many blocks at each mainloop's head dims.
// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> sm90_dropout_backward_cases() {
  std::vector<Case> v;
  for (const Case& c : dropout_backward_cases())
    if (c.softcap == 0.f && c.alibi == Alibi::kNone) v.push_back(c);
  for (int64_t d : {64, 128, 192, 256}) {
    Case l; l.sq = 300, l.sk = 530, l.hq = 4, l.hkv = 2, l.d = l.dv = d; l.dropout_p = 0.1f;
    l.name = "dropout_long_gqa_d" + std::to_string(d); v.push_back(l);
    l.name = "dropout_long_gqa_causal_d" + std::to_string(d); l.causal = true; v.push_back(l);
  }
  return v;
}
// clang-format on
INSTANTIATE_TEST_SUITE_P(Sm90Dropout, Backward,
                         testing::ValuesIn(for_backends(sm90_dropout_backward_cases(), {FA_BACKEND_CUDA_SM90})),
                         bwd_case_name);
// Both families: on a Hopper GPU cuda-sm90 runs its own backward wherever its plan takes the problem (and the
// sm80 one elsewhere: softcap, ALiBi, deterministic).
INSTANTIATE_TEST_SUITE_P(Sm80, Backward, testing::ValuesIn(for_backends(backward_cases(), {FA_BACKEND_CUDA_SM80})),
                         bwd_case_name);
INSTANTIATE_TEST_SUITE_P(Sm90, Backward, testing::ValuesIn(for_backends(backward_cases(), {FA_BACKEND_CUDA_SM90})),
                         bwd_case_name);

// The small subset for compute-sanitizer: each backward kernel (atomic and deterministic dQ, GQA reduce,
// every compiled head dim) at sizes that run fast under instrumentation. Picked up by --gtest_filter='Sanitizer*'.
// A hand-aligned case table: one case or rule per line.
// clang-format off
std::vector<Case> backward_sanitizer_cases() {
  std::vector<Case> v;
  for (int64_t d : {64, 128, 256}) {
    Case c; c.sq = 70, c.sk = 45, c.d = c.dv = d;
    c.name = "bwd_d" + std::to_string(d) + "_causal"; c.causal = true; v.push_back(c);
  }
  Case pad; pad.sq = 70, pad.sk = 45, pad.d = pad.dv = 200; pad.name = "bwd_d200_padded"; v.push_back(pad);
  Case mb; mb.sq = 300, mb.sk = 140, mb.d = mb.dv = 64; mb.name = "bwd_d64_multiblock"; v.push_back(mb);
  Case g; g.sq = 40, g.sk = 70, g.hq = 4, g.hkv = 2; g.deterministic = true;
  g.name = "bwd_gqa_deterministic"; v.push_back(g);
  Case vg; vg.lens_q = {3, 70, 130}; vg.lens_k = {40, 9, 150}; vg.hq = 4, vg.hkv = 2; vg.wl = 10, vg.wr = 4;
  vg.name = "bwd_varlen_window_gqa_d64"; v.push_back(vg);
  vg.name = "bwd_varlen_window_gqa_d64_deterministic"; vg.deterministic = true; v.push_back(vg);
  Case dd; dd.sq = 130, dd.sk = 150, dd.d = dd.dv = 256; dd.causal = true; dd.deterministic = true;
  dd.name = "bwd_d256_causal_multiblock_deterministic"; v.push_back(dd);
  Case c; c.d = c.dv = 72; c.lens_q = {3, 70}; c.lens_k = {40, 9}; c.wl = 10, c.wr = 4; c.alibi = Alibi::kHeads; c.softcap = 2.f;
  c.name = "bwd_varlen_window_alibi_softcap_d72"; v.push_back(c);
  return v;
}
// clang-format on
// Both families, the sm80 dropout kernels (causal GQA, and padded varlen with deterministic dQ) and the sm90 ones
// (causal GQA at both mainloops' head dims, padded varlen).
std::vector<Case> all_backward_sanitizer_cases() {
  std::vector<Case> v = for_backends(backward_sanitizer_cases(), {FA_BACKEND_CUDA_SM80, FA_BACKEND_CUDA_SM90});
  Case c;
  c.sq = 70, c.sk = 130, c.hq = 4, c.hkv = 2, c.d = c.dv = 64, c.causal = true, c.dropout_p = 0.2f;
  c.name = "dropout_gqa_causal";
  Case u;
  u.d = u.dv = 72, u.lens_q = {3, 70}, u.lens_k = {50, 9}, u.dropout_p = 0.3f, u.deterministic = true;
  u.name = "dropout_varlen_d72_deterministic";
  for (const Case& d : for_backends({c, u}, {FA_BACKEND_CUDA_SM80})) v.push_back(d);
  Case c256 = c;
  c256.d = c256.dv = 256, c256.name = "dropout_gqa_causal_d256";
  Case n = u;
  n.deterministic = false, n.name = "dropout_varlen_d72";
  for (const Case& d : for_backends({c, c256, n}, {FA_BACKEND_CUDA_SM90})) v.push_back(d);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Sanitizer, Backward, testing::ValuesIn(all_backward_sanitizer_cases()), bwd_case_name);

}  // namespace
