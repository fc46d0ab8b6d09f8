// Tile shapes of the CPU backend: the one source used by the kernels and by the IO accounting.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.hpp"

namespace flashattn::cpu {

struct CpuTiles {
  int block_q;
  int block_k;
};

// 64 x 64 fp32 tiles keep Q, K, V, O and S of one block (<= 4 x 64 KB at head_dim 256) inside a core's L2. bf16 with
// bf16 dot products (the amx and avx512bf16 builds) takes wider key tiles in both directions: the AMX products whose
// reduction runs over the keys (the forward's O^T += V^T P^T, the backward's dQ += dS K) then run more k-steps per
// round trip of their fp32 C tiles. 128 keys against 64 (2 threads on an AMX Xeon, 2k tokens): forward d64 +3%, d128
// 0 to -3%, d256 +8-15%; backward +8-22%. 256 keys against 128 (d128, 1k/4k): without a mask forward +6%, backward
// +15%; under a causal mask the wider tiles carry more masked keys (1k: forward -5%, backward -8%), so masked
// problems keep 128 (bench/results/2026-12-02_cpu_xeon_amx_session16.md) unless their rows see many keys: a causal
// mask without a left window over kWideMaskedKeys keys or more (rows see half of them on average, and a 256-key tile
// carries at most 192 masked keys past a 64-row block's diagonal). There 256 keys: backward +3 % at 8k, +9 % at 16k,
// forward even (d128, 2 threads, AVX512-BF16; bench/results/2026-12-06_cpu_zen5_session40.md; not yet on AMX).
// bf16_dot: bf16 inputs on a build with bf16 dot products.
constexpr int64_t kWideMaskedKeys = 8192;
inline CpuTiles cpu_tiles(const detail::Problem& p, bool bf16_dot) {
  const bool long_causal = p.window_left < 0 && p.seqlen_k >= kWideMaskedKeys;
  return {64, !bf16_dot ? 64 : p.has_window() && !long_causal ? 128 : 256};
}

// Scratch accounting: every allocation the CPU backend makes goes through these, so tests can check that
// extra memory stays linear in the sequence length.
void note_alloc(std::size_t bytes);
void note_free(std::size_t bytes);
std::size_t peak_scratch_bytes();
void reset_peak_scratch_bytes();

// Scratch blocks of 64-byte alignment. Blocks of kScratchCacheMin bytes or more are kept after use, up to a total of
// scratch_cache_limit() bytes (FLASHATTN_CPU_SCRATCH_CACHE_MB, default 128; 0 keeps none), and handed to a later call
// asking for as much or up to a quarter less: fresh memory is faulted in page by page by its first writes, and a
// call's accumulators (the backward's dQ/dK/dV: 24-32 MB at 1k tokens, d128, 16 heads) were fresh every call.
// scratch_take returns the block and, in *bytes, its size (at least the request), or nullptr; scratch_give returns it.
constexpr std::size_t kScratchCacheMin = std::size_t(1) << 20;
void* scratch_take(std::size_t* bytes);
void scratch_give(void* block, std::size_t bytes);
std::size_t scratch_cache_limit();
std::size_t scratch_cached_bytes();

}  // namespace flashattn::cpu
