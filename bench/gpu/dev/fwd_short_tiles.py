"""The sm90 forward's short tile entry (sm90/tiles.hpp fwd_short_seqlen) against the entry it replaces, at the
harness's forward shapes (bf16, batch * seqlen = 16k tokens, heads = 2048 / d), cuDNN (SDPA) in the same process.
Needs an ablation build (FLASHATTN_SM90_ABLATIONS=ON), whose plan reads FLASHATTN_SM90_SHORT_SEQLEN at every call:
0 never takes the short entry (the wide / windowed one), a large value always. Triton's do_bench median, as
bench/gpu/bench.py; FLOPs 4 B H S^2 D, halved when causal.

    PYTHONPATH=<package root> python3 bench/gpu/dev/fwd_short_tiles.py [--hdims 128] [--seqlens 512,...] [--csv F]
"""
import argparse

from fwd_env_ab import measure, write_csv

ENV = "FLASHATTN_SM90_SHORT_SEQLEN"
ENTRIES = (("other", "0"), ("short", str(1 << 40)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", default="128")  # d64 has no short entry (its short calls: the narrow tiles)
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192")
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    rows = []
    print("hdim\tcausal\tseqlen\tcudnn\tother\tshort\tshort/other\tshort/cudnn\tmaxdiff")
    for d in (int(x) for x in a.hdims.split(",")):
        for causal in (False, True):
            for s in (int(x) for x in a.seqlens.split(",")):
                cudnn_tf, runs, diff = measure(d, causal, s, ENV, [limit for _, limit in ENTRIES], both_orders=False)
                tf = {"cudnn": cudnn_tf, **{name: runs[limit][0] for name, limit in ENTRIES}}
                row = dict(hdim=d, causal=int(causal), seqlen=s, batch=16384 // s, heads=2048 // d,
                           cudnn=f"{tf['cudnn']:.1f}", other=f"{tf['other']:.1f}", short=f"{tf['short']:.1f}",
                           maxdiff=diff)
                rows.append(row)
                print(f"{d}\t{int(causal)}\t{s}\t{tf['cudnn']:.1f}\t{tf['other']:.1f}\t{tf['short']:.1f}\t"
                      f"{tf['short'] / tf['other']:.3f}\t{tf['short'] / tf['cudnn']:.3f}\t{diff}", flush=True)
    write_csv(a.csv, rows)


if __name__ == "__main__":
    main()
