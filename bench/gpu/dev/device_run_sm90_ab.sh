#!/bin/bash
# One device call for an sm90 forward change measured against its ablation variant: the forward GPU tests and
# their sanitizer subset (device_run_sm90.sh, no timing), then bench_fwd.py of the default kernels with SDPA cuDNN
# and FA2 beside them, then the same shapes with FLASHATTN_SM90_MECHANISMS=VARIANT (ours only; a build with
# -DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=VARIANT; only bf16 d128 has variants).
# Usage (from the source root): bench/gpu/dev/device_run_sm90_ab.sh OUT_DIR BUILD_DIR VARIANT [seqlen ...]
O=$1; B=$2; VARIANT=$3; shift 3
L=$(find "$B" -name libflashattn_capi.so | head -1)
SEQLENS=${*:-1024 2048 4096 8192 16384}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
BENCH=0 bash bench/gpu/dev/device_run_sm90.sh "$O" "$B"
timeout 200 python3 bench/gpu/dev/bench_fwd.py "$L" $SEQLENS --hdims ${HDIMS:-128,256} > "$O/bench_default.tsv" 2>&1
echo "== bench default rc=$?"
FLASHATTN_SM90_MECHANISMS=$VARIANT timeout 100 python3 bench/gpu/dev/bench_fwd.py "$L" $SEQLENS --hdims 128 \
  --ours-only --tag "$VARIANT" > "$O/bench_$VARIANT.tsv" 2>&1
echo "== bench $VARIANT rc=$?"
python3 - "$O/bench_default.tsv" "$O/bench_$VARIANT.tsv" <<'PY'
import sys, collections
t = collections.defaultdict(dict)
for path in sys.argv[1:]:
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if len(f) == 8 and not line.startswith(("#", "backend")):
            t[(int(f[1]), int(f[2]), int(f[3]))][f[0]] = float(f[7])
names = sorted({n for row in t.values() for n in row})
print("hdim\tcausal\tseqlen\t" + "\t".join(names) + "\tours/cudnn")
for key in sorted(t):
    row = t[key]
    ratio = row.get("ours", 0) / row["cudnn"] if row.get("cudnn") else float("nan")
    print("\t".join(map(str, key)) + "\t" + "\t".join(f"{row.get(n, float('nan')):.1f}" for n in names) + f"\t{ratio:.3f}")
PY
