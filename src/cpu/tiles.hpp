// Tile shapes of the CPU backend: the one source used by the kernels and by the IO accounting.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn::cpu {

struct CpuTiles {
  int block_q;
  int block_k;
};

// 64 x 64 fp32 tiles keep Q, K, V, O and S of one block (<= 4 x 64 KB at head_dim 256) inside a core's L2.
constexpr CpuTiles cpu_tiles(int64_t /*head_dim*/) { return {64, 64}; }

// Scratch accounting: every allocation the CPU backend makes goes through these, so tests can check that
// extra memory stays linear in the sequence length.
void note_alloc(std::size_t bytes);
void note_free(std::size_t bytes);
std::size_t peak_scratch_bytes();
void reset_peak_scratch_bytes();

}  // namespace flashattn::cpu
