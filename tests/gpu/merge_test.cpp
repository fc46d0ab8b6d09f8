// fa_merge_partials on CUDA writes what the CPU merge writes (the one rule of core/merge_rule.hpp; the CPU merge is
// checked against float64 and against attention over the union in tests/test_merge.cpp), for every dtype pair,
// batched and varlen, with rows that one part or both did not see (their out holds NaN: it must not be read), a NaN
// log-sum-exp, and lse views inside a wider buffer.
#include <cmath>
#include <random>

#include "flashattn/flashattn.hpp"
#include "gpu_support.hpp"

namespace {

using namespace flashattn::gpu_testing;

fa_tensor dense(void* data, fa_dtype t, fa_device dev, std::initializer_list<int64_t> shape) {
  fa_tensor x = flashattn::make_tensor(data, t, shape);
  x.device = dev;
  return x;
}

size_t size_of(fa_dtype t) { return t == FA_FLOAT32 ? 4 : 2; }
float get(fa_dtype t, const uint8_t* at) {
  uint16_t x;
  float f;
  if (t == FA_FLOAT32) return std::memcpy(&f, at, 4), f;
  std::memcpy(&x, at, 2);
  return t == FA_FLOAT16 ? flashattn::cpu::fp16_to_float(x) : flashattn::cpu::bf16_to_float(x);
}
void put(fa_dtype t, float f, uint8_t* at) {
  if (t == FA_FLOAT32) return void(std::memcpy(at, &f, 4));
  const uint16_t x = t == FA_FLOAT16 ? flashattn::cpu::float_to_fp16(f) : flashattn::cpu::float_to_bf16(f);
  std::memcpy(at, &x, 2);
}

TEST(GpuMerge, WritesWhatTheCpuMergeWrites) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (fa_dtype a : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
    for (fa_dtype b : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
      for (bool varlen : {false, true}) {
        SCOPED_TRACE(std::string(flashattn::dtype_name(a)) + " <- " + flashattn::dtype_name(b) +
                     (varlen ? " varlen" : ""));
        const int64_t batch = varlen ? 1 : 3, rows = varlen ? 301 : 97, heads = 5, dim = 72, lse_pad = 3;
        const size_t n = size_t(batch * rows * heads * dim), nl = size_t(batch * (heads + lse_pad) * rows);
        std::vector<uint8_t> out(n * size_of(a)), out_b(n * size_of(b));
        std::vector<float> lse(nl, 0.f), lse_b(size_t(batch * heads * rows));
        for (size_t i = 0; i < lse_b.size(); ++i) {
          const int kind = int(i % 7);  // 0-3 finite, 4: a empty, 5: b empty, 6: both
          const int64_t bb = int64_t(i) / (heads * rows), h = int64_t(i) / rows % heads, r = int64_t(i) % rows;
          lse[size_t((bb * (heads + lse_pad) + h) * rows + r)] = kind == 4 || kind == 6 ? -INFINITY : 5.f * normal(rng);
          lse_b[i] = kind == 5 || kind == 6 ? -INFINITY : 5.f * normal(rng);
        }
        lse_b[1] = NAN;
        for (size_t i = 0; i < n; ++i) {
          put(a, normal(rng), &out[i * size_of(a)]);
          put(b, normal(rng), &out_b[i * size_of(b)]);
        }
        // The out rows of empty parts hold NaN (a kernel that read them would say so).
        for (int64_t bb = 0; bb < batch; ++bb)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t h = 0; h < heads; ++h) {
              const size_t row = size_t(((bb * rows + r) * heads + h) * dim);
              for (int64_t c = 0; c < dim; ++c) {
                if (lse[size_t((bb * (heads + lse_pad) + h) * rows + r)] == -INFINITY)
                  put(a, NAN, &out[(row + size_t(c)) * size_of(a)]);
                if (lse_b[size_t((bb * heads + h) * rows + r)] == -INFINITY)
                  put(b, NAN, &out_b[(row + size_t(c)) * size_of(b)]);
              }
            }
        auto tensors = [&](fa_merge_params* p, void* o, void* l, void* ob, void* lb, fa_device dev) {
          p->out = varlen ? dense(o, a, dev, {rows, heads, dim}) : dense(o, a, dev, {batch, rows, heads, dim});
          p->out_b = varlen ? dense(ob, b, dev, {rows, heads, dim}) : dense(ob, b, dev, {batch, rows, heads, dim});
          p->lse = varlen ? dense(l, FA_FLOAT32, dev, {heads, rows}) : dense(l, FA_FLOAT32, dev, {batch, heads, rows});
          if (!varlen) p->lse.stride[0] = (heads + lse_pad) * rows;  // a view of the first heads of a wider buffer
          p->lse_b =
              varlen ? dense(lb, FA_FLOAT32, dev, {heads, rows}) : dense(lb, FA_FLOAT32, dev, {batch, heads, rows});
        };
        DeviceBuffer<uint8_t> d_out(out.size()), d_out_b(out_b.size());
        DeviceBuffer<float> d_lse(lse.size()), d_lse_b(lse_b.size());
        d_out.upload(out), d_out_b.upload(out_b), d_lse.upload(lse), d_lse_b.upload(lse_b);
        fa_merge_params gp{}, hp{};
        tensors(&gp, d_out.ptr, d_lse.ptr, d_out_b.ptr, d_lse_b.ptr, FA_DEVICE_CUDA);
        tensors(&hp, out.data(), lse.data(), out_b.data(), lse_b.data(), FA_DEVICE_CPU);
        ASSERT_EQ(fa_merge_partials(&gp, nullptr), FA_OK) << fa_last_error();
        ASSERT_EQ(fa_merge_partials(&hp, nullptr), FA_OK) << fa_last_error();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got_lse = d_lse.download();
        ASSERT_TRUE(std::isnan(got_lse[1]) && std::isnan(lse[1])) << "a NaN lse_b makes the row NaN";
        for (size_t i = 0; i < lse.size(); ++i) {
          if (std::isnan(lse[i])) continue;
          if (std::isinf(lse[i])) {
            ASSERT_EQ(got_lse[i], lse[i]) << i;
            continue;
          }
          ASSERT_NEAR(got_lse[i], lse[i], 1e-6f * (1.f + std::fabs(lse[i]))) << i;
        }
        // expf differs between the device and the host by an ulp or two; out's rounding may then take the other
        // neighbour.
        const double ulp = a == FA_FLOAT32 ? 0x1p-20 : a == FA_FLOAT16 ? 0x1p-10 : 0x1p-7;
        const std::vector<uint8_t> got = d_out.download();
        size_t nan_rows = 0;
        for (size_t i = 0; i < n; ++i) {
          const float g = get(a, &got[i * size_of(a)]), h = get(a, &out[i * size_of(a)]);
          if (std::isnan(h)) {
            ++nan_rows;
            ASSERT_TRUE(std::isnan(g)) << i;
            continue;
          }
          ASSERT_NEAR(g, h, ulp * (1.0 + std::fabs(h))) << i;
        }
        EXPECT_EQ(nan_rows, size_t(dim)) << "only the NaN row is NaN";
      }
}

// A host pointer labelled CUDA is a named error, not a fault.
TEST(GpuMerge, HostMemoryLabelledCudaIsANamedError) {
  SKIP_WITHOUT_GPU();
  std::vector<float> out(2 * 3 * 4, 0.f), lse(3 * 2, 0.f), out_b(out), lse_b(lse);
  fa_merge_params p{};
  p.out = dense(out.data(), FA_FLOAT32, FA_DEVICE_CUDA, {2, 3, 4});
  p.lse = dense(lse.data(), FA_FLOAT32, FA_DEVICE_CUDA, {3, 2});
  p.out_b = dense(out_b.data(), FA_FLOAT32, FA_DEVICE_CUDA, {2, 3, 4});
  p.lse_b = dense(lse_b.data(), FA_FLOAT32, FA_DEVICE_CUDA, {3, 2});
  EXPECT_EQ(fa_merge_partials(&p, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(fa_last_error()).rfind("lse:", 0), 0u) << fa_last_error();
}

}  // namespace
