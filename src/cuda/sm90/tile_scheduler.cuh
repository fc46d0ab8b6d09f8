// The sm90 forward's tile scheduler: which (query block, head, batch) tile a persistent CTA works on next.
#pragma once

#include <algorithm>

#include <cute/config.hpp>
#include <cutlass/fast_math.h>

namespace flashattn::cuda::sm90 {

// Tiles are numbered 0..count-1. CTA c starts with tile c; without a window it then takes c + gridDim.x, ...
// (static: every tile costs the same), and the query blocks of one (head, batch) are consecutive so that CTAs
// running together share its K/V in L2. Under causal/window the longest query blocks (the last ones) go first
// and a CTA claims its next tile from a global counter near the end of one's loads (dynamic, TileClaims: tile
// lengths differ, and a static round-robin left whole waves waiting on one long tile: d128 causal 16k ran at 532
// TFLOP/s persistent-static against 588 with one CTA per tile). To keep the K/V of CTAs running together in L2,
// the longest-first order is taken within sections of `section_heads` consecutive (batch, head) pairs whose K/V
// fit in about half of L2 (without sections, causal d128 at 2k reached 0.83x of cuDNN, every CTA of a wave on
// another head). When the pairs do not divide into whole sections, the smaller section comes first: last, its
// longest tiles started when every CTA reached it and ran on after the rest had finished (bench/gpu/dev/
// schedule_model.py, tile cost = key blocks + 1.5: 14-16 % above the ideal makespan at d256 causal 1k-8k, 4-8 % at
// d128 causal 1k-16k; first, 0.1-4.5 %; bench/results/2026-12-06_h200_session44/README.md, run 4). With the claim
// made near a tile's end (TileClaims) it measured +8-14 % at d256 causal 1k-16k, +4-5 % at d128 and +2-5 % at d64
// (H100, bench/results/2026-12-07_h100_session45/README.md, run 1). Split-KV multiplies every tile into `splits`
// tiles of consecutive indices (the split fastest), each taking a share of its key blocks (FwdTile). The plan
// (plan.cpp) decides the schedule, the grid, the sections and the splits; `counter` (zero at the launch, and left at
// zero: next()) is null for the static schedule. tile() divides by run-time counts (splits, query blocks, heads,
// section sizes) with divisors built on the host (cutlass::FastDivmod: a multiply-high and a shift each). Divided in
// the kernel, each was an I2F / MUFU.RCP / F2I chain of about 20 dependent instructions, and the producer warp, issuing
// between eight consumer warps, took about 0.5 key blocks' time to build the next tile before it could issue its Q load
// (fwd_trace.patch's tile_build, bench/results/2026-12-06_h100_session40/README.md, run 2); the consumers build every
// tile too.
struct TileScheduler {
  struct Tile {
    int m_block, head, batch, split;
  };
  int num_m_blocks;
  int pairs;  // (batch, head) pairs: heads * batch
  bool longest_first;
  int section_heads;
  int* counter;
  int tiles;        // num_m_blocks * heads * batch * splits
  int small_hb;     // (batch, head) pairs of the smaller first section: pairs % section_heads (0: none)
  int small_tiles;  // its tiles: small_hb * num_m_blocks
  // Dividing by splits, num_m_blocks, heads, a full section's tiles (section_heads * num_m_blocks), a full section's
  // (batch, head) pairs and the smaller first section's; the GQA group (query heads per KV head; 1 for packed tiles).
  cutlass::FastDivmod div_splits, div_m_blocks, div_heads, div_section, div_section_hb, div_small_hb, div_group;

  // On the host (FastDivmod's constructor divides). Counts of zero are taken as one for the divisors: such a launch
  // has no tiles, and tile() is never called.
  static TileScheduler make(int num_m_blocks, int heads, int batch, int splits, bool longest_first, int section_heads,
                            int group, int* counter) {
    const auto div = [](int n) { return cutlass::FastDivmod(std::max(n, 1)); };
    const int pairs = heads * batch, small = section_heads > 0 ? pairs % section_heads : 0;
    return {num_m_blocks,
            pairs,
            longest_first,
            section_heads,
            counter,
            num_m_blocks * pairs * splits,
            small,
            small * num_m_blocks,
            div(splits),
            div(num_m_blocks),
            div(heads),
            div(section_heads * num_m_blocks),
            div(section_heads),
            div(small),
            div(group)};
  }

  CUTE_HOST_DEVICE int count() const { return tiles; }
  // On the host too: tests/gpu/tile_scheduler_test.cu checks it against plain division.
  CUTE_HOST_DEVICE Tile tile(int idx) const {
    int split, m, hb;
    div_splits(idx, split, idx);
    if (longest_first) {
      // The smaller section (small_hb pairs, when pairs is no multiple of section_heads) first, then whole ones.
      const bool small = idx < small_tiles;
      const int j = idx - small_tiles;
      const int section = small ? 0 : div_section.div(j);
      const int first_hb = small ? 0 : small_hb + section * section_heads;
      const int r = small ? idx : j - section * section_heads * num_m_blocks;
      int q, rem;
      (small ? div_small_hb : div_section_hb)(q, rem, r);
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

// The dynamic schedule's claims made ahead by a warp of their own (Mechanisms::kClaimWarp): warp 1 of the producer
// warpgroup, idle otherwise, claims the tile after the one warp 0 is loading when warp 0 asks for it, two key blocks
// before that tile's last loads (Load::request_claim), so that the atomic's round trip to L2 (about 1 us) runs under
// those loads instead of between two tiles' loads (FlashAttention-3 claims before a tile's last V load). Warp 0
// itself cannot hold a claim across loads: at its 24 registers ptxas spills the value at once, or, for atomicAdd
// under a lane test, shuffles the warp-aggregated result at once, both waiting for the round trip there. A one-slot
// hand-off through shared memory: claim_empty completes once per request, claim_full once per claim. A CTA still
// makes one claim per tile it takes, the last finding none, so TileScheduler::next's count and reset hold.
struct TileClaims {
  // Warp 1 (the whole warp): claims until one finds no tile, each when warp 0 asks (it has taken the one before and
  // nears the end of that tile's loads). CUTLASS's mbarrier asm carries no memory clobber: compiler barriers keep the
  // slot's accesses on their side of each wait and arrive (as publish_tile / next_published_tile do for the tile
  // index).
  template <class SharedStorage>
  __device__ static void run(const TileScheduler& sched, SharedStorage& ss) {
    // A CTA past the tiles would claim without a take to answer it; the plan's grid never has one (grid <= tiles).
    if (int(blockIdx.x) >= sched.count()) return;
    const bool leader = threadIdx.x % 32 == 0;  // next() hands lane 0's claim to the warp
    for (int k = 0;; ++k) {
      ss.claim_empty.wait(k & 1);              // request k: warp 0 has read claim k - 1's slot
      const int next = sched.next(0, leader);  // `current` is unused by the dynamic schedule
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
  // the slot, and the same lane makes the next request (Load::request_claim), so that each access pairs with warp
  // 1's through one mbarrier (compute-sanitizer's racecheck reported other lanes' reads, ordered before the
  // leader's arrive by __syncwarp only).
  template <class SharedStorage>
  __device__ static int take(SharedStorage& ss, int k, bool leader) {
    ss.claim_full.wait(k & 1);
    asm volatile("" ::: "memory");
    int next = 0;
    if (leader) {
      next = *reinterpret_cast<const volatile int*>(&ss.claimed);
      asm volatile("" ::: "memory");
    }
    return __shfl_sync(0xffffffffu, next, 0);
  }
};

}  // namespace flashattn::cuda::sm90
