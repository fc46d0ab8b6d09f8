// The sm90 forward's tile scheduler: which (query block, head, batch) tile a persistent CTA works on next.
#pragma once

#include <cute/config.hpp>

namespace flashattn::cuda::sm90 {

// Tiles are numbered 0..count-1. CTA c starts with tile c; without a window it then takes c + gridDim.x, ...
// (static: every tile costs the same), and the query blocks of one (head, batch) are consecutive so that CTAs
// running together share its K/V in L2. Under causal/window the longest query blocks (the last ones) go first
// and a CTA asks a global counter for its next tile when it finishes one (dynamic: tile lengths differ, and a
// static round-robin left whole waves waiting on one long tile: d128 causal 16k ran at 532 TFLOP/s persistent-
// static against 588 with one CTA per tile). To keep the K/V of CTAs running together in L2, the longest-first
// order is taken within sections of `section_heads` consecutive (batch, head) pairs whose K/V fit in about half
// of L2 (without sections, causal d128 at 2k reached 0.83x of cuDNN, every CTA of a wave on another head).
// Split-KV multiplies every tile into `splits` tiles of consecutive indices (the split fastest), each taking a
// share of its key blocks (FwdTile). The plan (plan.cpp) decides the schedule, the grid, the sections and the
// splits; `counter` (zero at the launch, and left at zero: after()) is null for the static schedule.
struct TileScheduler {
  struct Tile {
    int m_block, head, batch, split;
  };
  int num_m_blocks, heads, batch, splits;
  bool longest_first;
  int section_heads;
  int* counter;

  __device__ int count() const { return num_m_blocks * heads * batch * splits; }
  __device__ Tile tile(int idx) const {
    const int split = idx % splits;
    idx /= splits;
    int m, hb;
    if (longest_first) {
      const int hb_count = heads * batch;
      const int section = idx / (section_heads * num_m_blocks);
      const int first_hb = section * section_heads;
      const int section_hb = min(section_heads, hb_count - first_hb);
      const int r = idx - first_hb * num_m_blocks;
      m = num_m_blocks - 1 - r / section_hb;
      hb = first_hb + r % section_hb;
    } else {
      m = idx % num_m_blocks;
      hb = idx / num_m_blocks;
    }
    return {m, hb % heads, hb / heads, split};
  }
  // The tile after `current`, asked for by one full warp; `leader` is the lane that claims it from the counter.
  // A launch makes exactly count() claims over all its CTAs: each CTA one per tile it takes, the last of which finds
  // no tile. So the claim that draws count() - 1 is the launch's last, and it returns the counter to zero: the next
  // launch on the stream finds it zeroed without a memset per call (TileCounter, Workspace).
  __device__ int next(int current, bool leader) const {
    if (counter == nullptr) return current + int(gridDim.x);
    int claimed = 0;
    if (leader) {
      claimed = atomicAdd(counter, 1);
      if (claimed == count() - 1) atomicExch(counter, 0);
    }
    return __shfl_sync(0xffffffffu, claimed, 0) + int(gridDim.x);  // the first wave is blockIdx
  }
};

}  // namespace flashattn::cuda::sm90
