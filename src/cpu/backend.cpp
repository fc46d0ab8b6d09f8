// The CPU backend: picks the kernels build for this processor's vector width and reports tile shapes.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#if defined(FA_CPU_HAVE_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/backend.hpp"
#include "cpu/numeric.hpp"
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
#ifdef FA_CPU_HAVE_AMX
FA_DECLARE_ISA(amx)
#endif
#undef FA_DECLARE_ISA

namespace {

std::atomic<std::size_t> g_current{0}, g_peak{0};

struct Kernels {
  detail::Error (*forward)(const detail::Problem&, int);
  detail::Error (*backward)(const detail::Problem&, int);
  bool bf16_dot = false;  // bf16 problems take bf16 dot products (and the wider key tiles: tiles.hpp)
};

#if defined(FA_CPU_HAVE_AMX)
// Linux hands out the AMX tile state (8 KiB of it per thread) only on request; without the grant the first tile
// instruction faults. Asked once per process, as oneDNN does.
bool amx_granted() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

// The widest build this processor runs (want empty), or the one `want` names if the processor runs it (else baseline).
Kernels pick(const std::string& want) {
  auto wanted = [&](const char* name) { return want.empty() || want == name; };
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#if defined(FA_CPU_HAVE_AMX)
  if (wanted("amx") && avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("amx-tile") &&
      __builtin_cpu_supports("amx-bf16") && amx_granted())
    return {amx::forward, amx::backward, true};
#endif
#if defined(FA_CPU_HAVE_AVX512BF16)
  if (wanted("avx512bf16") && avx512 && __builtin_cpu_supports("avx512bf16"))
    return {avx512bf16::forward, avx512bf16::backward, true};
#endif
#if defined(FA_CPU_HAVE_AVX512)
  if (wanted("avx512") && avx512) return {avx512::forward, avx512::backward};
#endif
#if defined(FA_CPU_HAVE_AVX2)
  if (wanted("avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2"))
    return {avx2::forward, avx2::backward};
#endif
  return {baseline::forward, baseline::backward};
}

// FLASHATTN_CPU_ISA (amx, avx512bf16, avx512, avx2, baseline) picks a narrower build than the widest this processor
// runs, for A/B measurements and for the tests of the narrower builds on wide machines; a build the processor cannot
// run is ignored.
const Kernels& kernels() {
  static const Kernels k = [] {
    const char* env = std::getenv("FLASHATTN_CPU_ISA");
    const std::string want = env != nullptr ? env : "";
    if (want.empty() || want == "baseline") return pick(want);
    const Kernels named = pick(want);
    return named.forward != baseline::forward ? named : pick("");
  }();
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

// FP8 (flashattn.h): q, k and v dequantised into contiguous float32 copies (each e4m3 value times its factor,
// one rounding), the float32 kernels on those, and out rounded to bfloat16. Paged K/V is gathered through the
// block table, so that a page two sequences share gets each sequence's factor. The probabilities stay fp32: the
// CPU computes what the GPU kernel approximates.
detail::Error forward_fp8(const detail::Problem& p, int threads) {
  detail::Problem f = p;
  f.dtype = f.out_dtype = FA_FLOAT32;
  f.q_descale = f.k_descale = f.v_descale = detail::Descale{};
  f.block_table = nullptr;
  f.page_size = f.num_pages = f.max_pages = f.block_table_stride = 0;
  const int64_t rows_k = p.varlen ? p.total_k : p.batch * p.seqlen_k;
  f.total_k = rows_k;
  // Contiguous (rows, heads, dim) copies; batched rows of batch entry b start at b * seqlen.
  auto layout = [&](int64_t heads, int64_t dim, int64_t seqlen, bool by_key) {
    detail::RowLayout l;
    l.row = heads * dim;
    l.head = dim;
    l.batch = p.varlen ? 0 : seqlen * heads * dim;
    l.by_key = by_key;
    return l;
  };
  f.q_layout = layout(p.heads_q, p.head_dim, p.seqlen_q, false);
  f.k_layout = layout(p.heads_kv, p.head_dim, p.seqlen_k, true);
  f.v_layout = layout(p.heads_kv, p.head_dim_v, p.seqlen_k, true);
  f.out_layout = layout(p.heads_q, p.head_dim_v, p.seqlen_q, false);
  std::vector<float> q(size_t(p.total_q * p.heads_q * p.head_dim)), k(size_t(rows_k * p.heads_kv * p.head_dim)),
      v(size_t(rows_k * p.heads_kv * p.head_dim_v)), out(size_t(p.total_q * p.heads_q * p.head_dim_v));
  auto dequantise = [&](const void* src, const detail::RowLayout& from, const detail::RowLayout& to,
                        const detail::Descale& d, float* dst, int64_t heads, int64_t dim, bool keys) {
    const uint8_t* x = static_cast<const uint8_t*>(src);
    for (int64_t b = 0; b < p.batch; ++b) {
      // Keys past a sequence's length (or seqused_k) are never read by the kernels: not copied.
      const int64_t rows = keys ? p.len_k(b) : p.len_q(b);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < heads; ++h) {
          const float factor = d.at(b, h);
          const uint8_t* in = x + p.offset(from, b, r, h);
          float* o = dst + f.offset(to, b, r, h);
          for (int64_t c = 0; c < dim; ++c) o[c] = e4m3_to_float(in[c]) * factor;
        }
    }
  };
  dequantise(p.q, p.q_layout, f.q_layout, p.q_descale, q.data(), p.heads_q, p.head_dim, false);
  dequantise(p.k, p.k_layout, f.k_layout, p.k_descale, k.data(), p.heads_kv, p.head_dim, true);
  dequantise(p.v, p.v_layout, f.v_layout, p.v_descale, v.data(), p.heads_kv, p.head_dim_v, true);
  f.q = q.data();
  f.k = k.data();
  f.v = v.data();
  f.out = out.data();
  if (detail::Error e = kernels().forward(f, threads); !e.ok()) return e;
  uint16_t* o = static_cast<uint16_t*>(p.out);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t r = 0; r < p.len_q(b); ++r)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const float* in = out.data() + f.offset(f.out_layout, b, r, h);
        uint16_t* dst = o + p.offset(p.out_layout, b, r, h);
        for (int64_t c = 0; c < p.head_dim_v; ++c) dst[c] = float_to_bf16(in[c]);
      }
  return detail::ok();
}

detail::Error forward(const detail::Problem& p, const fa_exec& e) {
  if (detail::Error err = check_lengths(p); !err.ok()) return err;
  if (p.fp8()) return forward_fp8(p, e.num_threads);
  return kernels().forward(p, e.num_threads);
}
detail::Error backward(const detail::Problem& p, const fa_exec& e) {
  if (detail::Error err = check_lengths(p); !err.ok()) return err;
  return kernels().backward(p, e.num_threads);
}
detail::TileShape tile_shape(const detail::Problem& p) {
  const CpuTiles t = cpu_tiles(p, p.dtype == FA_BFLOAT16 && kernels().bf16_dot);
  return {t.block_q, t.block_k};
}
// Both directions walk the same tiles (tiles.hpp); the scratch is host memory, not a device workspace.
detail::Error plan(const detail::Problem& p, const fa_exec&, detail::Direction, detail::PlanInfo* out) {
  if (detail::Error err = check_lengths(p); !err.ok()) return err;
  const CpuTiles t = cpu_tiles(p, p.dtype == FA_BFLOAT16 && kernels().bf16_dot);
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

namespace {

// The kept blocks, oldest first. Never destroyed: threads may still return blocks during static destruction.
struct ScratchCache {
  std::mutex mutex;
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::size_t bytes = 0;
};
ScratchCache& scratch_cache() {
  static ScratchCache* cache = new ScratchCache;
  return *cache;
}

}  // namespace

std::size_t scratch_cache_limit() {
  static const std::size_t limit = [] {
    const char* env = std::getenv("FLASHATTN_CPU_SCRATCH_CACHE_MB");
    char* end = nullptr;
    long long mb = env != nullptr && *env != '\0' ? std::strtoll(env, &end, 10) : 128;
    if (end != nullptr && (*end != '\0' || mb < 0)) mb = 128;  // not a count of MiB: the default
    return std::size_t(std::min(mb, 1LL << 30)) << 20;
  }();
  return limit;
}

std::size_t scratch_cached_bytes() {
  ScratchCache& c = scratch_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.bytes;
}

void* scratch_take(std::size_t* bytes) {
  if (*bytes >= kScratchCacheMin) {
    ScratchCache& c = scratch_cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    // The smallest kept block that holds the request and wastes at most a quarter of itself.
    auto best = c.blocks.end();
    for (auto it = c.blocks.begin(); it != c.blocks.end(); ++it)
      if (it->second >= *bytes && it->second - it->second / 4 <= *bytes &&
          (best == c.blocks.end() || it->second < best->second))
        best = it;
    if (best != c.blocks.end()) {
      void* block = best->first;
      *bytes = best->second;
      c.bytes -= best->second;
      c.blocks.erase(best);
      return block;
    }
  }
  return std::aligned_alloc(64, *bytes);
}

void scratch_give(void* block, std::size_t bytes) {
  const std::size_t limit = scratch_cache_limit();
  if (bytes < kScratchCacheMin || bytes > limit) {
    std::free(block);
    return;
  }
  ScratchCache& c = scratch_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::size_t drop = 0;  // oldest blocks out until this one fits
  while (c.bytes + bytes > limit) {
    c.bytes -= c.blocks[drop].second;
    std::free(c.blocks[drop++].first);
  }
  c.blocks.erase(c.blocks.begin(), c.blocks.begin() + std::ptrdiff_t(drop));
  try {
    c.blocks.emplace_back(block, bytes);
    c.bytes += bytes;
  } catch (const std::bad_alloc&) {  // no room to list it: not kept
    std::free(block);
  }
}

}  // namespace flashattn::cpu

namespace flashattn::detail {

const Backend& cpu_backend() {
  static const Backend b{"cpu",    Requirements{0, 1, true, "cpu"}, cpu::forward, cpu::backward, cpu::tile_shape,
                         cpu::plan};
  return b;
}

}  // namespace flashattn::detail
