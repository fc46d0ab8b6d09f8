// Tile shapes of the CPU backend: the one source used by the kernels and by the IO accounting.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn::cpu {

struct CpuTiles {
  int block_q;
  int block_k;
};

// 64 x 64 fp32 tiles keep Q, K, V, O and S of one block (<= 4 x 64 KB at head_dim 256) inside a core's L2. bf16 with
// bf16 dot products (the amx and avx512bf16 builds) takes 128 keys in both directions: the AMX products whose
// reduction runs over the keys (the forward's O^T += V^T P^T, the backward's dQ += dS K) then run 4 k-steps per round
// trip of their fp32 C tiles instead of 2 (2 threads on an AMX Xeon, 2k tokens: forward d64 +3%, d128 0 to -3%, d256
// +8-15%; backward +8-22%: bench/results/2026-12-02_cpu_xeon_amx_session16.md).
constexpr CpuTiles cpu_tiles(int64_t /*head_dim*/, bool bf16_dot = false) { return {64, bf16_dot ? 128 : 64}; }

// Scratch accounting: every allocation the CPU backend makes goes through these, so tests can check that
// extra memory stays linear in the sequence length.
void note_alloc(std::size_t bytes);
void note_free(std::size_t bytes);
std::size_t peak_scratch_bytes();
void reset_peak_scratch_bytes();

}  // namespace flashattn::cpu
