#include "attention_case.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "cpu/numeric.hpp"

namespace flashattn::testing {

std::string Case::name() const {
  std::ostringstream s;
  s << dtype_name(dtype) << " B" << batch << " q" << seqlen_q << " k" << seqlen_k << " h" << heads_q << ":" << heads_kv
    << " d" << head_dim;
  if (dv() != head_dim) s << "/" << dv();
  if (causal) s << (top_left ? " causal-tl" : " causal");
  if (window_left >= 0 || window_right >= 0) s << " win(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap" << softcap;
  if (alibi) s << " alibi";
  if (sinks) s << " sinks";
  if (dropout_p > 0.f) s << " dropout " << dropout_p;
  if (varlen()) s << " varlen";
  if (!seqused_k.empty()) s << " seqused";
  if (head_pad) s << " strided";
  return s.str();
}

namespace {

void fill_random(std::vector<uint8_t>* buf, size_t n, fa_dtype t, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  buf->assign(n * dtype_size(t), 0);
  for (size_t i = 0; i < n; ++i) {
    float x = dist(rng);
    if (t == FA_FLOAT32) {
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
  if (c.varlen()) {
    cu_q.push_back(0);
    cu_k.push_back(0);
    for (size_t b = 0; b < c.varlen_q.size(); ++b) {
      cu_q.push_back(cu_q.back() + c.varlen_q[b]);
      cu_k.push_back(cu_k.back() + c.varlen_k[b]);
      max_q = std::max<int64_t>(max_q, c.varlen_q[b]);
      max_k = std::max<int64_t>(max_k, c.varlen_k[b]);
    }
    total_q = cu_q.back();
    total_k = cu_k.back();
  } else {
    total_q = c.batch * c.seqlen_q;
    total_k = c.batch * c.seqlen_k;
    max_q = c.seqlen_q;
    max_k = c.seqlen_k;
  }
  used_k = c.seqused_k;
  const int64_t hs_q = c.head_dim + c.head_pad, hs_v = c.dv() + c.head_pad;
  fill_random(&q, size_t(total_q * c.heads_q * hs_q), c.dtype, rng);
  fill_random(&k, size_t(total_k * c.heads_kv * hs_q), c.dtype, rng);
  fill_random(&v, size_t(total_k * c.heads_kv * hs_v), c.dtype, rng);
  fill_random(&dout, size_t(total_q * c.heads_q * hs_v), c.dtype, rng);
  const size_t e = dtype_size(c.dtype);
  poison(&out, size_t(total_q * c.heads_q * hs_v) * e);
  poison(&dq, size_t(total_q * c.heads_q * hs_q) * e);
  poison(&dk, size_t(total_k * c.heads_kv * hs_q) * e);
  poison(&dv, size_t(total_k * c.heads_kv * hs_v) * e);
  lse.assign(size_t(c.heads_q * total_q), std::nanf(""));
  for (int64_t h = 0; h < c.heads_q; ++h)
    alibi.push_back(float(std::pow(2.0, -8.0 * double(h + 1) / double(c.heads_q))));
  // Sink logits around the rows' LSEs (a few units for these unit-variance inputs): each matters, none dominates.
  for (int64_t h = 0; h < c.heads_q; ++h) sinks.push_back(float(-1.0 + 5.0 * double(h) / double(c.heads_q)));
  dsinks.assign(size_t(c.heads_q), std::nanf(""));
}

fa_tensor Problem::qkv_tensor(const std::vector<uint8_t>& buf, bool key_rows, int64_t heads, int64_t dim) const {
  const int64_t hs = dim + c.head_pad;
  const int64_t rows = key_rows ? (c.varlen() ? total_k : c.seqlen_k) : (c.varlen() ? total_q : c.seqlen_q);
  fa_tensor t{};
  t.data = const_cast<uint8_t*>(buf.data());
  t.dtype = c.dtype;
  t.device = FA_DEVICE_CPU;
  if (c.varlen()) {
    t.ndim = 3;
    int64_t shape[3] = {rows, heads, dim}, stride[3] = {heads * hs, hs, 1};
    std::copy(shape, shape + 3, t.shape);
    std::copy(stride, stride + 3, t.stride);
  } else {
    t.ndim = 4;
    int64_t shape[4] = {c.batch, rows, heads, dim}, stride[4] = {rows * heads * hs, heads * hs, hs, 1};
    std::copy(shape, shape + 4, t.shape);
    std::copy(stride, stride + 4, t.stride);
  }
  return t;
}

FwdParams Problem::fwd() const {
  FwdParams p = make_fwd_params();
  fa_attention& a = p.attn;
  a.q = qkv_tensor(q, false, c.heads_q, c.head_dim);
  a.k = qkv_tensor(k, true, c.heads_kv, c.head_dim);
  a.v = qkv_tensor(v, true, c.heads_kv, c.dv());
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
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  if (c.alibi) a.alibi_slopes = make_tensor(const_cast<float*>(alibi.data()), FA_FLOAT32, {c.heads_q});
  if (c.sinks) a.sinks = make_tensor(const_cast<float*>(sinks.data()), FA_FLOAT32, {c.heads_q});
  a.dropout_p = c.dropout_p;
  a.dropout_seed = c.dropout_seed;
  a.dropout_offset = c.dropout_offset;
  p.out = qkv_tensor(out, false, c.heads_q, c.dv());
  if (c.lse) {
    p.lse = c.varlen() ? make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.heads_q, total_q})
                       : make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.batch, c.heads_q, c.seqlen_q});
  }
  return p;
}

BwdParams Problem::bwd() const {
  FwdParams f = fwd();
  BwdParams p = make_bwd_params();
  p.attn = f.attn;
  p.out = f.out;
  p.lse = c.varlen() ? make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.heads_q, total_q})
                     : make_tensor(const_cast<float*>(lse.data()), FA_FLOAT32, {c.batch, c.heads_q, c.seqlen_q});
  p.dout = qkv_tensor(dout, false, c.heads_q, c.dv());
  p.dq = qkv_tensor(dq, false, c.heads_q, c.head_dim);
  p.dk = qkv_tensor(dk, true, c.heads_kv, c.head_dim);
  p.dv = qkv_tensor(dv, true, c.heads_kv, c.dv());
  if (c.sinks) p.dsinks = make_tensor(const_cast<float*>(dsinks.data()), FA_FLOAT32, {c.heads_q});
  return p;
}

fa_exec Problem::exec() const {
  fa_exec e = fa_exec_default();
  e.num_threads = c.threads;
  return e;
}

Status Problem::run_forward() { return forward(fwd(), exec()); }
Status Problem::run_backward() { return backward(bwd(), exec()); }

detail::Problem Problem::view() const {
  BwdParams p = bwd();
  detail::Problem out_problem;
  const detail::Requirements req{0, 1, true, "reference"};
  detail::Error e = detail::validate(p.attn, p.out, p.lse, &p.dout, &p.dq, &p.dk, &p.dv, detail::Direction::kBackward,
                                     req, c.varlen() ? cu_q.data() : nullptr, c.varlen() ? cu_k.data() : nullptr,
                                     used_k.empty() ? nullptr : used_k.data(), &out_problem, &p.dsinks);
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
  SCOPED_TRACE(c.name());
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
