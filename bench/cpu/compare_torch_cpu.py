"""Our CPU backend vs torch's CPU SDPA (its flash CPU kernel) on the same host, same shapes, same threads.

    python3 bench/cpu/compare_torch_cpu.py --cli build/flashattn --threads 2,16 --out results.md

Shapes follow ../shared/anchors/cpu_torch_xeon16_*.tsv: B=1, H=16, D=128, S in {1024, 4096}, causal or not,
fp32 and bf16. FLOPs: fwd 4*B*H*S*S*D (/2 causal); fwd+bwd = 3.5x the forward FLOPs over fwd+bwd time.
"""
import argparse
import csv
import os
import platform
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F


def torch_times(dtype, threads, S, causal, H=16, D=128, reps=3):
    torch.set_num_threads(threads)
    q = torch.randn(1, H, S, D, dtype=dtype, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn_like(q, requires_grad=True)
    g = torch.randn_like(q)
    fwd, fb = [], []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        t1 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o.backward(g)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        fb.append(t2 - t1)
    return sorted(fwd[1:])[len(fwd[1:]) // 2] * 1e3, sorted(fb[1:])[len(fb[1:]) // 2] * 1e3


def ours_times(cli, dtype, threads, S, causal, H=16, D=128, reps=3):
    with tempfile.NamedTemporaryFile(suffix=".csv") as tmp:
        subprocess.run([cli, "bench", "--seqlens", str(S), "--hdims", str(D), "--dtypes", dtype, "--masks",
                        "causal" if causal else "none", "--heads", str(H), "--threads", str(threads), "--bwd",
                        "--iters", str(reps), "--backend", "cpu", "--csv", tmp.name], capture_output=True, check=True)
        with open(tmp.name) as f:
            r = next(csv.DictReader(f))
    return float(r["fwd_ms"]), float(r["fwd_ms"]) + float(r["bwd_ms"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default="build/flashattn")
    ap.add_argument("--threads", default="2,16")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--causal", default="0,1", help="0: no mask, 1: causal")
    ap.add_argument("--reps", type=int, default=3, help="timed repeats per row (the median is reported)")
    ap.add_argument("--out", default="cpu_vs_torch.md")
    a = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [f"# CPU backend vs torch {torch.__version__} CPU SDPA, same host\n",
             f"Host: {cpu}, {os.cpu_count()} logical CPUs. B=1, H=16, D=128. GFLOP/s (fwd 4*B*H*S*S*D, /2 causal; "
             f"fwd+bwd 3.5x fwd FLOPs over fwd+bwd time), median of {a.reps}.\n",
             "| dtype | threads | seqlen | causal | ours fwd | torch fwd | ours fwd+bwd | torch fwd+bwd | fwd ratio "
             "| fwd+bwd ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    # The table is rewritten after every row: a run cut short (minutes a row at 16k on 2 threads) keeps its rows.
    def write():
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for dt_name in a.dtypes.split(","):
        dt = dtypes[dt_name]
        for th in [int(x) for x in a.threads.split(",")]:
            for S in [int(x) for x in a.seqlens.split(",")]:
                for causal in (bool(int(x)) for x in a.causal.split(",")):
                    flops = 4 * 16 * S * S * 128 / (2 if causal else 1)
                    tf, tfb = torch_times(dt, th, S, causal, reps=a.reps)
                    of, ofb = ours_times(a.cli, dt_name, th, S, causal, reps=a.reps)
                    g = lambda ms, mult=1.0: mult * flops / (ms * 1e6)
                    row = (f"| {dt_name} | {th} | {S} | {int(causal)} | {g(of):.0f} | {g(tf):.0f} | "
                           f"{g(ofb, 3.5):.0f} | {g(tfb, 3.5):.0f} | {tf / of:.2f} | {tfb / ofb:.2f} |")
                    print(row, flush=True)
                    lines.append(row)
                    write()
    write()


if __name__ == "__main__":
    main()
