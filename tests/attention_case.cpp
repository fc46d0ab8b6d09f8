#include "attention_case.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "cpu/numeric.hpp"

namespace flashattn::testing {

namespace {

void fill_random(std::vector<uint8_t>* buf, size_t n, fa_dtype t, std::mt19937_64& rng, float gain = 1.f) {
  std::normal_distribution<float> dist(0.f, t == FA_FLOAT8_E4M3 ? 1.f : gain);  // FP8: the gain is in the factors
  buf->assign(n * dtype_size(t), 0);
  for (size_t i = 0; i < n; ++i) {
    float x = dist(rng);
    if (t == FA_FLOAT8_E4M3) {
      // Quantised data spans e4m3's grid (about |x| * 64 up to 448); the factors bring it back near N(0, 1).
      buf->data()[i] = cpu::float_to_e4m3(x * 64.f);
    } else if (t == FA_FLOAT32) {
      std::memcpy(buf->data() + i * 4, &x, 4);
    } else {
      uint16_t h = t == FA_BFLOAT16 ? cpu::float_to_bf16(x) : cpu::float_to_fp16(x);
      std::memcpy(buf->data() + i * 2, &h, 2);
    }
  }
}

// All-ones bytes are NaN in fp32, fp16 and bf16: an unwritten output never passes.
void poison(std::vector<uint8_t>* buf, size_t bytes) { buf->assign(bytes, 0xff); }

}  // namespace

Problem::Problem(const Case& c_) : c(c_) {
  std::mt19937_64 rng(c.seed);
  if (c.dropout_rng) dropout_rng = {c.dropout_seed, c.dropout_offset};
  if (c.varlen()) {
    cu_q.push_back(0);
    cu_k.push_back(0);
    for (size_t b = 0; b < c.lens_q.size(); ++b) {
      cu_q.push_back(cu_q.back() + c.lens_q[b]);
      cu_k.push_back(cu_k.back() + c.lens_k[b]);
      max_q = std::max<int64_t>(max_q, c.lens_q[b]);
      max_k = std::max<int64_t>(max_k, c.lens_k[b]);
    }
    total_q = cu_q.back();
    total_k = cu_k.back();
  } else {
    total_q = c.batch * c.sq;
    total_k = c.batch * c.sk;
    max_q = c.sq;
    max_k = c.sk;
  }
  used_k = c.seqused_k;
  const int64_t rows_q = row_elems(c.hq, c.d), rows_k = row_elems(c.hkv, c.d);
  const int64_t rows_v = row_elems(c.hkv, c.value_dim()), rows_o = row_elems(c.hq, c.value_dim());
  fill_random(&q, size_t(total_q * rows_q), c.dtype, rng, c.q_gain);
  fill_random(&k, size_t(total_k * rows_k), c.dtype, rng);
  fill_random(&v, size_t(total_k * rows_v), c.dtype, rng);
  fill_random(&dout, size_t(total_q * rows_o), c.dtype, rng);
  if (c.nan_past_used) poison_unused_keys();
  const size_t e = dtype_size(c.out_dtype());
  poison(&out, size_t(total_q * rows_o) * e);
  poison(&dq, size_t(total_q * rows_q) * e);
  poison(&dk, size_t(total_k * rows_k) * e);
  poison(&dv, size_t(total_k * rows_v) * e);
  lse.assign(size_t(c.hq * total_q), std::nanf(""));
  // Geometric slopes as ALiBi defines them; per sequence (Alibi::kBatch) scaled so that sequences differ.
  const int64_t slope_rows = c.alibi == Alibi::kBatch ? sequences() : 1;
  for (int64_t b = 0; b < slope_rows; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      alibi.push_back(float(std::pow(2.0, -8.0 * double(h + 1) / double(c.hq)) * (1.0 + 0.25 * double(b))));
  // Sink logits around the rows' LSEs (a few units for these unit-variance inputs): each matters, none dominates.
  for (int64_t h = 0; h < c.hq; ++h) sinks.push_back(float(-1.0 + 5.0 * double(h) / double(c.hq)));
  dsinks.assign(size_t(c.hq), std::nanf(""));
  // FP8 factors in [0.5, 2] / 64 (fill_random scaled the data by 64), distinct per (batch, head).
  std::uniform_real_distribution<float> factor(0.5f / 64.f, 2.f / 64.f);
  for (std::vector<float>* f : {&q_descale, &k_descale, &v_descale}) {
    const int64_t heads = f == &q_descale && c.descale == Case::Descale::kQueryHeads ? c.hq : c.hkv;
    for (int64_t i = 0; i < sequences() * heads; ++i) f->push_back(factor(rng) * (f == &q_descale ? c.q_gain : 1.f));
  }
}

int64_t Problem::sequences() const { return c.varlen() ? int64_t(c.lens_q.size()) : c.batch; }

int64_t Problem::row_elems(int64_t heads, int64_t dim) const { return heads * (dim + c.head_pad) + c.row_pad; }

// All-ones bytes (NaN) in K and V rows past each sequence's seqused_k: a kernel that reads them leaks NaN.
void Problem::poison_unused_keys() {
  const size_t e = dtype_size(c.dtype);
  const int64_t rk = row_elems(c.hkv, c.d), rv = row_elems(c.hkv, c.value_dim());
  for (int64_t b = 0; b < sequences(); ++b) {
    const int64_t first = c.varlen() ? cu_k[size_t(b)] : b * c.sk, len = c.varlen() ? c.lens_k[size_t(b)] : c.sk;
    for (int64_t j = std::max<int64_t>(c.seqused_k.at(size_t(b)), 0); j < len; ++j) {
      std::fill_n(k.begin() + (first + j) * rk * int64_t(e), rk * int64_t(e), uint8_t(0xff));
      std::fill_n(v.begin() + (first + j) * rv * int64_t(e), rv * int64_t(e), uint8_t(0xff));
    }
  }
}

fa_tensor Problem::qkv_tensor(const std::vector<uint8_t>& buf, bool key_rows, int64_t heads, int64_t dim) const {
  const int64_t hs = dim + c.head_pad, row = row_elems(heads, dim);
  const int64_t rows = key_rows ? (c.varlen() ? total_k : c.sk) : (c.varlen() ? total_q : c.sq);
  fa_tensor t{};
  t.data = const_cast<uint8_t*>(buf.data());
  t.dtype = &buf == &q || &buf == &k || &buf == &v ? c.dtype : c.out_dtype();
  t.device = FA_DEVICE_CPU;
  if (c.varlen()) {
    t.ndim = 3;
    int64_t shape[3] = {rows, heads, dim}, stride[3] = {row, hs, 1};
    std::copy(shape, shape + 3, t.shape);
    std::copy(stride, stride + 3, t.stride);
  } else {
    t.ndim = 4;
    int64_t shape[4] = {c.batch, rows, heads, dim}, stride[4] = {rows * row, row, hs, 1};
    std::copy(shape, shape + 4, t.shape);
    std::copy(stride, stride + 4, t.stride);
  }
  return t;
}

FwdParams Problem::fwd() const {
  FwdParams p = make_fwd_params();
  fa_attention& a = p.attn;
  a.q = qkv_tensor(q, false, c.hq, c.d);
  a.k = qkv_tensor(k, true, c.hkv, c.d);
  a.v = qkv_tensor(v, true, c.hkv, c.value_dim());
  if (c.varlen()) {
    a.cu_seqlens_q = make_tensor(const_cast<int32_t*>(cu_q.data()), FA_INT32, {int64_t(cu_q.size())});
    a.cu_seqlens_k = make_tensor(const_cast<int32_t*>(cu_k.data()), FA_INT32, {int64_t(cu_k.size())});
    a.max_seqlen_q = max_q;
    a.max_seqlen_k = max_k;
  }
  if (!used_k.empty())
    a.seqused_k = make_tensor(const_cast<int32_t*>(used_k.data()), FA_INT32, {int64_t(used_k.size())});
  a.causal = c.causal;
  a.causal_alignment = c.top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
  a.window_left = c.wl;
  a.window_right = c.wr;
  a.softcap = c.softcap;
  if (c.alibi == Alibi::kHeads) a.alibi_slopes = make_tensor(const_cast<float*>(alibi.data()), FA_FLOAT32, {c.hq});
  if (c.alibi == Alibi::kBatch)
    a.alibi_slopes = make_tensor(const_cast<float*>(alibi.data()), FA_FLOAT32, {sequences(), c.hq});
  if (c.sinks) a.sinks = make_tensor(const_cast<float*>(sinks.data()), FA_FLOAT32, {c.hq});
  a.dropout_p = c.dropout_p;
  a.dropout_seed = c.dropout_seed;
  a.dropout_offset = c.dropout_offset;
  if (c.dropout_rng) {
    a.dropout_rng = make_tensor(const_cast<uint64_t*>(dropout_rng.data()), FA_INT64, {2});
    a.dropout_seed = a.dropout_offset = 0;
  }
  if (c.dtype == FA_FLOAT8_E4M3 && c.descale != Case::Descale::kNone) {
    const int64_t q_heads = c.descale == Case::Descale::kQueryHeads ? c.hq : c.hkv;
    a.q_descale = make_tensor(const_cast<float*>(q_descale.data()), FA_FLOAT32, {sequences(), q_heads});
    a.k_descale = make_tensor(const_cast<float*>(k_descale.data()), FA_FLOAT32, {sequences(), c.hkv});
    a.v_descale = make_tensor(const_cast<float*>(v_descale.data()), FA_FLOAT32, {sequences(), c.hkv});
  }
  p.out = qkv_tensor(out, false, c.hq, c.value_dim());
  if (c.lse) {
    p.lse = c.varlen() ? make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.hq, total_q})
                       : make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.batch, c.hq, c.sq});
  }
  return p;
}

BwdParams Problem::bwd() const {
  FwdParams f = fwd();
  BwdParams p = make_bwd_params();
  p.attn = f.attn;
  p.out = f.out;
  p.lse = c.varlen() ? make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.hq, total_q})
                     : make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.batch, c.hq, c.sq});
  p.dout = qkv_tensor(dout, false, c.hq, c.value_dim());
  p.dq = qkv_tensor(dq, false, c.hq, c.d);
  p.dk = qkv_tensor(dk, true, c.hkv, c.d);
  p.dv = qkv_tensor(dv, true, c.hkv, c.value_dim());
  if (c.sinks) p.dsinks = make_tensor(const_cast<float*>(dsinks.data()), FA_FLOAT32, {c.hq});
  return p;
}

fa_exec Problem::exec() const {
  fa_exec e = fa_exec_default();
  e.num_threads = c.threads;
  e.backend = c.backend;
  e.num_splits = c.num_splits;
  e.deterministic = c.deterministic;
  return e;
}

Status Problem::run_forward() { return forward(fwd(), exec()); }
Status Problem::run_backward() { return backward(bwd(), exec()); }

detail::Problem Problem::view() const {
  BwdParams p = bwd();
  detail::Problem out_problem;
  const detail::Requirements req{0, 1, true, "reference"};
  const bool fp8 = c.dtype == FA_FLOAT8_E4M3;  // forward only: validated as a forward
  detail::Error e =
      detail::validate(p.attn, p.out, p.lse, fp8 ? nullptr : &p.dout, fp8 ? nullptr : &p.dq, fp8 ? nullptr : &p.dk,
                       fp8 ? nullptr : &p.dv, fp8 ? detail::Direction::kForward : detail::Direction::kBackward, req,
                       c.varlen() ? cu_q.data() : nullptr, c.varlen() ? cu_k.data() : nullptr,
                       used_k.empty() ? nullptr : used_k.data(), &out_problem, fp8 ? nullptr : &p.dsinks);
  if (!e.ok()) throw std::runtime_error("test problem invalid: " + e.message);
  return out_problem;
}

Accuracy Problem::check_forward() const {
  const detail::Problem p = view();
  reference::Forward exact, plain;
  reference::forward(p, reference::Rounding::kExact, &exact);
  reference::forward(p, reference::Rounding::kStorage, &plain);
  Accuracy acc(c.dtype);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.len_q(b); ++i) {
        const int64_t g = p.varlen ? p.host_cu_q[b] + i : b * p.seqlen_q + i;
        for (int64_t x = 0; x < p.head_dim_v; ++x) {
          const size_t ri = size_t((h * p.total_q + g) * p.head_dim_v + x);
          acc.out.add(reference::load(p, p.out, p.out_layout, b, i, h, x), exact.out[ri], plain.out[ri]);
        }
        if (c.lse) {
          const size_t li = size_t(h * p.total_q + g);
          acc.lse.add(p.lse[p.offset(p.lse_layout, b, i, h)], exact.lse[li], plain.lse[li]);
        }
      }
  return acc;
}

Accuracy Problem::check_backward() const {
  const detail::Problem p = view();
  reference::Grads exact, plain;
  reference::backward(p, reference::Rounding::kExact, &exact);
  reference::backward(p, reference::Rounding::kStorage, &plain);
  Accuracy acc(c.dtype);
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.len_q(b); ++i) {
        const int64_t g = p.varlen ? p.host_cu_q[b] + i : b * p.seqlen_q + i;
        for (int64_t x = 0; x < d; ++x) {
          const size_t ri = size_t((h * p.total_q + g) * d + x);
          acc.dq.add(reference::load(p, p.dq, p.dq_layout, b, i, h, x), exact.dq[ri], plain.dq[ri], exact.dq_noise[ri]);
        }
      }
    // Every key row of the sequence, including those past seqused_k (their gradient is 0).
    const int64_t rows_k = p.varlen ? p.host_cu_k[b + 1] - p.host_cu_k[b] : p.seqlen_k;
    for (int64_t h = 0; h < p.heads_kv; ++h)
      for (int64_t j = 0; j < rows_k; ++j) {
        const int64_t g = p.varlen ? p.host_cu_k[b] + j : b * p.seqlen_k + j;
        for (int64_t x = 0; x < d; ++x) {
          const size_t ri = size_t((h * p.total_k + g) * d + x);
          acc.dk.add(reference::load(p, p.dk, p.dk_layout, b, j, h, x), exact.dk[ri], plain.dk[ri], exact.dk_noise[ri]);
        }
        for (int64_t x = 0; x < dv; ++x) {
          const size_t ri = size_t((h * p.total_k + g) * dv + x);
          acc.dv.add(reference::load(p, p.dv, p.dv_layout, b, j, h, x), exact.dv[ri], plain.dv[ri]);
        }
      }
  }
  for (int64_t h = 0; c.sinks && h < p.heads_q; ++h)
    acc.dsinks.add(dsinks[size_t(h)], exact.dsinks[size_t(h)], plain.dsinks[size_t(h)]);
  return acc;
}

void expect_matches_reference(const Case& c, bool backward) {
  SCOPED_TRACE(c.label());
  Problem pr(c);
  Status st = pr.run_forward();
  ASSERT_TRUE(st.ok()) << st.message;
  Accuracy f = pr.check_forward();
  EXPECT_TRUE(f.out.passed()) << "out: " << f.out.summary();
  if (c.lse) EXPECT_TRUE(f.lse.passed()) << "lse: " << f.lse.summary();
  if (!backward) return;
  st = pr.run_backward();
  ASSERT_TRUE(st.ok()) << st.message;
  Accuracy g = pr.check_backward();
  EXPECT_TRUE(g.dq.passed()) << "dq: " << g.dq.summary();
  EXPECT_TRUE(g.dk.passed()) << "dk: " << g.dk.summary();
  EXPECT_TRUE(g.dv.passed()) << "dv: " << g.dv.summary();
  if (c.sinks) EXPECT_TRUE(g.dsinks.passed()) << "dsinks: " << g.dsinks.summary();
}

}  // namespace flashattn::testing
