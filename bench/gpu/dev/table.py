"""Markdown table (ours / torch flash2 / cuDNN TFLOP/s and ours/flash2) from bench_fwd.py output."""
import sys

rows = {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if len(f) != 8 or f[0] == "backend" or line.startswith("#"):
        continue
    rows.setdefault((int(f[1]), int(f[2]), int(f[3])), {})[f[0]] = float(f[7])
print("| hdim | causal | seqlen | ours | torch flash2 | cuDNN | ours / flash2 |")
print("|---|---|---|---|---|---|---|")
for (d, c, s), r in sorted(rows.items()):
    ratio = r["ours"] / r["flash2"] if "flash2" in r and "ours" in r else float("nan")
    print(f"| {d} | {c} | {s} | {r.get('ours', float('nan')):.1f} | {r.get('flash2', float('nan')):.1f} | "
          f"{r.get('cudnn', float('nan')):.1f} | {ratio:.2f} |")
