#!/usr/bin/env bash
# Backward patches against the checkout in one build (as decode_patch_ab.sh does for decode): the small build of
# sm90_bwd_loop.sh (DEV_HDIMS, default "64;128"; the C ABI library kept as "base"), then each PATCH in turn applied in
# place (reverted after it), the build brought up to date (only the units it touches recompile) and its library kept
# under the patch's name. On each patched build: the backward GPU suites (DEV_AB_CASES), and with DEV_AB_SAN=1 (the
# default for a single patch) memcheck + racecheck on the sm90 backward's sanitizer cases. Then bench_bwd.py times
# every library beside FA2 and cuDNN in one process, twice, the second time in reverse order, and prints a table.
# usage: bench/gpu/dev/bwd_patch_ab.sh OUTDIR PATCH [PATCH ...]     (PATCHes relative to the checkout; one named
# diag_*.patch is a diagnostic that gives wrong results by design, e.g. an upper bound: built and timed, no suites)
# DEV_AB_HDIMS (default "64,128") and DEV_AB_SEQLENS (default "1024 4096 16384"): the timed shapes. DEV_AB_ROUNDS=N:
# one process instead of the two orders, each library and peer timed N times per shape, interleaved, and the median
# (bench_bwd.py --rounds; every round's value on its "# rounds" lines, each patch against base round by round on
# its "# paired" lines). DEV_AB_REP=MS: do_bench's repeat time per timing (default 100; 9 rounds of 30 ms take about
# the time of 3 of 100 and pair neighbours closer in time). DEV_AB_BASE_CASES (default none) and
# DEV_AB_BASE_SAN=1: the checkout itself through the suites and the sanitizers (an uncommitted change under test).
# DEV_AB_DIR=fwd: forward patches instead: the sm90 forward suites and sanitizer cases, bench_fwd.py in two orders
# (it has no rounds) with DEV_AB_HDIMS / DEV_AB_SEQLENS as above, and DEV_AB_MASKS (bench_fwd.py --masks, default
# none,causal).
set -uo pipefail
OUT=$1; shift
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-bwd-ab} DEV_HDIMS=${DEV_HDIMS:-64;128}
W=$DEV_BWD_WORK
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
lib() { find "$W/build" -name 'libflashattn_capi.so' | head -1; }
# A warm machine keeps $W/build from the last call, whose last build had a patch applied; this call's copy of the
# checkout brings the reverted files with their older times, so ninja would call the patched objects up to date and
# "base" would be the last patch (seen in bench/results/2026-12-06_h100_session38, run 2). The files each patch
# touched are listed in $W/patched and touched here so that they recompile.
if [[ -f $W/patched ]]; then
  while read -r f; do [[ -f $REPO/$f ]] && touch "$REPO/$f"; done <"$W/patched"
  rm -f "$W/patched"
fi
DEV_PYTHON=OFF DEV_BWD_SANITIZE=${DEV_AB_BASE_SAN:-0} DEV_GTEST_S=${DEV_GTEST_S:-150} DEV_SAN_S=${DEV_SAN_S:-80} \
  bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/base" "${DEV_AB_BASE_CASES:-none}" || exit 1
cp "$(lib)" "$W/base.so" || exit 1
libs=("$W/base.so:base")
san=${DEV_AB_SAN:-$([[ $# == 1 ]] && echo 1 || echo 0)}
if [[ ${DEV_AB_DIR:-bwd} == fwd ]]; then
  bench=bench_fwd.py default_cases='Sm90*/Forward.*:Sm90TileCounter.*:Paged*:-*fp16*'
  export DEV_SAN_FILTER=${DEV_SAN_FILTER:-'Sanitizer/Forward.*sm90*:Sm90TileCounter.*'}
else
  bench=bench_bwd.py default_cases='Sm90*/Backward.*:-*fp16*'
fi
for patch in "$@"; do
  tag=$(basename "$patch" .patch)
  (cd "$REPO" && git apply --numstat "$patch" | cut -f3) >>"$W/patched"
  (cd "$REPO" && git apply --whitespace=nowarn "$patch") || { echo "$tag: does not apply"; continue; }
  echo "== $tag"
  cases=${DEV_AB_CASES:-$default_cases}
  [[ $tag == diag_* ]] && cases=none  # a diagnostic (wrong results by design): timed, not tested
  DEV_PYTHON=OFF DEV_BWD_SANITIZE=$san DEV_GTEST_S=${DEV_GTEST_S:-150} DEV_SAN_S=${DEV_SAN_S:-80} \
    bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/$tag" "$cases" &&
    cp "$(lib)" "$W/$tag.so" && libs+=("$W/$tag.so:$tag")
  (cd "$REPO" && git apply -R --whitespace=nowarn "$patch")
done
rev=(); for ((i = ${#libs[@]} - 1; i >= 0; i--)); do rev+=("${libs[i]}"); done
cd "$REPO/bench/gpu/dev" || exit 1
# The SM clock and power every 100 ms while the libraries are timed, to read against bench_bwd.py's "# started"
# lines (nvidia-smi's timestamps are the machine's local time).
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 >"$OUT/clocks.csv" 2>&1 &
clock_log=$!
if [[ -n ${DEV_AB_ROUNDS:-} && $bench == bench_bwd.py ]]; then
  timeout 400 python3 bench_bwd.py "${libs[@]}" --rounds "$DEV_AB_ROUNDS" --rep "${DEV_AB_REP:-100}" \
    --hdims "${DEV_AB_HDIMS:-64,128}" ${DEV_AB_SEQLENS:-1024 4096 16384} >"$OUT/ab_rounds.tsv" 2>&1
  echo "bench_bwd rounds $DEV_AB_ROUNDS rc $?"; grep -E "^# (rounds|paired)" "$OUT/ab_rounds.tsv"
  tables=("$OUT/ab_rounds.tsv")
else
  for order in fwd rev; do
    if [[ $order == fwd ]]; then set -- "${libs[@]}"; else set -- "${rev[@]}"; fi
    masks=(); [[ $bench == bench_fwd.py ]] && masks=(--masks "${DEV_AB_MASKS:-none,causal}")
    timeout 200 python3 $bench "$@" --hdims "${DEV_AB_HDIMS:-64,128}" ${masks[@]+"${masks[@]}"} \
      ${DEV_AB_SEQLENS:-1024 4096 16384} >"$OUT/ab_$order.tsv" 2>&1
    echo "$bench order $order rc $?"
  done
  tables=("$OUT/ab_fwd.tsv" "$OUT/ab_rev.tsv")
fi
kill "$clock_log" 2>/dev/null
gzip -f "$OUT/clocks.csv"
python3 - "${tables[@]}" <<'PYEOF'
import sys, collections
t = collections.defaultdict(dict)
for f in sys.argv[1:]:
    for line in open(f):
        c = line.rstrip("\n").split("\t")
        if len(c) >= 8 and c[0] != "backend":
            try: t[tuple(c[1:4])].setdefault(c[0], []).append(float(c[7]))
            except ValueError: pass
print("hdim causal seqlen: TFLOP/s per backend (two orders: given / reversed; rounds: the median)")
for k, v in t.items():
    print(" ".join(k), "  ".join(f"{b} {'/'.join(f'{x:.1f}' for x in xs)}" for b, xs in sorted(v.items())))
PYEOF
