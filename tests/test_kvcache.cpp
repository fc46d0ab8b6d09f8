// fa_kvcache_append on the CPU (flashattn.h): the new tokens land in their slots of contiguous, row-mapped
// (cache_batch_idx) and paged caches (page sizes 1, 3, 16, a permuted table), rotated like flash_attn's rotary
// (interleaved and half-split, rotary_dim < head dim, q per token or at the cache length) against a float64
// rotation written here; every other byte of the caches is left alone; and each rule is a named error.
#include <gtest/gtest.h>

#include <algorithm>
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

float to_float(fa_dtype t, const uint8_t* at) {
  uint16_t h;
  float f;
  switch (t) {
    case FA_FLOAT16: std::memcpy(&h, at, 2); return fp16_to_float(h);
    case FA_BFLOAT16: std::memcpy(&h, at, 2); return bf16_to_float(h);
    case FA_FLOAT8_E4M3: return e4m3_to_float(*at);
    default: std::memcpy(&f, at, 4); return f;
  }
}
void from_float(fa_dtype t, float x, uint8_t* at) {
  uint16_t h;
  switch (t) {
    case FA_FLOAT16:
      h = float_to_fp16(x);
      std::memcpy(at, &h, 2);
      break;
    case FA_BFLOAT16:
      h = float_to_bf16(x);
      std::memcpy(at, &h, 2);
      break;
    case FA_FLOAT8_E4M3: *at = float_to_e4m3(x); break;
    default: std::memcpy(at, &x, 4);
  }
}
// The storage's unit roundoff.
double eps_of(fa_dtype t) {
  return t == FA_FLOAT32 ? 0x1p-24 : t == FA_FLOAT16 ? 0x1p-11 : t == FA_BFLOAT16 ? 0x1p-8 : 0x1p-4;
}

struct AppendCase {
  fa_dtype dtype = FA_FLOAT32;
  int64_t batch = 3, fresh = 3, hkv = 2, hq = 4, d = 64, dv = 48, sq = 3;
  std::vector<int32_t> lens = {0, 5, 20};
  int64_t capacity = 32;
  int64_t page = 0;                // > 0: paged, pages of this many slots
  std::vector<int32_t> batch_idx;  // contiguous: the rows sequences write (empty: b)
  int64_t cache_rows = 3;          // contiguous rows
  int64_t rot_half = 0;            // rotary: rotary_dim / 2 (0: none)
  bool interleaved = true, per_token = true, with_q = true;
};

struct Appended {
  AppendCase s;
  size_t es;
  int64_t pages = 0, max_pages = 0;
  std::vector<uint8_t> kc, vc, k, v, q, kc0, vc0, q0;
  std::vector<int32_t> table;
  std::vector<float> cs, sn;
  fa_kvcache_params p{};

  explicit Appended(const AppendCase& setup) : s(setup), es(flashattn::dtype_size(setup.dtype)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto fill = [&](std::vector<uint8_t>& x, int64_t n) {
      x.resize(size_t(n) * es);
      for (int64_t i = 0; i < n; ++i) from_float(s.dtype, normal(rng), x.data() + size_t(i) * es);
    };
    const int64_t rows = s.page ? 0 : s.cache_rows;
    int64_t slots = s.capacity;
    if (s.page) {
      max_pages = (s.capacity + s.page - 1) / s.page;
      pages = s.batch * max_pages + 2;  // two pages no sequence maps
      slots = s.page;
      // A permutation of the pages: sequence b's page j at table[b][j].
      std::vector<int32_t> perm(static_cast<size_t>(pages));
      for (int64_t i = 0; i < pages; ++i) perm[size_t(i)] = int32_t(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      table.assign(perm.begin(), perm.begin() + s.batch * max_pages);
    }
    const int64_t outer = s.page ? pages : rows;
    fill(kc, outer * slots * s.hkv * s.d);
    fill(vc, outer * slots * s.hkv * s.dv);
    fill(k, s.batch * s.fresh * s.hkv * s.d);
    fill(v, s.batch * s.fresh * s.hkv * s.dv);
    fill(q, s.batch * s.sq * s.hq * s.d);
    kc0 = kc, vc0 = vc, q0 = q;
    p.k_cache = make_tensor(kc.data(), s.dtype, {outer, slots, s.hkv, s.d});
    p.v_cache = make_tensor(vc.data(), s.dtype, {outer, slots, s.hkv, s.dv});
    p.k = make_tensor(k.data(), s.dtype, {s.batch, s.fresh, s.hkv, s.d});
    p.v = make_tensor(v.data(), s.dtype, {s.batch, s.fresh, s.hkv, s.dv});
    p.cache_seqlens = make_tensor(const_cast<int32_t*>(s.lens.data()), FA_INT32, {s.batch});
    if (s.page) p.block_table = make_tensor(table.data(), FA_INT32, {s.batch, max_pages});
    if (!s.batch_idx.empty())
      p.cache_batch_idx = make_tensor(const_cast<int32_t*>(s.batch_idx.data()), FA_INT32, {s.batch});
    if (s.rot_half) {
      const int64_t ro = s.capacity + s.sq;
      cs.resize(size_t(ro * s.rot_half));
      sn.resize(cs.size());
      for (int64_t i = 0; i < ro; ++i)
        for (int64_t c = 0; c < s.rot_half; ++c) {
          const double theta = double(i) * std::pow(10000.0, -double(c) / double(s.rot_half));
          cs[size_t(i * s.rot_half + c)] = float(std::cos(theta));
          sn[size_t(i * s.rot_half + c)] = float(std::sin(theta));
        }
      p.rotary_cos = make_tensor(cs.data(), FA_FLOAT32, {ro, s.rot_half});
      p.rotary_sin = make_tensor(sn.data(), FA_FLOAT32, {ro, s.rot_half});
      p.rotary_interleaved = s.interleaved;
      p.rotary_q_per_token = s.per_token;
      if (s.with_q) p.q = make_tensor(q.data(), s.dtype, {s.batch, s.sq, s.hq, s.d});
    }
  }
  fa_status call() {
    fa_exec x = fa_exec_default();
    return fa_kvcache_append(&p, &x);
  }
  // Byte offset of (position, head) of sequence b in a cache with `dim` columns.
  size_t slot_offset(int64_t b, int64_t pos, int64_t h, int64_t dim) const {
    int64_t row, slot;
    if (s.page) {
      row = table[size_t(b * max_pages + pos / s.page)];
      slot = pos % s.page;
    } else {
      row = s.batch_idx.empty() ? b : s.batch_idx[size_t(b)];
      slot = pos;
    }
    const int64_t slots = s.page ? s.page : s.capacity;
    return size_t(((row * slots + slot) * s.hkv + h) * dim) * es;
  }
  // x (dim d, storage bytes) rotated at position pos in float64.
  std::vector<double> rotated(const uint8_t* x, int64_t pos) const {
    std::vector<double> r(size_t(s.d));
    for (int64_t c = 0; c < s.d; ++c) r[size_t(c)] = to_float(s.dtype, x + size_t(c) * es);
    for (int64_t c = 0; c < s.rot_half; ++c) {
      const int64_t i = s.interleaved ? 2 * c : c, j = s.interleaved ? 2 * c + 1 : c + s.rot_half;
      const double co = cs[size_t(pos * s.rot_half + c)], si = sn[size_t(pos * s.rot_half + c)];
      const double x0 = r[size_t(i)], x1 = r[size_t(j)];
      r[size_t(i)] = x0 * co - x1 * si;
      r[size_t(j)] = x0 * si + x1 * co;
    }
    return r;
  }
  // got (storage) against want: rotated columns within one storage rounding of the float32 math, the rest equal.
  void expect_row(const uint8_t* got, const std::vector<double>& want, const std::string& what) const {
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (int64_t c = 0; c < s.d; ++c) {
      const double g = to_float(s.dtype, got + size_t(c) * es), w = want[size_t(c)];
      const double tol = c < 2 * s.rot_half ? 2 * eps_of(s.dtype) * scale : 0.0;
      ASSERT_LE(std::fabs(g - w), tol) << what << " column " << c;
      ASSERT_FALSE(std::isnan(g)) << what << " column " << c;
    }
  }

  void check() {
    std::vector<uint8_t> kc_want = kc0, vc_want = vc0;  // the untouched bytes; written slots are checked apart
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t t = 0; t < s.fresh; ++t)
        for (int64_t h = 0; h < s.hkv; ++h) {
          const int64_t pos = s.lens[size_t(b)] + t;
          const size_t ko = slot_offset(b, pos, h, s.d), vo = slot_offset(b, pos, h, s.dv);
          const uint8_t* kn = k.data() + size_t(((b * s.fresh + t) * s.hkv + h) * s.d) * es;
          const uint8_t* vn = v.data() + size_t(((b * s.fresh + t) * s.hkv + h) * s.dv) * es;
          const std::string what =
              "sequence " + std::to_string(b) + " token " + std::to_string(t) + " head " + std::to_string(h);
          if (s.rot_half) {
            expect_row(kc.data() + ko, rotated(kn, pos), "k " + what);
          } else {
            ASSERT_EQ(std::memcmp(kc.data() + ko, kn, size_t(s.d) * es), 0) << "k " << what;
          }
          ASSERT_EQ(std::memcmp(vc.data() + vo, vn, size_t(s.dv) * es), 0) << "v " << what;
          std::memcpy(kc_want.data() + ko, kc.data() + ko, size_t(s.d) * es);
          std::memcpy(vc_want.data() + vo, vn, size_t(s.dv) * es);
        }
    EXPECT_TRUE(kc == kc_want) << "k_cache bytes outside the new tokens' slots changed";
    EXPECT_TRUE(vc == vc_want) << "v_cache bytes outside the new tokens' slots changed";
    if (s.rot_half && s.with_q) {
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t t = 0; t < s.sq; ++t)
          for (int64_t h = 0; h < s.hq; ++h) {
            const size_t off = size_t(((b * s.sq + t) * s.hq + h) * s.d) * es;
            expect_row(q.data() + off, rotated(q0.data() + off, s.lens[size_t(b)] + (s.per_token ? t : 0)),
                       "q " + std::to_string(b) + "," + std::to_string(t) + "," + std::to_string(h));
          }
    } else {
      EXPECT_TRUE(q == q0) << "q changed without rotary";
    }
  }
};

TEST(Kvcache, AppendsIntoEveryLayout) {
  for (fa_dtype t : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16}) {
    AppendCase c;
    c.dtype = t;
    SCOPED_TRACE(flashattn::dtype_name(t));
    {
      Appended r(c);
      ASSERT_EQ(r.call(), FA_OK) << fa_last_error();
      r.check();
    }
    {
      AppendCase m = c;
      m.cache_rows = 4;
      m.batch_idx = {2, 0, 3};
      Appended r(m);
      ASSERT_EQ(r.call(), FA_OK) << fa_last_error();
      r.check();
    }
    for (int64_t page : {1, 3, 16}) {
      AppendCase g = c;
      g.page = page;
      g.lens = {0, 14, 29};  // the new tokens cross page boundaries
      Appended r(g);
      ASSERT_EQ(r.call(), FA_OK) << "page " << page << ": " << fa_last_error();
      r.check();
    }
  }
}

TEST(Kvcache, RotatesLikeFlashAttn) {
  for (fa_dtype t : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
    for (bool interleaved : {true, false})
      for (bool per_token : {true, false})
        for (int64_t half : {32, 8}) {  // rotary_dim = head dim, and a quarter of it
          AppendCase c;
          c.dtype = t;
          c.rot_half = half;
          c.interleaved = interleaved;
          c.per_token = per_token;
          SCOPED_TRACE(std::string(flashattn::dtype_name(t)) + (interleaved ? " interleaved" : " half") +
                       (per_token ? " per token" : " at the cache length") + " rotary_dim " + std::to_string(2 * half));
          Appended r(c);
          ASSERT_EQ(r.call(), FA_OK) << fa_last_error();
          r.check();
          AppendCase g = c;  // paged, and without q
          g.page = 3;
          g.with_q = false;
          Appended pr(g);
          ASSERT_EQ(pr.call(), FA_OK) << fa_last_error();
          pr.check();
        }
}

TEST(Kvcache, Float8BytesAndNothingToAppend) {
  AppendCase c;
  c.dtype = FA_FLOAT8_E4M3;
  {
    Appended r(c);
    ASSERT_EQ(r.call(), FA_OK) << fa_last_error();
    r.check();
  }
  AppendCase none;
  none.fresh = 0;
  Appended r(none);
  ASSERT_EQ(r.call(), FA_OK) << fa_last_error();
  r.check();
}

// The recipe of flashattn.h: append, then fa_forward over the cache with seqused_k = cache_seqlens + new tokens.
// Each sequence's rows equal the forward over exactly its keys, copied out of the cache (fp32, causal).
TEST(Kvcache, ThenAttendOverTheCache) {
  AppendCase c;
  c.rot_half = 16;
  Appended r(c);
  ASSERT_EQ(r.call(), FA_OK) << fa_last_error();
  const int64_t cap = c.capacity, hkv = c.hkv, d = c.d, dv = c.dv, hq = c.hq, sq = c.sq;
  std::vector<int32_t> used(size_t(c.batch));
  for (int64_t b = 0; b < c.batch; ++b) used[size_t(b)] = c.lens[size_t(b)] + int32_t(c.fresh);
  std::vector<float> out(size_t(c.batch * sq * hq * dv), NAN);
  flashattn::FwdParams f = flashattn::make_fwd_params();
  f.attn.q = make_tensor(r.q.data(), FA_FLOAT32, {c.batch, sq, hq, d});
  f.attn.k = make_tensor(r.kc.data(), FA_FLOAT32, {c.batch, cap, hkv, d});
  f.attn.v = make_tensor(r.vc.data(), FA_FLOAT32, {c.batch, cap, hkv, dv});
  f.attn.seqused_k = make_tensor(used.data(), FA_INT32, {c.batch});
  f.attn.causal = 1;
  f.out = make_tensor(out.data(), FA_FLOAT32, {c.batch, sq, hq, dv});
  ASSERT_TRUE(flashattn::forward(f).ok()) << fa_last_error();
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = used[size_t(b)];
    const float* kc = reinterpret_cast<const float*>(r.kc.data()) + b * cap * hkv * d;
    const float* vc = reinterpret_cast<const float*>(r.vc.data()) + b * cap * hkv * dv;
    std::vector<float> k(kc, kc + n * hkv * d), v(vc, vc + n * hkv * dv), one(size_t(sq * hq * dv), NAN);
    flashattn::FwdParams g = flashattn::make_fwd_params();
    g.attn.q = make_tensor(reinterpret_cast<float*>(r.q.data()) + b * sq * hq * d, FA_FLOAT32, {1, sq, hq, d});
    g.attn.k = make_tensor(k.data(), FA_FLOAT32, {1, n, hkv, d});
    g.attn.v = make_tensor(v.data(), FA_FLOAT32, {1, n, hkv, dv});
    g.attn.causal = 1;
    g.out = make_tensor(one.data(), FA_FLOAT32, {1, sq, hq, dv});
    ASSERT_TRUE(flashattn::forward(g).ok()) << fa_last_error();
    for (size_t i = 0; i < one.size(); ++i)
      ASSERT_NEAR(out[size_t(b) * one.size() + i], one[i], 1e-6f * (1.f + std::fabs(one[i]))) << "sequence " << b;
  }
}

// One rule per case: the call fails with FA_ERROR_INVALID_ARGUMENT, the message names the argument and the rule,
// and neither cache changed.
void expect_error(Appended& r, const std::string& argument, const std::string& rule) {
  EXPECT_EQ(r.call(), FA_ERROR_INVALID_ARGUMENT) << argument;
  const std::string msg = fa_last_error();
  EXPECT_EQ(msg.rfind(argument + ":", 0), 0u) << msg;
  EXPECT_NE(msg.find(rule), std::string::npos) << msg;
  EXPECT_TRUE(r.kc == r.kc0 && r.vc == r.vc0 && r.q == r.q0) << "written on error: " << msg;
}

TEST(Kvcache, RulesAreNamedErrors) {
  AppendCase c;
  c.rot_half = 16;
  {
    AppendCase s = c;
    s.lens = {0, 30, 1};  // 30 + 3 > 32
    Appended r(s);
    expect_error(r, "cache_seqlens", "must fit the cache's 32 slots");
  }
  {
    AppendCase s = c;
    s.lens = {0, -1, 1};
    Appended r(s);
    expect_error(r, "cache_seqlens", "must be >= 0");
  }
  {
    AppendCase s = c;
    s.cache_rows = 4;
    s.batch_idx = {0, 4, 1};
    Appended r(s);
    expect_error(r, "cache_batch_idx", "must be in [0, 4)");
  }
  {
    AppendCase s = c;
    s.cache_rows = 2;
    Appended r(s);
    expect_error(r, "k_cache", "has 2 rows for 3 sequences");
  }
  {
    AppendCase s = c;
    s.page = 4;
    s.lens = {0, 5, 9};
    Appended r(s);
    r.table[size_t(1 * r.max_pages + 1)] = int32_t(r.pages);  // the page sequence 1's new tokens go to
    expect_error(r, "block_table", "page indices the new tokens go to must be in [0, ");
    Appended ok(s);
    ok.table[size_t(1 * ok.max_pages + 5)] = -7;  // a page nothing is written to: not read
    EXPECT_EQ(ok.call(), FA_OK) << fa_last_error();
  }
  {
    AppendCase s = c;
    s.page = 4;
    s.cache_rows = 4;
    s.batch_idx = {0, 1, 2};
    Appended r(s);
    expect_error(r, "cache_batch_idx", "is for contiguous caches");
  }
  {
    Appended r(c);
    r.p.rotary_cos.shape[0] = 22;  // positions 20 + 3 are rotated
    r.p.rotary_sin.shape[0] = 22;
    expect_error(r, "rotary_cos", "fewer than the rotated tokens reach");
  }
  {
    Appended r(c);
    r.p.rotary_sin.shape[1] = 15;
    expect_error(r, "rotary_sin", "shape must be");
  }
  {
    Appended r(c);
    r.p.rotary_sin = fa_tensor{};
    expect_error(r, "rotary_sin", "come together");
  }
  {
    AppendCase s = c;
    s.rot_half = 40;  // 80 > head dim 64
    Appended r(s);
    expect_error(r, "rotary_cos", "rotary_dim (2 * 40) must be in (0, head_dim = 64]");
  }
  {
    AppendCase s;
    Appended r(s);
    r.p.q = make_tensor(r.q.data(), s.dtype, {s.batch, s.sq, s.hq, s.d});
    expect_error(r, "q", "only read to be rotated");
  }
  {
    AppendCase s = c;
    s.dtype = FA_FLOAT8_E4M3;
    Appended r(s);
    expect_error(r, "rotary_cos", "not applied to float8_e4m3");
  }
  {
    AppendCase s = c;
    s.fresh = 0;
    Appended r(s);
    expect_error(r, "rotary_cos", "needs new keys");
  }
  {
    Appended r(c);
    r.p.v.dtype = FA_FLOAT16;
    expect_error(r, "v", "dtype must be float32 (k_cache's)");
  }
  {
    Appended r(c);
    r.p.v.shape[3] = 40;
    expect_error(r, "v", "shape must be");
  }
  {
    Appended r(c);
    r.p.k.data = r.kc.data();  // the new keys read from the cache itself
    expect_error(r, "k", "must not overlap k_cache in memory");
  }
  {
    Appended r(c);
    r.p.cache_seqlens.dtype = FA_FLOAT32;
    expect_error(r, "cache_seqlens", "dtype must be int32");
  }
  {
    Appended r(c);
    r.p.v_cache.device = FA_DEVICE_CUDA;
    expect_error(r, "v_cache", "must be on the same device as k_cache");
  }
  // Malformed descriptions of each tensor: a wrong rank, an unknown dtype code, a negative stride, a negative
  // size, a null pointer. Each is a named error of that tensor, except a null q, which marks it absent
  // (flashattn.h): q is then not rotated, a valid call (a null rotary table is named by the "come together" rule).
  const char* names[] = {"k_cache", "v_cache", "k", "v", "cache_seqlens", "q", "rotary_cos", "rotary_sin"};
  for (int which = 0; which < 8; ++which)
    for (int breakage = 0; breakage < 5; ++breakage) {
      Appended r(c);
      fa_tensor* ts[] = {&r.p.k_cache,       &r.p.v_cache, &r.p.k,          &r.p.v,
                         &r.p.cache_seqlens, &r.p.q,       &r.p.rotary_cos, &r.p.rotary_sin};
      fa_tensor& t = *ts[which];
      switch (breakage) {
        case 0: t.ndim = t.ndim == 4 ? 3 : 4; break;
        case 1: t.dtype = fa_dtype(99); break;
        case 2: t.stride[0] = -1; break;
        case 3: t.shape[0] = -2; break;
        default: t.data = nullptr; break;
      }
      const fa_status st = r.call();
      const std::string msg = fa_last_error();
      SCOPED_TRACE(std::string(names[which]) + " breakage " + std::to_string(breakage) + ": " + msg);
      if (breakage == 4 && which == 5) {
        EXPECT_EQ(st, FA_OK);
        EXPECT_TRUE(r.q == r.q0);
        continue;
      }
      EXPECT_EQ(st, FA_ERROR_INVALID_ARGUMENT);
      EXPECT_EQ(msg.rfind(std::string(names[which]) + ":", 0), 0u);
      EXPECT_TRUE(r.kc == r.kc0 && r.vc == r.vc0 && r.q == r.q0);
    }
  EXPECT_EQ(fa_kvcache_append(nullptr, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(fa_last_error()).rfind("params:", 0), 0u);
}

}  // namespace
