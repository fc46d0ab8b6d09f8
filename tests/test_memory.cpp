// Extra memory of forward + backward stays O(N): at seqlen 32k an N x N fp32 score matrix would be 4 GiB.
// Its own executable, so the process's peak RSS measures this test alone.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include "attention_case.hpp"
#include "cpu/tiles.hpp"

namespace flashattn::testing {
namespace {

size_t fwd_bwd_peak_scratch(int64_t seqlen) {
  Case c;
  c.sq = c.sk = seqlen;
  c.hq = c.hkv = 1;
  c.d = 64;
  c.causal = true;
  // Two threads on every machine: the backward's dQ partial sums (one per key chunk, no atomics) grow with the
  // thread count, which is O(N) per chunk, not N^2, but would move the absolute bound below with the host (16
  // threads at 32k: 72 MB, 2 threads: 52 MB).
  c.threads = 2;
  Problem pr(c);
  cpu::reset_peak_scratch_bytes();
  EXPECT_TRUE(pr.run_forward().ok());
  EXPECT_TRUE(pr.run_backward().ok());
  return cpu::peak_scratch_bytes();
}

TEST(Memory, ForwardBackwardExtraMemoryIsLinear) {
  const size_t at16k = fwd_bwd_peak_scratch(16384);
  const size_t at32k = fwd_bwd_peak_scratch(32768);
  const double n2_bytes = 32768.0 * 32768.0 * 4;
  std::printf("peak scratch: 16k %.1f MB, 32k %.1f MB (an N^2 fp32 matrix at 32k: %.0f MB)\n", at16k / 1e6, at32k / 1e6,
              n2_bytes / 1e6);
  // Doubling N at most doubles the scratch (plus per-thread tiles); quadratic growth would be 4x.
  EXPECT_LE(double(at32k), 2.2 * double(at16k));
  EXPECT_LT(double(at32k), n2_bytes / 64);
  // The whole process, inputs and gradients included (8 tensors of 4 MB), stays far below one N^2 matrix.
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double rss_bytes = double(ru.ru_maxrss) * 1024;
  std::printf("peak RSS: %.1f MB\n", rss_bytes / 1e6);
  EXPECT_LT(rss_bytes, n2_bytes / 8);
}

// GQA/MQA: the backward's fp32 dK/dV accumulators are held per KV head (one query-head subgroup per KV head when
// the threads are occupied without more), not per query head. 8 query heads sharing one KV head at 4k, d64, one
// thread: the MHA problem's accumulators (8 heads x 4096 keys x (64 + 64) x 4 B = 16.8 MB) shrink to one head's.
size_t bwd_peak_scratch(int64_t heads_kv) {
  Case c;
  c.sq = c.sk = 4096;
  c.hq = 8;
  c.hkv = heads_kv;
  c.d = 64;
  c.threads = 1;
  Problem pr(c);
  EXPECT_TRUE(pr.run_forward().ok());
  cpu::reset_peak_scratch_bytes();
  EXPECT_TRUE(pr.run_backward().ok());
  return cpu::peak_scratch_bytes();
}

TEST(Memory, GqaBackwardAccumulatorsPerKvHead) {
  const size_t mha = bwd_peak_scratch(8), mqa = bwd_peak_scratch(1);
  const double per_head_acc = 4096.0 * (64 + 64) * 4;
  std::printf("backward peak scratch: MHA 8/8 %.1f MB, MQA 8/1 %.1f MB\n", mha / 1e6, mqa / 1e6);
  EXPECT_LE(double(mqa), double(mha) - 0.9 * 7 * per_head_acc);
}

}  // namespace
}  // namespace flashattn::testing
