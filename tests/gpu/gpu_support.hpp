// Shared pieces of the GPU test binary: device buffers, tensor views and case tables over the suites' one Case
// (tests/case.hpp).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <string>
#include <vector>

#include "case.hpp"
#include "cpu/numeric.hpp"
#include "flashattn/flashattn.h"

namespace flashattn::gpu_testing {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// The Hopper backend runs only on compute capability 9.0 devices and only when the build has its kernels: the
// sm90 cases skip elsewhere. FLASHATTN_REQUIRE_SM90=1 (the GPU harness sets it on an sm90 device with a build for
// 90a) turns that skip into a failure, so that a build without the sm90 kernels cannot pass green on a Hopper GPU.
inline bool sm90_required() {
  const char* v = std::getenv("FLASHATTN_REQUIRE_SM90");
  return v != nullptr && std::string(v) == "1";
}
inline bool sm90_unavailable_message(const std::string& msg) {
  const bool unavailable =
      msg.find("needs a compute capability 9.0") != std::string::npos || msg.find("no cuda-sm90") != std::string::npos;
  // FLASHATTN_KERNELS=ci builds one instance per family (not, e.g., the sm90 softcap/ALiBi variants, sm80 fp16 or the
  // head dims FLASHATTN_SM90_HDIMS leaves out): a case that names an instance missing "in this build" skips there;
  // every other build has them.
#if defined(FA_TEST_KERNEL_SET_CI)
  if (((msg.find("cuda-sm90 backend has no kernel") != std::string::npos ||
        msg.find("cuda-sm80 backend has no kernel") != std::string::npos) &&
       msg.find("in this build") != std::string::npos) ||
      msg.find("this build has no cuda-sm90 FP8 kernel") != std::string::npos)
    return true;
#endif
  return unavailable && !sm90_required();
}

// The one case vocabulary of the suites (tests/case.hpp); fields the GPU tables leave at their defaults mean the
// same as in the CPU suites.
using flashattn::testing::Alibi;
using flashattn::testing::backend_label;
using flashattn::testing::Case;
using flashattn::testing::Comparison;

// Fields of the shared Case this binary's runners do not build (the CPU suites' Problem does): a table that sets
// one fails its case instead of silently running another problem. Empty when the case is expressible here.
inline std::string fields_not_built_here(const Case& c) {
  std::string s;
  if (c.head_pad) s += " head_pad";
  if (!c.lse) s += " lse=false";
  if (c.threads) s += " threads";
  if (c.seed != Case{}.seed) s += " seed (the GPU runners seed from the name)";
  return s;
}

// The same cases once per CUDA backend; names get the backend as a prefix.
inline std::vector<Case> for_backends(const std::vector<Case>& cases, std::initializer_list<fa_backend> backends) {
  std::vector<Case> out;
  for (fa_backend b : backends)
    for (Case c : cases) {
      c.backend = b;
      c.name = std::string(b == FA_BACKEND_CUDA_SM90 ? "sm90_" : "sm80_") + c.name;
      out.push_back(c);
    }
  return out;
}

// The tensor geometry of a case: varlen offsets, rows per tensor, leading (batch) dimension count. The tests
// unpack it with a structured binding in member order.
struct CaseGeometry {
  bool varlen;
  int64_t batch;  // sequences
  std::vector<int32_t> cu_q{0}, cu_k{0};
  int64_t rows_q, rows_k;  // rows per batch entry (varlen: all rows)
  int64_t nb;              // leading dim count of batched tensors (1 for varlen)
  explicit CaseGeometry(const Case& c) : varlen(!c.lens_q.empty()), batch(varlen ? int64_t(c.lens_q.size()) : c.batch) {
    for (size_t b = 0; varlen && b < c.lens_q.size(); ++b) {
      cu_q.push_back(cu_q.back() + c.lens_q[b]);
      cu_k.push_back(cu_k.back() + c.lens_k[b]);
    }
    rows_q = varlen ? cu_q.back() : c.sq;
    rows_k = varlen ? cu_k.back() : c.sk;
    nb = varlen ? 1 : batch;
  }
};

inline uint16_t to_storage(fa_dtype t, float x) {
  return t == FA_FLOAT16 ? flashattn::cpu::float_to_fp16(x) : flashattn::cpu::float_to_bf16(x);
}
inline double from_storage(fa_dtype t, uint16_t x) {
  return t == FA_FLOAT16 ? flashattn::cpu::fp16_to_float(x) : flashattn::cpu::bf16_to_float(x);
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    void* p = nullptr;
    ptr = cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) == cudaSuccess ? static_cast<T*>(p) : nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& h) {
    ASSERT_EQ(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// A (rows..., heads, dim) tensor with row stride heads*dim + pad.
inline fa_tensor view(void* data, fa_dtype dt, fa_device dev, bool varlen, int64_t batch, int64_t rows, int64_t heads,
                      int64_t dim, int64_t pad) {
  fa_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  const int64_t row = heads * dim + pad;
  if (varlen) {
    t.ndim = 3;
    int64_t s[3] = {rows, heads, dim}, st[3] = {row, dim, 1};
    std::memcpy(t.shape, s, sizeof s);
    std::memcpy(t.stride, st, sizeof st);
  } else {
    t.ndim = 4;
    int64_t s[4] = {batch, rows, heads, dim}, st[4] = {rows * row, row, dim, 1};
    std::memcpy(t.shape, s, sizeof s);
    std::memcpy(t.stride, st, sizeof st);
  }
  return t;
}

struct MaskKind {
  const char* name;
  bool causal, top_left;
  int64_t wl, wr;
};

// No mask, causal in both alignments, a two-sided window: the masks of the backward and dropout grids.
inline constexpr MaskKind kCommonMasks[] = {{"none", false, false, -1, -1},
                                            {"causal_br", true, false, -1, -1},
                                            {"causal_tl", true, true, -1, -1},
                                            {"window", false, false, 37, 5}};

// Every (dtype, shape, mask) combination; shape i runs with head dim hdims[i]. Named
// "<dtype>_<sq>x<sk>_d<d>_<mask>" so a failure names its case.
template <size_t kShapes, size_t kMasks>
std::vector<Case> shape_mask_grid(const std::pair<int64_t, int64_t> (&shapes)[kShapes], const int64_t (&hdims)[kShapes],
                                  const MaskKind (&masks)[kMasks]) {
  std::vector<Case> v;
  for (fa_dtype dt : {FA_BFLOAT16, FA_FLOAT16})
    for (size_t si = 0; si < kShapes; ++si)
      for (const MaskKind& m : masks) {
        Case c;
        c.dtype = dt;
        c.sq = shapes[si].first, c.sk = shapes[si].second;
        c.d = c.dv = hdims[si];
        c.batch = c.sq * c.sk < 10000 ? 2 : 1;
        c.causal = m.causal, c.top_left = m.top_left, c.wl = m.wl, c.wr = m.wr;
        c.name = std::string(dtype_short_name(dt)) + "_" + std::to_string(c.sq) + "x" + std::to_string(c.sk) + "_d" +
                 std::to_string(c.d) + "_" + m.name;
        v.push_back(c);
      }
  return v;
}

}  // namespace flashattn::gpu_testing
