"""A model of the sm90 forward's dynamic (causal) schedule: how long the CTAs take to drain the tile list, against
the ideal (total work / CTAs), for the claim timing and the section order of the longest-first list.

The model: a tile of query block m (block_q rows) costs its causal key blocks, ceil((m + 1) * block_q / block_k),
plus `overhead` blocks (its prologue and epilogue). The list is longest first within sections of `section_heads`
(batch, head) pairs, as plan.cpp sizes them (the K/V of a section take about half of L2). CTA c starts with tile c.
Claim timings:
  greedy  a CTA takes the next tile of the list when it finishes one (no claim latency);
  start   it claims its next tile when it starts one (the claim warp as landed in 8ca1af9: the claim waits a tile);
  near    it claims `ahead` blocks before it finishes one (main since 00960fc).
Section orders: `last` (the smaller remainder section last, before 00960fc) and `first` (main since 00960fc).
No L2, no memory system, no claim latency: it isolates the list's and the claims' imbalance. Measured numbers to
read it against: bench/results/2026-12-06_h200_session44/README.md (H200, before 00960fc) and
bench/results/2026-12-07_h100_session45/README.md (H100, run 1: the change it modelled, +8-14 % at d256 causal).

--backward: the sm90 backward's causal grid instead (one CTA per key block, head and batch, handed out greedily in
launch order, key block fastest; a CTA costs the query blocks it walks + `overhead`, as bwd_cta_fit.py counts them),
in launch order and with the last pairs key block major (sm90/bwd_order.hpp as in
docs/journal/patches/bwd_causal_tail_key_block_major.patch) for tails of about one, two and four waves of CTAs.

    python3 schedule_model.py [--hdims 64,128,256] [--seqlens 1024,...] [--sms 132] [--l2-mib 50] [--overhead 1.5]
                              [--backward]
"""
import argparse
import heapq
import math

from bwd_cta_fit import cta_steps

# Causal forward tiles (src/cuda/sm90/tiles.hpp, the windowed entry): query rows, keys per block. d64 up to 1k takes
# the narrow entry instead (fwd_narrow_seqlen): 64 x 64 tiles, three CTAs per SM.
TILES = {64: (192, 128), 96: (128, 128), 128: (128, 128), 256: (128, 80)}
NARROW = (64, 64, 3)


def bwd_grid(seqlen, pairs, hdim, tail_pairs):
    """CTA costs (steps) in launch order: pair-major, key block fastest; the last tail_pairs pairs key block major."""
    steps = cta_steps(seqlen, hdim, causal=True)  # key block n starts at its diagonal
    head = [c for _ in range(pairs - tail_pairs) for c in steps]
    return head + [steps[n] for n in range(len(steps)) for _ in range(tail_pairs)]


def tile_list(seqlen, pairs, block_q, block_k, section_heads, small_first):
    """Tile costs in list order (without the overhead)."""
    nm = (seqlen + block_q - 1) // block_q
    full, small = divmod(pairs, section_heads)
    sizes = [section_heads] * full
    if small:
        sizes = [small] + sizes if small_first else sizes + [small]
    costs = []
    for size in sizes:
        for m in range(nm - 1, -1, -1):
            costs += [math.ceil(min((m + 1) * block_q, seqlen) / block_k)] * size
    return costs


def makespan(costs, ctas, policy, overhead, ahead):
    """The time the last CTA finishes, with tile costs in blocks."""
    nxt = 0
    claimed = [None] * ctas
    events = []  # (time, cta, kind): 'end' of a tile, or its 'claim'

    def take():
        nonlocal nxt
        if nxt >= len(costs):
            return None
        nxt += 1
        return costs[nxt - 1] + overhead

    def start(c, t, length):
        end = t + length
        if policy == "start":
            claimed[c] = take()
        elif policy == "near":
            heapq.heappush(events, (max(t, end - ahead), c, "claim"))
        heapq.heappush(events, (end, c, "end"))

    for c in range(ctas):
        length = take()
        if length is not None:
            start(c, 0.0, length)
    done = 0.0
    while events:
        t, c, kind = heapq.heappop(events)
        if kind == "claim":
            claimed[c] = take()
            continue
        done = max(done, t)
        length = take() if policy == "greedy" else claimed[c]
        claimed[c] = None
        if length is not None:
            start(c, t, length)
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen (the harness's 16k)")
    ap.add_argument("--model-dim", type=int, default=2048, help="heads x head dim")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--l2-mib", type=float, default=50.0)
    ap.add_argument("--overhead", type=float, default=1.5, help="a tile's cost beyond its key blocks, in blocks")
    ap.add_argument("--ahead", type=float, default=2.0, help="near: blocks before a tile's end that it claims")
    ap.add_argument("--backward", action="store_true", help="the backward's causal grid instead")
    a = ap.parse_args()
    if a.backward:
        print("hdim seqlen pairs | makespan / ideal: launch order, then key block major tails of ~1, ~2, ~4 waves")
        for hdim in (int(x) for x in a.hdims.split(",")):
            for seqlen in (int(x) for x in a.seqlens.split(",")):
                pairs = (a.model_dim // hdim) * (a.tokens // seqlen)
                nb = len(cta_steps(seqlen, hdim, causal=True))
                row = []
                for waves in (0, 1, 2, 4):
                    tail = min(pairs, (waves * a.sms + nb - 1) // nb) if waves and nb > 1 else 0
                    costs = bwd_grid(seqlen, pairs, hdim, tail if tail > 1 else 0)
                    ideal = sum(x + a.overhead for x in costs) / a.sms
                    row.append(makespan(costs, a.sms, "greedy", a.overhead, 0) / ideal)
                print(f"{hdim:4d} {seqlen:6d} {pairs:5d} | " + " ".join(f"{r:.3f}" for r in row))
        return
    print("hdim seqlen pairs section_heads | makespan / ideal: greedy-last start-last near-last near-first")
    for hdim in (int(x) for x in a.hdims.split(",")):
        for seqlen in (int(x) for x in a.seqlens.split(",")):
            narrow = hdim <= 64 and seqlen <= 1024
            block_q, block_k, per_sm = NARROW if narrow else (*TILES[hdim], 1)
            ctas = a.sms * per_sm
            pairs = (a.model_dim // hdim) * (a.tokens // seqlen)
            kv_bytes = seqlen * 2 * hdim * 2  # K and V, 16-bit
            section = int(min(max(a.l2_mib * 2**20 / 2 // kv_bytes, 1), pairs))
            row = []
            for policy, small_first in (("greedy", False), ("start", False), ("near", False), ("near", True)):
                costs = tile_list(seqlen, pairs, block_q, block_k, section, small_first)
                ideal = sum(x + a.overhead for x in costs) / ctas
                row.append(makespan(costs, ctas, policy, a.overhead, a.ahead) / ideal)
            print(f"{hdim:4d} {seqlen:6d} {pairs:5d} {section:13d} | " + " ".join(f"{r:.3f}" for r in row))


if __name__ == "__main__":
    main()
