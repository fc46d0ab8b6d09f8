#!/usr/bin/env bash
# A backward patch against the checkout in one build (as decode_patch_ab.sh does for decode): the small build of
# sm90_bwd_loop.sh (DEV_HDIMS, default "64;128"; the C ABI library kept as "base"), then PATCH applied in place
# (reverted at exit) and the build brought up to date (only the units the patch touches recompile). On the patched
# build: the backward GPU suites (DEV_AB_CASES) and memcheck + racecheck on the sm90 backward's sanitizer cases. Then
# bench_bwd.py times both libraries beside FA2 and cuDNN in one process, twice, the second time in reverse order.
# usage: bench/gpu/dev/bwd_patch_ab.sh OUTDIR PATCH     (PATCH relative to the checkout)
# DEV_AB_HDIMS (default "64,128") and DEV_AB_SEQLENS (default "1024 4096 16384"): the timed shapes.
set -uo pipefail
OUT=$1; PATCH=$2
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-bwd-ab} DEV_HDIMS=${DEV_HDIMS:-64;128}
W=$DEV_BWD_WORK
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
lib() { find "$W/build" -name 'libflashattn_capi.so' | head -1; }
DEV_PYTHON=OFF bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/base" none || exit 1
cp "$(lib)" "$W/base.so" || exit 1
(cd "$REPO" && git apply --whitespace=nowarn "$PATCH") || { echo "patch does not apply"; exit 1; }
trap '(cd "$REPO" && git apply -R --whitespace=nowarn "$PATCH")' EXIT
DEV_PYTHON=OFF DEV_GTEST_S=${DEV_GTEST_S:-150} DEV_SAN_S=${DEV_SAN_S:-80} bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" \
  "$OUT/patched" "${DEV_AB_CASES:-Sm90*/Backward.*:-*fp16*}"
cp "$(lib)" "$W/patched.so" || exit 1
cd "$REPO/bench/gpu/dev" || exit 1
for order in fwd rev; do
  libs=("$W/base.so:base" "$W/patched.so:patched")
  [[ $order == rev ]] && libs=("$W/patched.so:patched" "$W/base.so:base")
  timeout 150 python3 bench_bwd.py "${libs[@]}" --hdims "${DEV_AB_HDIMS:-64,128}" \
    ${DEV_AB_SEQLENS:-1024 4096 16384} >"$OUT/ab_$order.tsv" 2>&1
  echo "bench_bwd order $order rc $?"
done
python3 - "$OUT/ab_fwd.tsv" "$OUT/ab_rev.tsv" <<'PYEOF'
import sys, collections
t = collections.defaultdict(dict)
for i, f in enumerate(sys.argv[1:]):
    for line in open(f):
        c = line.rstrip("\n").split("\t")
        if len(c) >= 8 and c[0] not in ("backend",):
            try: t[tuple(c[1:4])].setdefault(c[0], []).append(float(c[7]))
            except ValueError: pass
print("hdim causal seqlen: TFLOP/s (given order / reversed order) per backend")
for k, v in t.items():
    print(" ".join(k), "  ".join(f"{b} {'/'.join(f'{x:.1f}' for x in xs)}" for b, xs in sorted(v.items())))
PYEOF
