// fa_merge_partials on the CPU (flashattn.h): attentions over two disjoint key sets, merged, equal the attention over
// their union (fa_forward over all keys, with rows that see no key of one part); the merge equals a float64 merge
// of the same partials for every dtype pair, batched and varlen, through strided views; parts of weight 0 are not
// read, NaN propagates; and each rule is a named error that writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/numeric.hpp"
#include "flashattn/flashattn.hpp"

namespace {

using flashattn::make_tensor;
using namespace flashattn::cpu;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// One forward on the CPU: q (1, n, h, d) against keys [k0, k1) of k, v; out (1, n, h, d) float32, lse (1, h, n).
void attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int64_t n, int64_t h,
            int64_t d, int64_t k0, int64_t k1, bool top_left, std::vector<float>* out, std::vector<float>* lse) {
  out->assign(size_t(n * h * d), NAN);
  lse->assign(size_t(h * n), NAN);
  flashattn::FwdParams f = flashattn::make_fwd_params();
  f.attn.q = make_tensor(const_cast<float*>(q.data()), FA_FLOAT32, {1, n, h, d});
  f.attn.k = make_tensor(const_cast<float*>(k.data()) + k0 * h * d, FA_FLOAT32, {1, k1 - k0, h, d});
  f.attn.v = make_tensor(const_cast<float*>(v.data()) + k0 * h * d, FA_FLOAT32, {1, k1 - k0, h, d});
  f.attn.causal = 1;
  f.attn.causal_alignment = top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
  f.out = make_tensor(out->data(), FA_FLOAT32, {1, n, h, d});
  f.lse = make_tensor(lse->data(), FA_FLOAT32, {1, h, n});
  ASSERT_TRUE(flashattn::forward(f).ok()) << fa_last_error();
}

fa_status merge(fa_tensor out, fa_tensor lse, fa_tensor out_b, fa_tensor lse_b) {
  fa_merge_params p{};
  p.out = out, p.lse = lse, p.out_b = out_b, p.lse_b = lse_b;
  return fa_merge_partials(&p, nullptr);
}

// Causal attention of n queries over n keys, split at key s: part A (keys [0, s), top-left: query i sees j <= i) and
// part B (keys [s, n), bottom-right: query i sees s + j' <= i, none for i < s). Merged, they are the whole.
TEST(Merge, PartsMergeIntoTheAttentionOverTheUnion) {
  const int64_t n = 77, h = 3, d = 40, s = 30;
  const auto q = randn(size_t(n * h * d), 1), k = randn(size_t(n * h * d), 2), v = randn(size_t(n * h * d), 3);
  std::vector<float> whole, whole_lse, out, lse, out_b, lse_b;
  attend(q, k, v, n, h, d, 0, n, true, &whole, &whole_lse);
  attend(q, k, v, n, h, d, 0, s, true, &out, &lse);
  attend(q, k, v, n, h, d, s, n, false, &out_b, &lse_b);
  for (int64_t i = 0; i < s; ++i) ASSERT_EQ(lse_b[size_t(i)], -INFINITY) << "row " << i << " sees no key of part B";
  ASSERT_EQ(
      merge(make_tensor(out.data(), FA_FLOAT32, {1, n, h, d}), make_tensor(lse.data(), FA_FLOAT32, {1, h, n}),
            make_tensor(out_b.data(), FA_FLOAT32, {1, n, h, d}), make_tensor(lse_b.data(), FA_FLOAT32, {1, h, n})),
      FA_OK)
      << fa_last_error();
  for (size_t i = 0; i < whole.size(); ++i) ASSERT_NEAR(out[i], whole[i], 2e-6f * (1.f + std::fabs(whole[i]))) << i;
  for (size_t i = 0; i < whole_lse.size(); ++i) ASSERT_NEAR(lse[i], whole_lse[i], 2e-6f * std::fabs(whole_lse[i]));
}

// Partials of a given dtype pair in a (possibly strided, possibly varlen) layout, merged, against the float64 merge.
struct Partials {
  int64_t batch = 2, rows = 13, heads = 3, dim = 24;
  bool varlen = false;
  fa_dtype out_dtype = FA_FLOAT32, out_b_dtype = FA_FLOAT32;
  int64_t pad = 0;  // extra heads in out's and lse's storage (strided views)
  std::vector<uint8_t> out, out_b;
  std::vector<float> lse, lse_b;
  std::vector<double> want, want_lse, scale;  // scale: |w_a out| + |w_b out_b|, the size of the sum's terms

  static size_t size_of(fa_dtype t) { return t == FA_FLOAT32 ? 4 : 2; }
  static float get(fa_dtype t, const uint8_t* at) {
    uint16_t x;
    float f;
    if (t == FA_FLOAT32) return std::memcpy(&f, at, 4), f;
    std::memcpy(&x, at, 2);
    return t == FA_FLOAT16 ? fp16_to_float(x) : bf16_to_float(x);
  }
  static void put(fa_dtype t, float f, uint8_t* at) {
    if (t == FA_FLOAT32) return void(std::memcpy(at, &f, 4));
    const uint16_t x = t == FA_FLOAT16 ? float_to_fp16(f) : float_to_bf16(f);
    std::memcpy(at, &x, 2);
  }
  int64_t hs() const { return heads + pad; }  // heads in out's and lse's storage
  size_t out_at(int64_t b, int64_t i, int64_t hd, int64_t c) const {
    return size_t(((b * rows + i) * hs() + hd) * dim + c) * size_of(out_dtype);
  }
  size_t out_b_at(int64_t b, int64_t i, int64_t hd, int64_t c) const {
    return size_t(((b * rows + i) * heads + hd) * dim + c) * size_of(out_b_dtype);
  }
  size_t lse_at(int64_t b, int64_t hd, int64_t i) const { return size_t((b * hs() + hd) * rows + i); }
  size_t lse_b_at(int64_t b, int64_t hd, int64_t i) const { return size_t((b * heads + hd) * rows + i); }

  // lse values: finite, -inf in one part or both for some rows, with NaN under the -inf rows' out.
  void fill(uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist;
    out.assign(size_t(batch * rows * hs() * dim) * size_of(out_dtype), 0);
    out_b.assign(size_t(batch * rows * heads * dim) * size_of(out_b_dtype), 0);
    lse.assign(size_t(batch * hs() * rows), 0.f);
    lse_b.assign(size_t(batch * heads * rows), 0.f);
    want.assign(size_t(batch * rows * heads * dim), 0.);
    scale.assign(want.size(), 0.);
    want_lse.assign(size_t(batch * heads * rows), 0.);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t hd = 0; hd < heads; ++hd) {
          const int kind = int((b * rows + i) * heads + hd) % 5;  // 0, 1: finite; 2: a empty; 3: b empty; 4: both
          const float la = kind == 2 || kind == 4 ? -INFINITY : 4.f * dist(gen);
          const float lb = kind == 3 || kind == 4 ? -INFINITY : 4.f * dist(gen) + (kind == 1 ? 30.f : 0.f);
          lse[lse_at(b, hd, i)] = la;
          lse_b[lse_b_at(b, hd, i)] = lb;
          const double m = std::fmax(double(la), double(lb));
          const double l = m == -INFINITY ? -INFINITY : m + std::log(std::exp(la - m) + std::exp(lb - m));
          want_lse[size_t((b * heads + hd) * rows + i)] = l;
          for (int64_t c = 0; c < dim; ++c) {
            const float a = la == -INFINITY ? NAN : dist(gen), x = lb == -INFINITY ? NAN : dist(gen);
            put(out_dtype, a, &out[out_at(b, i, hd, c)]);
            put(out_b_dtype, x, &out_b[out_b_at(b, i, hd, c)]);
            const double ra = get(out_dtype, &out[out_at(b, i, hd, c)]);
            const double rb = get(out_b_dtype, &out_b[out_b_at(b, i, hd, c)]);
            const double ta = la == -INFINITY ? 0. : std::exp(la - l) * ra;
            const double tb = lb == -INFINITY ? 0. : std::exp(lb - l) * rb;
            want[size_t(((b * rows + i) * heads + hd) * dim + c)] = ta + tb;
            scale[size_t(((b * rows + i) * heads + hd) * dim + c)] = std::fabs(ta) + std::fabs(tb);
          }
        }
  }
  fa_tensor view(void* data, fa_dtype t, int64_t head_stride_heads, int64_t d) const {
    const int64_t hsn = head_stride_heads;
    fa_tensor x =
        varlen ? make_tensor(data, t, {batch * rows, heads, d}) : make_tensor(data, t, {batch, rows, heads, d});
    const int nd = x.ndim;
    x.stride[nd - 1] = 1, x.stride[nd - 2] = d, x.stride[nd - 3] = hsn * d;
    if (!varlen) x.stride[0] = rows * hsn * d;
    return x;
  }
  fa_tensor lse_view(float* data, int64_t hsn) const {
    // Varlen lse is (H, T): the cases lay varlen partials out with batch 1, T = rows.
    fa_tensor x =
        varlen ? make_tensor(data, FA_FLOAT32, {heads, rows}) : make_tensor(data, FA_FLOAT32, {batch, heads, rows});
    const int nd = x.ndim;
    x.stride[nd - 1] = 1, x.stride[nd - 2] = rows;
    if (!varlen) x.stride[0] = hsn * rows;
    return x;
  }
  fa_status run() {
    return merge(view(out.data(), out_dtype, hs(), dim), lse_view(lse.data(), hs()),
                 view(out_b.data(), out_b_dtype, heads, dim), lse_view(lse_b.data(), heads));
  }
  // The merge's error bound: out's rounding, and float32's in the weights e^(l_s - l), whose exponents carry the
  // rounding of l (|l| 2^-24 each).
  double eps(double l) const {
    return (out_dtype == FA_FLOAT32 ? 0x1p-23 : out_dtype == FA_FLOAT16 ? 0x1p-11 : 0x1p-8) + 8. * (1. + l) * 0x1p-24;
  }
  void check() const {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t hd = 0; hd < heads; ++hd) {
          const double l = want_lse[size_t((b * heads + hd) * rows + i)];
          const float got_l = lse[lse_at(b, hd, i)];
          if (l == -INFINITY)
            ASSERT_EQ(got_l, -INFINITY);
          else
            ASSERT_NEAR(got_l, l, 1e-6 * (1. + std::fabs(l))) << b << " " << i << " " << hd;
          for (int64_t c = 0; c < dim; ++c) {
            const size_t at = size_t(((b * rows + i) * heads + hd) * dim + c);
            const float got = get(out_dtype, &out[out_at(b, i, hd, c)]);
            ASSERT_FALSE(std::isnan(got)) << "a part of weight 0 was read: " << b << " " << i << " " << hd;
            const double tol = eps(l == -INFINITY ? 0. : std::fabs(l)) * (std::fabs(want[at]) + scale[at]) + 1e-30;
            ASSERT_NEAR(got, want[at], tol) << b << " " << i << " " << hd << " " << c;
          }
        }
    // The padding heads of the strided storage are left alone.
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t hd = heads; hd < hs(); ++hd)
        for (int64_t i = 0; i < rows; ++i) ASSERT_EQ(lse[lse_at(b, hd, i)], 0.f);
  }
};

TEST(Merge, EqualsTheFloat64MergeForEveryDtypePairAndLayout) {
  for (fa_dtype a : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
    for (fa_dtype b : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
      for (bool varlen : {false, true})
        for (int64_t pad : {0, 2}) {
          SCOPED_TRACE(std::string(flashattn::dtype_name(a)) + " <- " + flashattn::dtype_name(b) +
                       (varlen ? " varlen" : " batched") + " pad " + std::to_string(pad));
          Partials p;
          p.out_dtype = a, p.out_b_dtype = b, p.varlen = varlen, p.pad = pad;
          if (varlen) p.batch = 1, p.rows = 29;
          p.fill(uint32_t(7 + a * 3 + b));
          ASSERT_EQ(p.run(), FA_OK) << fa_last_error();
          p.check();
        }
}

TEST(Merge, NanPropagatesAndEmptyCallsAreFine) {
  Partials p;
  p.fill(11);
  p.lse_b[0] = NAN;  // (b 0, head 0, row 0)
  ASSERT_EQ(p.run(), FA_OK) << fa_last_error();
  EXPECT_TRUE(std::isnan(p.lse[0]));
  EXPECT_TRUE(std::isnan(Partials::get(p.out_dtype, &p.out[0])));
  Partials e;
  e.rows = 0;
  e.fill(1);
  EXPECT_EQ(e.run(), FA_OK) << fa_last_error();
}

void expect_error(fa_status status, const std::string& argument, const std::string& rule) {
  EXPECT_EQ(status, FA_ERROR_INVALID_ARGUMENT) << argument;
  const std::string msg = fa_last_error();
  EXPECT_EQ(msg.rfind(argument + ":", 0), 0u) << msg;
  EXPECT_NE(msg.find(rule), std::string::npos) << msg;
}

TEST(Merge, RulesAreNamedErrors) {
  Partials p;
  p.fill(3);
  const auto out0 = p.out;
  const auto lse0 = p.lse;
  const fa_tensor out = p.view(p.out.data(), p.out_dtype, p.heads, p.dim), lse = p.lse_view(p.lse.data(), p.heads);
  const fa_tensor out_b = p.view(p.out_b.data(), p.out_b_dtype, p.heads, p.dim);
  const fa_tensor lse_b = p.lse_view(p.lse_b.data(), p.heads);
  fa_tensor bad = out;
  bad.ndim = 2;
  expect_error(merge(bad, lse, out_b, lse_b), "out", "must have 4 dimensions (B, S, H, Dv), or 3");
  bad = out_b;
  bad.dtype = FA_INT32;
  expect_error(merge(out, lse, bad, lse_b), "out_b", "dtype must be float32, float16 or bfloat16");
  bad = out_b;
  bad.shape[2] = 2;
  expect_error(merge(out, lse, bad, lse_b), "out_b", "shape must be out's");
  bad = lse_b;
  bad.shape[2] = 5;
  expect_error(merge(out, lse, out_b, bad), "lse_b", "shape must be");
  bad = lse;
  bad.dtype = FA_FLOAT16;
  expect_error(merge(out, bad, out_b, lse_b), "lse", "dtype must be float32");
  bad = out;
  bad.stride[3] = 2;
  expect_error(merge(bad, lse, out_b, lse_b), "out", "last dimension must have unit stride");
  bad = out_b;
  bad.device = FA_DEVICE_CUDA;
  expect_error(merge(out, lse, bad, lse_b), "out_b", "must be on the same device as out");
  // In place: out must not overlap the part it takes in (nor lse, nor itself).
  expect_error(merge(out, lse, out, lse_b), "out", "must not overlap out_b");
  fa_tensor lse_in_out = lse;
  lse_in_out.data = p.out.data();
  expect_error(merge(out, lse_in_out, out_b, lse_b), "lse", "must not overlap out");
  bad = out;
  bad.stride[1] = 0;
  expect_error(merge(bad, lse, out_b, lse_b), "out", "elements overlap in memory");
  EXPECT_TRUE(p.out == out0 && p.lse == lse0) << "written on error";
}

}  // namespace
