// The CPU backend: picks the kernels build for this processor's vector width and reports tile shapes.
#include <atomic>
#include <string>

#include "core/backend.hpp"
#include "cpu/tiles.hpp"

namespace flashattn::cpu {

#define FA_DECLARE_ISA(ns)                                       \
  namespace ns {                                                 \
  detail::Error forward(const detail::Problem& p, int threads);  \
  detail::Error backward(const detail::Problem& p, int threads); \
  }
FA_DECLARE_ISA(baseline)
#ifdef FA_CPU_HAVE_AVX2
FA_DECLARE_ISA(avx2)
#endif
#ifdef FA_CPU_HAVE_AVX512
FA_DECLARE_ISA(avx512)
#endif
#ifdef FA_CPU_HAVE_AVX512BF16
FA_DECLARE_ISA(avx512bf16)
#endif
#undef FA_DECLARE_ISA

namespace {

std::atomic<std::size_t> g_current{0}, g_peak{0};

struct Kernels {
  detail::Error (*forward)(const detail::Problem&, int);
  detail::Error (*backward)(const detail::Problem&, int);
};

Kernels pick() {
#if defined(FA_CPU_HAVE_AVX512BF16)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16"))
    return {avx512bf16::forward, avx512bf16::backward};
#endif
#if defined(FA_CPU_HAVE_AVX512)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return {avx512::forward, avx512::backward};
#endif
#if defined(FA_CPU_HAVE_AVX2)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("bmi2"))
    return {avx2::forward, avx2::backward};
#endif
  return {baseline::forward, baseline::backward};
}

const Kernels& kernels() {
  static const Kernels k = pick();
  return k;
}

// The tile mask compares query and key positions as floats (vector lanes): exact below 2^24.
constexpr int64_t kMaxSeqlen = int64_t(1) << 24;

detail::Error check_lengths(const detail::Problem& p) {
  if (p.seqlen_q >= kMaxSeqlen || p.seqlen_k >= kMaxSeqlen)
    return detail::unsupported("cpu: sequences of 2^24 or more tokens are not supported (got seqlen_q " +
                               std::to_string(p.seqlen_q) + ", seqlen_k " + std::to_string(p.seqlen_k) + ")");
  return detail::ok();
}

detail::Error forward(const detail::Problem& p, const fa_exec& e) {
  if (detail::Error err = check_lengths(p); !err.ok()) return err;
  return kernels().forward(p, e.num_threads);
}
detail::Error backward(const detail::Problem& p, const fa_exec& e) {
  if (detail::Error err = check_lengths(p); !err.ok()) return err;
  return kernels().backward(p, e.num_threads);
}
detail::TileShape tile_shape(const detail::Problem& p) {
  CpuTiles t = cpu_tiles(p.head_dim);
  return {t.block_q, t.block_k};
}
// Both directions walk the same tiles; the scratch is host memory, not a device workspace.
detail::Error plan(const detail::Problem& p, const fa_exec&, detail::Direction, detail::PlanInfo* out) {
  if (detail::Error err = check_lengths(p); !err.ok()) return err;
  const CpuTiles t = cpu_tiles(p.head_dim);
  *out = detail::PlanInfo{};
  out->kernels = "cpu";
  out->block_q = t.block_q;
  out->block_k = t.block_k;
  return detail::ok();
}

}  // namespace

void note_alloc(std::size_t bytes) {
  std::size_t now = g_current.fetch_add(bytes) + bytes;
  std::size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
void note_free(std::size_t bytes) { g_current.fetch_sub(bytes); }
std::size_t peak_scratch_bytes() { return g_peak.load(); }
void reset_peak_scratch_bytes() { g_peak.store(g_current.load()); }

}  // namespace flashattn::cpu

namespace flashattn::detail {

const Backend& cpu_backend() {
  static const Backend b{"cpu",    Requirements{0, 1, true, "cpu"}, cpu::forward, cpu::backward, cpu::tile_shape,
                         cpu::plan};
  return b;
}

}  // namespace flashattn::detail
