// The sm90 forward's tile scheduler: which (query block, head, batch) tile a persistent CTA works on next.
#pragma once

#include <algorithm>

#include <cute/config.hpp>
#include <cutlass/fast_math.h>

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
// tile() divides by run-time counts (splits, query blocks, heads, section sizes) with divisors built on the host
// (cutlass::FastDivmod: a multiply-high and a shift each). Divided in the kernel, each was an I2F / MUFU.RCP / F2I
// chain of about 20 dependent instructions, and the producer warp, issuing between eight consumer warps, took about
// 0.5 key blocks' time to build the next tile before it could issue its Q load (fwd_trace.patch's tile_build,
// bench/results/2026-12-06_h100_session40/README.md, run 2); the consumers build every tile too.
struct TileScheduler {
  struct Tile {
    int m_block, head, batch, split;
  };
  int num_m_blocks;
  int pairs;  // (batch, head) pairs: heads * batch
  bool longest_first;
  int section_heads;
  int* counter;
  int tiles;  // num_m_blocks * heads * batch * splits
  // Dividing by splits, num_m_blocks, heads, a full section's tiles (section_heads * num_m_blocks), a full section's
  // (batch, head) pairs and the last section's; the GQA group (query heads per KV head; 1 for packed tiles).
  cutlass::FastDivmod div_splits, div_m_blocks, div_heads, div_section, div_section_hb, div_last_hb, div_group;

  // On the host (FastDivmod's constructor divides). Counts of zero are taken as one for the divisors: such a launch
  // has no tiles, and tile() is never called.
  static TileScheduler make(int num_m_blocks, int heads, int batch, int splits, bool longest_first, int section_heads,
                            int group, int* counter) {
    const auto div = [](int n) { return cutlass::FastDivmod(std::max(n, 1)); };
    const int pairs = heads * batch, last_hb = section_heads > 0 ? pairs % section_heads : 0;
    return {num_m_blocks,
            pairs,
            longest_first,
            section_heads,
            counter,
            num_m_blocks * pairs * splits,
            div(splits),
            div(num_m_blocks),
            div(heads),
            div(section_heads * num_m_blocks),
            div(section_heads),
            div(last_hb > 0 ? last_hb : section_heads),
            div(group)};
  }

  CUTE_HOST_DEVICE int count() const { return tiles; }
  // On the host too: tests/gpu/tile_scheduler_test.cu checks it against plain division.
  CUTE_HOST_DEVICE Tile tile(int idx) const {
    int split, m, hb;
    div_splits(idx, split, idx);
    if (longest_first) {
      const int section = div_section.div(idx);
      const int first_hb = section * section_heads;
      const int r = idx - first_hb * num_m_blocks;
      // The last section holds min(section_heads, pairs - first_hb) pairs: fewer when pairs is no multiple.
      const cutlass::FastDivmod& per = first_hb + section_heads <= pairs ? div_section_hb : div_last_hb;
      int q, rem;
      per(q, rem, r);
      m = num_m_blocks - 1 - q;
      hb = first_hb + rem;
    } else {
      div_m_blocks(hb, m, idx);
    }
    int head, b;
    div_heads(b, head, hb);
    return {m, head, b, split};
  }
  // The KV head of query head `head` (a tile's head when packed: the launch builds div_group of 1 then).
  CUTE_HOST_DEVICE int kv_head(int head) const { return div_group.div(head); }
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
