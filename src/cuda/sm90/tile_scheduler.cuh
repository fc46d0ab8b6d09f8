// The sm90 forward's tile scheduler: which (query block, head, batch) tile a persistent CTA works on next.
#pragma once

#include <cute/config.hpp>

namespace flashattn::cuda::sm90 {

// Tiles are numbered 0..count-1. CTA c starts with tile c; without a window it then takes c + gridDim.x, ...
// (static: every tile costs the same), and the query blocks of one (head, batch) are consecutive so that CTAs
// running together share its K/V in L2. Under causal/window the longest query blocks (the last ones) go first
// and a CTA claims its next tile from a global counter as it starts loading one (dynamic, TileClaims: tile
// lengths differ, and a static round-robin left whole waves waiting on one long tile: d128 causal 16k ran at 532
// TFLOP/s persistent-static against 588 with one CTA per tile). To keep the K/V of CTAs running together in L2,
// the longest-first order is taken within sections of `section_heads` consecutive (batch, head) pairs whose K/V
// fit in about half of L2 (without sections, causal d128 at 2k reached 0.83x of cuDNN, every CTA of a wave on
// another head). Split-KV multiplies every tile into `splits` tiles of consecutive indices (the split fastest),
// each taking a share of its key blocks (FwdTile). The plan (plan.cpp) decides the schedule, the grid, the sections
// and the splits; `counter` (zero at the launch, and left at zero: next()) is null for the static schedule.
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

// The dynamic schedule's claims made one tile ahead by a warp of their own (Mechanisms::kClaimWarp): warp 1 of the
// producer warpgroup, idle otherwise, claims the tile after the one warp 0 is loading as soon as warp 0 starts it, so
// that the atomic's round trip to L2 (about 1 us) runs under that tile's loads instead of between two tiles' loads
// (FlashAttention-3 claims before a tile's last V load). Warp 0 itself cannot hold a claim across a tile's loads: at
// its 24 registers ptxas spills the value at once, or, for atomicAdd under a lane test, shuffles the warp-aggregated
// result at once, both waiting for the round trip there. A one-slot hand-off through shared memory: claim_full
// completes once per claim, claim_empty once per claim taken. A CTA still makes one claim per tile it takes, the
// last finding none, so TileScheduler::next's count and reset hold.
struct TileClaims {
  // Warp 1 (the whole warp): claims until one finds no tile, each after warp 0 took the one before. CUTLASS's mbarrier
  // asm carries no memory clobber: compiler barriers keep the slot's accesses on their side of each wait and arrive
  // (as publish_tile / next_published_tile do for the tile index).
  template <class SharedStorage>
  __device__ static void run(const TileScheduler& sched, SharedStorage& ss) {
    // A CTA past the tiles would claim without a take to answer it; the plan's grid never has one (grid <= tiles).
    if (int(blockIdx.x) >= sched.count()) return;
    const bool leader = threadIdx.x % 32 == 0;  // next() hands lane 0's claim to the warp
    for (int k = 0;; ++k) {
      if (k > 0) ss.claim_empty.wait((k - 1) & 1);  // warp 0 has taken claim k - 1 and loads that tile now
      const int next = sched.next(0, leader);       // `current` is unused by the dynamic schedule
      if (leader) {
        asm volatile("" ::: "memory");
        *reinterpret_cast<volatile int*>(&ss.claimed) = next;
        asm volatile("" ::: "memory");
        ss.claim_full.arrive();  // release: the store above is seen after warp 0's wait
      }
      if (next >= sched.count()) return;
    }
  }
  // Warp 0 (the whole warp): the k-th claim (k from 0), once its tile's predecessor is loaded. The whole warp waits
  // (a wait under `leader` alone made ptxas spill 100-400 bytes in the 24-register producer); only `leader` reads
  // the slot and arrives, so that each access pairs with warp 1's through one mbarrier (compute-sanitizer's racecheck
  // reported the other lanes' reads, ordered before the leader's arrive by __syncwarp only).
  template <class SharedStorage>
  __device__ static int take(SharedStorage& ss, int k, bool leader) {
    ss.claim_full.wait(k & 1);
    asm volatile("" ::: "memory");
    int next = 0;
    if (leader) {
      next = *reinterpret_cast<const volatile int*>(&ss.claimed);
      asm volatile("" ::: "memory");
      ss.claim_empty.arrive();
    }
    return __shfl_sync(0xffffffffu, next, 0);
  }
};

}  // namespace flashattn::cuda::sm90
