// Every validation rule has a case that breaks exactly it and expects its specific error.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "attention_case.hpp"

namespace flashattn::testing {
namespace {

struct Rule {
  const char* name;
  std::function<void(FwdParams&)> breaks;
  fa_status code;
  const char* message;  // substring of the error
};

Case base() {
  Case c;
  c.sq = 9;
  c.sk = 11;
  c.hq = 4;
  c.hkv = 2;
  c.d = 16;
  return c;
}

Case varlen_base() {
  Case c = base();
  c.lens_q = {4, 5};
  c.lens_k = {6, 5};
  return c;
}

void expect_rule(const Case& c, const Rule& r) {
  SCOPED_TRACE(r.name);
  Problem pr(c);
  FwdParams p = pr.fwd();
  ASSERT_TRUE(forward(p, pr.exec()).ok()) << "the unbroken params must be valid";
  r.breaks(p);
  Status st = forward(p, pr.exec());
  EXPECT_EQ(st.code, r.code) << st.message;
  EXPECT_NE(st.message.find(r.message), std::string::npos) << "message was: " << st.message;
}

TEST(Validation, TensorRules) {
  static float misaligned_storage[64];
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"null q", [](FwdParams& p) { p.attn.q.data = nullptr; }, FA_ERROR_INVALID_ARGUMENT, "q: null data pointer"},
      {"null k", [](FwdParams& p) { p.attn.k.data = nullptr; }, FA_ERROR_INVALID_ARGUMENT, "k: null data pointer"},
      {"null out", [](FwdParams& p) { p.out.data = nullptr; }, FA_ERROR_INVALID_ARGUMENT, "out: null data pointer"},
      {"rank", [](FwdParams& p) { p.attn.q.ndim = 3; }, FA_ERROR_INVALID_ARGUMENT, "q: must have 4 dimensions"},
      {"dtype mismatch", [](FwdParams& p) { p.attn.k.dtype = FA_FLOAT16; }, FA_ERROR_INVALID_ARGUMENT,
       "k: dtype must be bfloat16 (same as q)"},
      {"int32 q", [](FwdParams& p) { p.attn.q.dtype = FA_INT32; }, FA_ERROR_INVALID_ARGUMENT,
       "q: dtype must be float32, float16, bfloat16 or float8_e4m3fn"},
      {"unknown dtype", [](FwdParams& p) { p.attn.v.dtype = fa_dtype(42); }, FA_ERROR_INVALID_ARGUMENT,
       "v: unknown dtype code 42"},
      {"out dtype", [](FwdParams& p) { p.out.dtype = FA_FLOAT32; }, FA_ERROR_INVALID_ARGUMENT,
       "out: dtype must be bfloat16 (same as q)"},
      {"last stride", [](FwdParams& p) { p.attn.v.stride[3] = 2; }, FA_ERROR_INVALID_ARGUMENT,
       "v: last dimension must have unit stride (got stride 2)"},
      {"negative stride", [](FwdParams& p) { p.attn.k.stride[1] = -8; }, FA_ERROR_INVALID_ARGUMENT,
       "k: negative stride -8"},
      {"misaligned pointer",
       [](FwdParams& p) { p.attn.q.data = reinterpret_cast<char*>(misaligned_storage) + 1; },
       FA_ERROR_INVALID_ARGUMENT, "q: data pointer must be aligned to 2 bytes"},
      {"device mismatch", [](FwdParams& p) { p.attn.k.device_index = 1; }, FA_ERROR_INVALID_ARGUMENT,
       "k: must be on the same device as q"},
      {"head dim not multiple of 8", [](FwdParams& p) { p.attn.q.shape[3] = p.attn.k.shape[3] = 12; },
       FA_ERROR_INVALID_ARGUMENT, "q: head_dim must be a multiple of 8 in [8, 256] (got 12)"},
      {"head dim too large", [](FwdParams& p) { p.attn.q.shape[3] = p.attn.k.shape[3] = 264; },
       FA_ERROR_INVALID_ARGUMENT, "q: head_dim must be a multiple of 8 in [8, 256] (got 264)"},
      {"k head dim", [](FwdParams& p) { p.attn.k.shape[3] = 8; }, FA_ERROR_INVALID_ARGUMENT,
       "k: head_dim must equal q's (16, got 8)"},
      {"v head dim", [](FwdParams& p) { p.attn.v.shape[3] = 20; }, FA_ERROR_INVALID_ARGUMENT,
       "v: head_dim must be a multiple of 8"},
      {"gqa ratio", [](FwdParams& p) { p.attn.k.shape[2] = p.attn.v.shape[2] = 3; }, FA_ERROR_INVALID_ARGUMENT,
       "heads of q (4) must be a multiple of heads of k/v (3)"},
      {"zero kv heads", [](FwdParams& p) { p.attn.k.shape[2] = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "k: must have at least one head"},
      {"v heads", [](FwdParams& p) { p.attn.v.shape[2] = 1; }, FA_ERROR_INVALID_ARGUMENT,
       "v: must have as many heads as k"},
      {"v seqlen", [](FwdParams& p) { p.attn.v.shape[1] = 10; }, FA_ERROR_INVALID_ARGUMENT, "v: shape"},
      {"batch mismatch", [](FwdParams& p) { p.attn.k.shape[0] = 2; p.attn.v.shape[0] = 2; },
       FA_ERROR_INVALID_ARGUMENT, "k: batch must equal q's"},
      {"out shape", [](FwdParams& p) { p.out.shape[1] = 8; }, FA_ERROR_INVALID_ARGUMENT,
       "out: shape must be (1, 9, 4, 16)"},
      {"lse dtype", [](FwdParams& p) { p.lse.dtype = FA_FLOAT16; }, FA_ERROR_INVALID_ARGUMENT,
       "lse: dtype must be float32"},
      {"lse shape", [](FwdParams& p) { p.lse.shape[2] = 8; }, FA_ERROR_INVALID_ARGUMENT,
       "lse: shape must be (1, 4, 9)"},
  };
  // clang-format on
  for (const Rule& r : rules) expect_rule(base(), r);
}

TEST(Validation, ScalarAndMaskRules) {
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"scale zero", [](FwdParams& p) { p.attn.has_softmax_scale = 1; p.attn.softmax_scale = 0.f; },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale: must be finite and positive"},
      {"scale negative", [](FwdParams& p) { p.attn.has_softmax_scale = 1; p.attn.softmax_scale = -1.f; },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale: must be finite and positive"},
      {"scale nan", [](FwdParams& p) { p.attn.has_softmax_scale = 1; p.attn.softmax_scale = NAN; },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale: must be finite and positive"},
      {"scale inf", [](FwdParams& p) { p.attn.has_softmax_scale = 1; p.attn.softmax_scale = INFINITY; },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale: must be finite and positive"},
      {"softcap negative", [](FwdParams& p) { p.attn.softcap = -1.f; }, FA_ERROR_INVALID_ARGUMENT,
       "softcap: must be finite and >= 0"},
      {"window left", [](FwdParams& p) { p.attn.window_left = -2; }, FA_ERROR_INVALID_ARGUMENT,
       "window_left: must be >= -1"},
      {"window right", [](FwdParams& p) { p.attn.window_right = -5; }, FA_ERROR_INVALID_ARGUMENT,
       "window_right: must be >= -1"},
      {"causal with right window", [](FwdParams& p) { p.attn.causal = 1; p.attn.window_right = 3; },
       FA_ERROR_INVALID_ARGUMENT, "window_right: must be 0 or -1 when causal"},
      {"alignment", [](FwdParams& p) { p.attn.causal_alignment = fa_causal_alignment(7); },
       FA_ERROR_INVALID_ARGUMENT, "causal_alignment: must be"},
      {"dropout range", [](FwdParams& p) { p.attn.dropout_p = 1.5f; }, FA_ERROR_INVALID_ARGUMENT,
       "dropout_p: must be in [0, 1)"},
  };
  // clang-format on
  for (const Rule& r : rules) expect_rule(base(), r);
}

// attn.dropout_rng: (seed, offset) as an int64 (2) tensor on q's device, in place of the two integers.
TEST(Validation, DropoutRngRules) {
  static uint64_t words[4] = {7, 9};
  static int32_t ints[4] = {0};
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"rng dtype", [](FwdParams& p) { p.attn.dropout_rng = make_tensor(ints, FA_INT32, {2}); },
       FA_ERROR_INVALID_ARGUMENT, "dropout_rng: dtype must be int64"},
      {"rng shape", [](FwdParams& p) { p.attn.dropout_rng = make_tensor(words, FA_INT64, {3}); },
       FA_ERROR_INVALID_ARGUMENT, "dropout_rng: shape must be (2)"},
      {"rng rank", [](FwdParams& p) { p.attn.dropout_rng = make_tensor(words, FA_INT64, {1, 2}); },
       FA_ERROR_INVALID_ARGUMENT, "dropout_rng: must have 1 dimensions"},
      {"rng and seed", [](FwdParams& p) { p.attn.dropout_rng = make_tensor(words, FA_INT64, {2}); p.attn.dropout_seed = 3; },
       FA_ERROR_INVALID_ARGUMENT, "dropout_rng: takes the place of dropout_seed and dropout_offset"},
      {"rng and offset", [](FwdParams& p) { p.attn.dropout_rng = make_tensor(words, FA_INT64, {2}); p.attn.dropout_offset = 1; },
       FA_ERROR_INVALID_ARGUMENT, "dropout_rng: takes the place of dropout_seed and dropout_offset"},
      {"rng device", [](FwdParams& p) { p.attn.dropout_rng = make_tensor(words, FA_INT64, {2}); p.attn.dropout_rng.device = FA_DEVICE_CUDA; },
       FA_ERROR_INVALID_ARGUMENT, "dropout_rng: must be on the same device as q"},
      {"rng stride", [](FwdParams& p) { p.attn.dropout_rng = make_tensor(words, FA_INT64, {2}); p.attn.dropout_rng.stride[0] = 2; },
       FA_ERROR_INVALID_ARGUMENT, "dropout_rng: last dimension must have unit stride"},
  };
  // clang-format on
  Case c = base();
  c.dropout_p = 0.2f;
  for (const Rule& r : rules) expect_rule(c, r);
}

TEST(Validation, AlibiRules) {
  static float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f};
  static int32_t ints[8] = {0};
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"alibi shape", [](FwdParams& p) { p.attn.alibi_slopes = make_tensor(slopes, FA_FLOAT32, {3}); },
       FA_ERROR_INVALID_ARGUMENT, "alibi_slopes: shape must be (4)"},
      {"alibi rank", [](FwdParams& p) { p.attn.alibi_slopes = make_tensor(slopes, FA_FLOAT32, {1, 2, 4}); },
       FA_ERROR_INVALID_ARGUMENT, "alibi_slopes: must have shape (heads_q) or (batch, heads_q)"},
      {"alibi dtype", [](FwdParams& p) { p.attn.alibi_slopes = make_tensor(ints, FA_INT32, {4}); },
       FA_ERROR_INVALID_ARGUMENT, "alibi_slopes: dtype must be float32"},
      {"alibi batch", [](FwdParams& p) { p.attn.alibi_slopes = make_tensor(slopes, FA_FLOAT32, {2, 4}); },
       FA_ERROR_INVALID_ARGUMENT, "alibi_slopes: shape must be (1, 4)"},
  };
  // clang-format on
  for (const Rule& r : rules) expect_rule(base(), r);
  Problem pr(base());
  FwdParams p = pr.fwd();
  p.attn.alibi_slopes = make_tensor(slopes, FA_FLOAT32, {1, 4});
  EXPECT_TRUE(forward(p, pr.exec()).ok()) << "(batch, heads) slopes are valid";
}

TEST(Validation, SinkRules) {
  static float sinks[8] = {0.5f, -1.f, 2.f, 0.f};
  static int32_t ints[8] = {0};
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"sinks shape", [](FwdParams& p) { p.attn.sinks = make_tensor(sinks, FA_FLOAT32, {3}); },
       FA_ERROR_INVALID_ARGUMENT, "sinks: shape must be (4)"},
      {"sinks dtype", [](FwdParams& p) { p.attn.sinks = make_tensor(ints, FA_INT32, {4}); },
       FA_ERROR_INVALID_ARGUMENT, "sinks: dtype must be float32"},
      {"sinks rank", [](FwdParams& p) { p.attn.sinks = make_tensor(sinks, FA_FLOAT32, {1, 4}); },
       FA_ERROR_INVALID_ARGUMENT, "sinks: must have 1 dimensions"},
  };
  // clang-format on
  for (const Rule& r : rules) expect_rule(base(), r);
  // dsinks needs sinks, and the right shape.
  Case c = base();
  Problem pr(c);
  BwdParams b = pr.bwd();
  b.dsinks = make_tensor(sinks, FA_FLOAT32, {4});
  Status st = backward(b, pr.exec());
  EXPECT_EQ(st.code, FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message.find("dsinks: needs attn.sinks"), std::string::npos) << st.message;
}

TEST(Validation, VarlenRules) {
  static int32_t bad_cu[3] = {0, 7, 5};
  static int32_t nonzero_cu[3] = {1, 4, 9};
  static int32_t short_cu[3] = {0, 4, 8};
  static float fcu[3] = {0, 4, 9};
  static int32_t used_bad[2] = {7, 1};
  static int32_t used_neg[2] = {-1, 1};
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"only q offsets", [](FwdParams& p) { p.attn.cu_seqlens_k.data = nullptr; }, FA_ERROR_INVALID_ARGUMENT,
       "cu_seqlens_k: varlen needs both"},
      {"not monotone", [](FwdParams& p) { p.attn.cu_seqlens_q.data = bad_cu; }, FA_ERROR_INVALID_ARGUMENT,
       "cu_seqlens_q: must be non-decreasing (entry 2 = 5 < entry 1 = 7)"},
      {"not starting at 0", [](FwdParams& p) { p.attn.cu_seqlens_q.data = nonzero_cu; }, FA_ERROR_INVALID_ARGUMENT,
       "cu_seqlens_q: must start at 0 (got 1)"},
      {"total mismatch", [](FwdParams& p) { p.attn.cu_seqlens_q.data = short_cu; }, FA_ERROR_INVALID_ARGUMENT,
       "cu_seqlens_q: last entry must equal the number of rows of q (got 8, expected 9)"},
      {"float offsets", [](FwdParams& p) { p.attn.cu_seqlens_q = make_tensor(fcu, FA_FLOAT32, {3}); },
       FA_ERROR_INVALID_ARGUMENT, "cu_seqlens_q: dtype must be int32"},
      {"batch mismatch", [](FwdParams& p) { p.attn.cu_seqlens_k.shape[0] = 2; }, FA_ERROR_INVALID_ARGUMENT,
       "cu_seqlens_k: last entry must equal the number of rows of k"},
      {"max seqlen", [](FwdParams& p) { p.attn.max_seqlen_q = 4; }, FA_ERROR_INVALID_ARGUMENT,
       "max_seqlen_q: must be at least the longest sequence (got 4, longest is 5)"},
      {"varlen rank", [](FwdParams& p) { p.attn.q.ndim = 4; }, FA_ERROR_INVALID_ARGUMENT,
       "q: must have 3 dimensions"},
      {"seqused too large", [](FwdParams& p) { p.attn.seqused_k = make_tensor(used_bad, FA_INT32, {2}); },
       FA_ERROR_INVALID_ARGUMENT, "seqused_k: entry 0 must be in [0, 6]"},
      {"seqused negative", [](FwdParams& p) { p.attn.seqused_k = make_tensor(used_neg, FA_INT32, {2}); },
       FA_ERROR_INVALID_ARGUMENT, "seqused_k: entry 0 must be in [0, 6] keys of that sequence (got -1)"},
      {"seqused shape", [](FwdParams& p) { p.attn.seqused_k = make_tensor(used_bad, FA_INT32, {1}); },
       FA_ERROR_INVALID_ARGUMENT, "seqused_k: shape must be (2)"},
      {"lse varlen shape", [](FwdParams& p) { p.lse.shape[1] = 3; }, FA_ERROR_INVALID_ARGUMENT,
       "lse: shape must be (4, 9)"},
  };
  // clang-format on
  for (const Rule& r : rules) expect_rule(varlen_base(), r);
}

TEST(Validation, ExecAndBackwardRules) {
  Problem pr(base());
  FwdParams p = pr.fwd();
  fa_exec e = pr.exec();
  e.backend = FA_BACKEND_CUDA_SM80;
  Status st = forward(p, e);
  EXPECT_EQ(st.code, FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message.find("exec.backend: a CUDA backend needs CUDA tensors"), std::string::npos) << st.message;
  e = pr.exec();
  e.num_threads = -1;
  st = forward(p, e);
  EXPECT_NE(st.message.find("exec.num_threads: must be >= 0"), std::string::npos) << st.message;
  EXPECT_EQ(fa_forward(nullptr, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("params: null pointer"), std::string::npos);

  ASSERT_TRUE(pr.run_forward().ok());
  BwdParams b = pr.bwd();
  b.lse.data = nullptr;
  st = backward(b, pr.exec());
  EXPECT_NE(st.message.find("lse: null data pointer"), std::string::npos) << st.message;
  b = pr.bwd();
  b.dk.shape[1] = 3;
  st = backward(b, pr.exec());
  EXPECT_NE(st.message.find("dk: shape must equal (1, 11, 2, 16)"), std::string::npos) << st.message;
  b = pr.bwd();
  b.dout.dtype = FA_FLOAT16;
  st = backward(b, pr.exec());
  EXPECT_NE(st.message.find("dout: dtype must be bfloat16"), std::string::npos) << st.message;
  b = pr.bwd();
  b.dq.stride[3] = 3;
  st = backward(b, pr.exec());
  EXPECT_NE(st.message.find("dq: last dimension must have unit stride"), std::string::npos) << st.message;
  EXPECT_TRUE(backward(pr.bwd(), pr.exec()).ok());
}

#ifndef FLASHATTN_WITH_CUDA
TEST(Validation, CudaTensorsWithoutCudaBuild) {
  Problem pr(base());
  FwdParams p = pr.fwd();
  p.attn.q.device = p.attn.k.device = p.attn.v.device = p.out.device = p.lse.device = FA_DEVICE_CUDA;
  Status st = forward(p, pr.exec());
  EXPECT_EQ(st.code, FA_ERROR_UNSUPPORTED);
  EXPECT_NE(st.message.find("this build of flashattn has no CUDA backend"), std::string::npos) << st.message;
}
#endif

TEST(Validation, CpuRejectsSequencesBeyondExactFloatPositions) {
  // Shapes only: the check runs before any data is touched, so a tiny buffer stands in for the tensors.
  Case c = base();
  Problem pr(c);
  FwdParams p = pr.fwd();
  const int64_t huge = int64_t(1) << 24;
  p.attn.k.shape[1] = p.attn.v.shape[1] = huge;
  // Broadcast rows (zero strides) keep the views inside the small buffers.
  p.attn.k.stride[0] = p.attn.v.stride[0] = p.attn.k.stride[1] = p.attn.v.stride[1] = 0;
  Status st = forward(p, pr.exec());
  EXPECT_EQ(st.code, FA_ERROR_UNSUPPORTED);
  EXPECT_NE(st.message.find("sequences of 2^24 or more tokens"), std::string::npos) << st.message;
}

TEST(Validation, EmptyProblemsAreValid) {
  Case c = base();
  c.sk = 0;
  Problem pr(c);
  ASSERT_TRUE(pr.run_forward().ok());
  for (float l : pr.lse) EXPECT_EQ(l, -INFINITY);
}

// Class 1 of issue 16: outputs sharing memory with inputs (or each other) gave wrong results.
TEST(Validation, OutputsMustNotOverlap) {
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"out aliases v", [](FwdParams& p) { p.out.data = p.attn.v.data; }, FA_ERROR_INVALID_ARGUMENT,
       "out: must not overlap v in memory"},
      {"out aliases q", [](FwdParams& p) { p.out.data = p.attn.q.data; }, FA_ERROR_INVALID_ARGUMENT,
       "out: must not overlap q in memory"},
      {"lse inside out",
       [](FwdParams& p) { p.lse.data = static_cast<char*>(p.out.data) + 64; }, FA_ERROR_INVALID_ARGUMENT,
       "lse: must not overlap out in memory"},
      {"out broadcast over rows", [](FwdParams& p) { p.out.stride[1] = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "out: elements overlap in memory"},
      {"out heads interleaved", [](FwdParams& p) { p.out.stride[2] = 8; }, FA_ERROR_INVALID_ARGUMENT,
       "out: elements overlap in memory"},
  };
  // clang-format on
  for (const Rule& r : rules) expect_rule(base(), r);

  Problem pr(base());
  ASSERT_TRUE(pr.run_forward().ok());
  auto expect_bwd = [&](const char* what, std::function<void(BwdParams&)> breaks, const char* message) {
    SCOPED_TRACE(what);
    BwdParams b = pr.bwd();
    breaks(b);
    Status st = backward(b, pr.exec());
    EXPECT_EQ(st.code, FA_ERROR_INVALID_ARGUMENT) << st.message;
    EXPECT_NE(st.message.find(message), std::string::npos) << "message was: " << st.message;
  };
  expect_bwd("dq aliases q", [](BwdParams& b) { b.dq.data = b.attn.q.data; }, "dq: must not overlap q in memory");
  expect_bwd("dk aliases dv", [](BwdParams& b) { b.dv.data = b.dk.data; }, "dv: must not overlap dk in memory");
  expect_bwd("dv aliases dout", [](BwdParams& b) { b.dv.data = b.dout.data; }, "dv: must not overlap dout in memory");
  expect_bwd("dq aliases lse", [](BwdParams& b) { b.dq.data = b.lse.data; }, "dq: must not overlap lse in memory");
  EXPECT_TRUE(backward(pr.bwd(), pr.exec()).ok());
}

// Views that interleave in one buffer without sharing an element are not overlap: a packed dqkv (as the
// qkvpacked backward allocates) and q/out side by side in one row-interleaved buffer.
TEST(Validation, InterleavedViewsAreNotOverlap) {
  Case c = base();
  c.sk = c.sq;
  c.hkv = c.hq;
  Problem pr(c);
  ASSERT_TRUE(pr.run_forward().ok());
  ASSERT_TRUE(pr.run_backward().ok());
  const int64_t S = c.sq, H = c.hq, D = c.d;
  std::vector<uint16_t> dqkv(size_t(S * 3 * H * D), 0xffff);
  BwdParams b = pr.bwd();
  for (int i = 0; i < 3; ++i) {
    fa_tensor t = make_tensor(dqkv.data() + i * H * D, c.dtype, {1, S, H, D});
    t.stride[0] = S * 3 * H * D;
    t.stride[1] = 3 * H * D;
    (i == 0 ? b.dq : i == 1 ? b.dk : b.dv) = t;
  }
  Status st = backward(b, pr.exec());
  ASSERT_TRUE(st.ok()) << st.message;
  for (int64_t s = 0; s < S; ++s)
    for (int i = 0; i < 3; ++i) {
      const std::vector<uint8_t>& want = i == 0 ? pr.dq : i == 1 ? pr.dk : pr.dv;
      EXPECT_EQ(std::memcmp(dqkv.data() + (s * 3 + i) * H * D, want.data() + s * H * D * 2, size_t(H * D * 2)), 0)
          << "packed gradient " << i << " row " << s << " differs from the separate buffers' result";
    }

  // out in the first half of each head's 2D slot, q (a copy) in the second half.
  std::vector<uint16_t> qo(size_t(S * H * 2 * D), 0xffff);
  const uint16_t* q16 = reinterpret_cast<const uint16_t*>(pr.q.data());
  for (int64_t r = 0; r < S * H; ++r) std::copy(q16 + r * D, q16 + (r + 1) * D, qo.data() + r * 2 * D + D);
  FwdParams f = pr.fwd();
  f.attn.q = make_tensor(qo.data() + D, c.dtype, {1, S, H, D});
  f.out = make_tensor(qo.data(), c.dtype, {1, S, H, D});
  for (fa_tensor* t : {&f.attn.q, &f.out}) {
    t->stride[2] = 2 * D;
    t->stride[1] = 2 * D * H;
    t->stride[0] = 2 * D * H * S;
  }
  st = forward(f, pr.exec());
  ASSERT_TRUE(st.ok()) << st.message;
  const uint16_t* out16 = reinterpret_cast<const uint16_t*>(pr.out.data());
  for (int64_t r = 0; r < S * H; ++r)
    EXPECT_TRUE(std::equal(out16 + r * D, out16 + (r + 1) * D, qo.data() + r * 2 * D)) << "row " << r;
}

// Class 2: sizes whose products wrap, and windows near INT64_MAX.
TEST(Validation, SizesAndStridesMustNotOverflow) {
  const int64_t big = int64_t(1) << 32;
  // A hand-aligned case table: one case or rule per line.
  // clang-format off
  const std::vector<Rule> rules = {
      {"element count wraps to 0",
       [big](FwdParams& p) {
         p.attn.q.shape[0] = big;
         p.attn.q.shape[1] = big;
         p.attn.q.data = nullptr;
       },
       FA_ERROR_INVALID_ARGUMENT, "q: element count of shape (4294967296, 4294967296, 4, 16) overflows int64"},
      {"extent overflows",
       [](FwdParams& p) { p.attn.k.stride[1] = INT64_MAX / 4; }, FA_ERROR_INVALID_ARGUMENT,
       "k: shape (1, 11, 2, 16) with strides (352, 2305843009213693951, 16, 1) spans more memory than int64"},
      {"pointer plus extent wraps",
       [](FwdParams& p) {
         p.attn.v.stride[0] = p.attn.v.stride[1] = p.attn.v.stride[2] = 0;
         p.attn.v.shape[3] = 8;
         p.attn.k.shape[3] = 8;
         p.attn.q.shape[3] = 8;
         p.attn.v.data = reinterpret_cast<void*>(uintptr_t(0) - 8);
       },
       FA_ERROR_INVALID_ARGUMENT, "v: shape (1, 11, 2, 8) with strides (0, 0, 0, 1) spans more memory"},
      {"batch beyond int32",
       [big](FwdParams& p) {
         for (fa_tensor* t : {&p.attn.q, &p.attn.k, &p.attn.v}) {
           t->shape[0] = big;
           t->stride[0] = 0;
         }
       },
       FA_ERROR_INVALID_ARGUMENT, "q: batch must be at most 2^31 - 1 (got 4294967296)"},
      {"seqlen_k beyond int32",
       [big](FwdParams& p) {
         for (fa_tensor* t : {&p.attn.k, &p.attn.v}) {
           t->shape[1] = big;
           t->stride[0] = t->stride[1] = 0;
         }
       },
       FA_ERROR_INVALID_ARGUMENT, "k: seqlen_k must be at most 2^31 - 1 (got 4294967296)"},
  };
  // clang-format on
  for (const Rule& r : rules) expect_rule(base(), r);
  const std::vector<Rule> varlen_rules = {
      {"max_seqlen_q huge", [](FwdParams& p) { p.attn.max_seqlen_q = INT64_MAX; }, FA_ERROR_INVALID_ARGUMENT,
       "max_seqlen_q: must be in [0, 2^31 - 1] (got 9223372036854775807)"},
      {"max_seqlen_k huge", [](FwdParams& p) { p.attn.max_seqlen_k = int64_t(1) << 31; }, FA_ERROR_INVALID_ARGUMENT,
       "max_seqlen_k: must be in [0, 2^31 - 1]"},
  };
  for (const Rule& r : varlen_rules) expect_rule(varlen_base(), r);
}

// A window side of at least the longest sequence is the unbounded side: near INT64_MAX it used to wrap in the
// mask arithmetic (every key masked). Same bytes as -1, forward and backward, both alignments.
TEST(Validation, HugeWindowsMeanUnbounded) {
  for (bool top_left : {false, true})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{9, 11}, {11, 9}})
      for (auto [left, right] : {std::pair<int64_t, int64_t>{INT64_MAX, INT64_MAX},
                                 {INT64_MAX - 1, 2},
                                 {3, INT64_MAX},
                                 {11, 11},
                                 {INT64_MAX, -1}}) {
        Case c = base();
        c.sq = sq;
        c.sk = sk;
        c.top_left = top_left;
        c.wl = left;
        c.wr = right;
        SCOPED_TRACE(c.label());
        Case u = c;
        u.wl = left >= 11 ? -1 : left;
        u.wr = right >= 11 ? -1 : right;
        Problem huge(c), unbounded(u);
        ASSERT_TRUE(huge.run_forward().ok());
        ASSERT_TRUE(unbounded.run_forward().ok());
        EXPECT_TRUE(huge.out == unbounded.out) << "out differs from the unbounded window's";
        EXPECT_TRUE(huge.lse == unbounded.lse) << "lse differs from the unbounded window's";
        ASSERT_TRUE(huge.run_backward().ok());
        ASSERT_TRUE(unbounded.run_backward().ok());
        EXPECT_TRUE(huge.dq == unbounded.dq && huge.dk == unbounded.dk && huge.dv == unbounded.dv)
            << "gradients differ from the unbounded window's";
      }
  Case c = base();
  c.causal = true;
  c.wl = INT64_MAX;
  expect_matches_reference(c, true);
}

// Class 3: an exception (here std::bad_alloc) must not escape the C ABI; it aborted the caller. The child
// process caps its address space so that copying 16M cu_seqlens entries for the validation fails.
// Runs in the death-test child: exits 0 when the call reported the failed allocation as FA_ERROR_BACKEND.
[[noreturn]] void forward_under_address_space_cap() {
  const int64_t batch = int64_t(1) << 24;
  std::vector<int32_t> cu(size_t(batch + 1), 0);
  cu.back() = 1;
  std::vector<uint16_t> q(8), k(8), v(8), out(8);
  std::vector<float> lse(1);
  FwdParams p = make_fwd_params();
  p.attn.q = make_tensor(q.data(), FA_BFLOAT16, {1, 1, 8});
  p.attn.k = make_tensor(k.data(), FA_BFLOAT16, {1, 1, 8});
  p.attn.v = make_tensor(v.data(), FA_BFLOAT16, {1, 1, 8});
  p.attn.cu_seqlens_q = p.attn.cu_seqlens_k = make_tensor(cu.data(), FA_INT32, {batch + 1});
  p.attn.max_seqlen_q = p.attn.max_seqlen_k = 1;
  p.out = make_tensor(out.data(), FA_BFLOAT16, {1, 1, 8});
  p.lse = make_tensor(lse.data(), FA_FLOAT32, {1, 1});
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const rlim_t cap = rlim_t(pages) * 4096 + (rlim_t(4) << 20);
  struct rlimit lim = {cap, cap};
  if (pages == 0 || setrlimit(RLIMIT_AS, &lim) != 0) std::exit(3);
  const fa_status st = fa_forward(&p, nullptr);
  const std::string msg = fa_last_error();
  std::fprintf(stderr, "status %d: %s\n", int(st), msg.c_str());
  std::exit(st == FA_ERROR_BACKEND && msg.find("out of memory") != std::string::npos ? 0 : 1);
}

TEST(Validation, AllocationFailureIsABackendError) {
  // A forked child of a process that has run OpenMP regions can hang in libgomp: re-execute instead.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(forward_under_address_space_cap(), ::testing::ExitedWithCode(0), "status 3: out of memory");
}

// Class 4: thread counts beyond the machine are clamped (100000 used to crash inside OpenMP).
TEST(Validation, HugeThreadCountsAreClamped) {
  for (int threads : {100000, INT_MAX}) {
    Case c = base();
    c.threads = threads;
    expect_matches_reference(c, true);
  }
}

// Class 5: empty tensors as numpy makes them (zero strides, any pointer) are valid, not a stride error.
TEST(Validation, EmptyTensorsWithZeroStrides) {
  for (int which : {0, 1, 2}) {
    Case c = base();
    if (which == 0) c.batch = 0;
    if (which == 1) c.sq = 0;
    if (which == 2) c.sk = 0;
    SCOPED_TRACE(which);
    Problem pr(c);
    BwdParams b = pr.bwd();
    FwdParams f = pr.fwd();
    for (fa_tensor* t : {&f.attn.q, &f.attn.k, &f.attn.v, &f.out, &f.lse, &b.attn.q, &b.attn.k, &b.attn.v, &b.out,
                         &b.lse, &b.dout, &b.dq, &b.dk, &b.dv}) {
      int64_t n = 1;
      for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
      if (n == 0)
        for (int i = 0; i < t->ndim; ++i) t->stride[i] = 0;
    }
    Status st = forward(f, pr.exec());
    ASSERT_TRUE(st.ok()) << st.message;
    for (float l : pr.lse) EXPECT_EQ(l, -INFINITY);
    st = backward(b, pr.exec());
    ASSERT_TRUE(st.ok()) << st.message;
    if (which == 2)
      for (size_t i = 0; i < pr.dq.size(); ++i) ASSERT_EQ(pr.dq[i], 0) << "dq must be 0 without keys";
  }
}

// fa_make_tensor with a shape whose strides overflow saturates, so the validation reports the tensor.
TEST(Validation, MakeTensorOverflowIsReported) {
  Problem pr(base());
  FwdParams p = pr.fwd();
  const int64_t shape[4] = {1, 9, int64_t(1) << 40, int64_t(1) << 40};
  p.attn.q = fa_make_tensor(pr.q.data(), FA_BFLOAT16, FA_DEVICE_CPU, 4, shape);
  Status st = forward(p, pr.exec());
  EXPECT_EQ(st.code, FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message.find("q: element count"), std::string::npos) << st.message;
  p.attn.q = fa_make_tensor(pr.q.data(), FA_BFLOAT16, FA_DEVICE_CPU, 4, nullptr);
  st = forward(p, pr.exec());
  EXPECT_NE(st.message.find("q: must have 4 dimensions (got -1)"), std::string::npos) << st.message;
}

// The plan view: what a call would run, with the call's own errors when it would fail.
TEST(Validation, PlanViewMatchesTheCall) {
  Problem pr(base());
  PlanInfo info{};
  ASSERT_TRUE(forward_plan(pr.fwd(), &info, pr.exec()).ok());
  EXPECT_STREQ(info.kernels, "cpu");
  EXPECT_GT(info.block_q, 0);
  EXPECT_GT(info.block_k, 0);
  EXPECT_EQ(info.num_splits, 1);
  EXPECT_EQ(info.workspace_bytes, 0);
  PlanInfo binfo{};
  ASSERT_TRUE(backward_plan(pr.bwd(), &binfo, pr.exec()).ok());
  EXPECT_STREQ(binfo.kernels, "cpu");
  int bq = 0, bk = 0;
  FwdParams fp = pr.fwd();
  fa_exec e = pr.exec();
  fa_forward_tile_shape(&fp, &e, &bq, &bk);
  EXPECT_EQ(bq, info.block_q);
  EXPECT_EQ(bk, info.block_k);

  EXPECT_EQ(fa_forward_plan(&fp, &e, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("info"), std::string::npos) << fa_last_error();
  EXPECT_EQ(fa_forward_plan(nullptr, &e, &info), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fa_backward_plan(nullptr, &e, &info), FA_ERROR_INVALID_ARGUMENT);
  // An invalid call: the plan reports what the call reports.
  fp.attn.k.shape[3] = 8;  // head dim differs from q's
  const Status call = forward(fp, e);
  const Status plan = forward_plan(fp, &info, e);
  EXPECT_EQ(plan.code, call.code);
  EXPECT_EQ(plan.message, call.message);
  EXPECT_NE(call.code, FA_OK);
}

}  // namespace
}  // namespace flashattn::testing
