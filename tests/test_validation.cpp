// Every validation rule has a case that breaks exactly it and expects its specific error.
#include <gtest/gtest.h>

#include <cmath>
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
  c.seqlen_q = 9;
  c.seqlen_k = 11;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 16;
  return c;
}

Case varlen_base() {
  Case c = base();
  c.varlen_q = {4, 5};
  c.varlen_k = {6, 5};
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
  const std::vector<Rule> rules = {
      {"null q", [](FwdParams& p) { p.attn.q.data = nullptr; }, FA_ERROR_INVALID_ARGUMENT, "q: null data pointer"},
      {"null k", [](FwdParams& p) { p.attn.k.data = nullptr; }, FA_ERROR_INVALID_ARGUMENT, "k: null data pointer"},
      {"null out", [](FwdParams& p) { p.out.data = nullptr; }, FA_ERROR_INVALID_ARGUMENT, "out: null data pointer"},
      {"rank", [](FwdParams& p) { p.attn.q.ndim = 3; }, FA_ERROR_INVALID_ARGUMENT, "q: must have 4 dimensions"},
      {"dtype mismatch", [](FwdParams& p) { p.attn.k.dtype = FA_FLOAT16; }, FA_ERROR_INVALID_ARGUMENT,
       "k: dtype must be bfloat16 (same as q)"},
      {"int32 q", [](FwdParams& p) { p.attn.q.dtype = FA_INT32; }, FA_ERROR_INVALID_ARGUMENT,
       "q: dtype must be float32, float16 or bfloat16"},
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
  for (const Rule& r : rules) expect_rule(base(), r);
}

TEST(Validation, ScalarAndMaskRules) {
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
      {"dropout unsupported", [](FwdParams& p) { p.attn.dropout_p = 0.1f; }, FA_ERROR_UNSUPPORTED,
       "dropout is not implemented"},
  };
  for (const Rule& r : rules) expect_rule(base(), r);
}

TEST(Validation, AlibiRules) {
  static float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f};
  static int32_t ints[8] = {0};
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
  for (const Rule& r : rules) expect_rule(base(), r);
  Problem pr(base());
  FwdParams p = pr.fwd();
  p.attn.alibi_slopes = make_tensor(slopes, FA_FLOAT32, {1, 4});
  EXPECT_TRUE(forward(p, pr.exec()).ok()) << "(batch, heads) slopes are valid";
}

TEST(Validation, VarlenRules) {
  static int32_t bad_cu[3] = {0, 7, 5};
  static int32_t nonzero_cu[3] = {1, 4, 9};
  static int32_t short_cu[3] = {0, 4, 8};
  static float fcu[3] = {0, 4, 9};
  static int32_t used_bad[2] = {7, 1};
  static int32_t used_neg[2] = {-1, 1};
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
  p.attn.k.stride[0] = p.attn.v.stride[0] = 0;
  Status st = forward(p, pr.exec());
  EXPECT_EQ(st.code, FA_ERROR_UNSUPPORTED);
  EXPECT_NE(st.message.find("sequences of 2^24 or more tokens"), std::string::npos) << st.message;
}

TEST(Validation, EmptyProblemsAreValid) {
  Case c = base();
  c.seqlen_k = 0;
  Problem pr(c);
  ASSERT_TRUE(pr.run_forward().ok());
  for (float l : pr.lse) EXPECT_EQ(l, -INFINITY);
}

}  // namespace
}  // namespace flashattn::testing
