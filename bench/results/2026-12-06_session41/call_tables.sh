#!/usr/bin/env bash
# Session 41 (#19): the CPU backend beside torch's CPU SDPA on this GPU machine's host, the issue's whole table in one
# call: 16 threads at 1k/4k (median of 3) and 16k (1 timed repeat), 2 threads likewise (about 10 minutes: over a
# call's limit with the 2-thread 16k rows, which then come back as far as they got; PARTS below splits it). A call
# returns at most 8 files (device README, Limits): every part appends its table to tables.md and its log to parts.log,
# so that the build log, host.txt, those two and the running part's current.md / current.log (its rows so far, if the
# call ends in it) are all that come back (run 3 wrote a file pair per part and lost the 9th and 10th).
#   [PARTS="t16_1k4k t16_16k t2_1k4k"] bash bench/results/2026-12-06_session41/call_tables.sh $OUT
# PARTS picks parts (default all four, in this order): the first three took about 4.5 minutes in run 3, the 2-thread
# 16k part about 6 on its own, so two calls on one warm machine hold the whole table inside the calls' limits.
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
t0=$(date +%s)
# device_table.sh with neither table: its CPU-only Release build (into /tmp/cpu-table-build) and host.txt.
CPU_RUNS=0 CPU_TWO=0 bash "$REPO/bench/cpu/device_table.sh" "$OUT" || exit 1
B=/tmp/cpu-table-build
grep -o 'amx_bf16' /proc/cpuinfo | head -1 >>"$OUT/host.txt"
part() {  # name threads seqlens reps
  local t1; t1=$(date +%s)
  python3 "$REPO/bench/cpu/compare_torch_cpu.py" --cli "$B/flashattn" --threads "$2" --seqlens "$3" --reps "$4" \
    --out "$OUT/current.md" >"$OUT/current.log" 2>&1
  local rc=$?
  { echo "## $1 (rc $rc, $(( $(date +%s) - t1 )) s)"; sed -n '3,$p' "$OUT/current.md"; echo; } >>"$OUT/tables.md"
  { echo "== $1"; cat "$OUT/current.log"; } >>"$OUT/parts.log"
  echo "$1 rc $rc"; grep "^| [fb]" "$OUT/current.md"
}
declare -A args=([t16_1k4k]="16 1024,4096 3" [t16_16k]="16 16384 1" [t2_1k4k]="2 1024,4096 3" [t2_16k]="2 16384 1")
for name in ${PARTS:-t16_1k4k t16_16k t2_1k4k t2_16k}; do
  [[ -n ${args[$name]:-} ]] || { echo "unknown part $name"; continue; }
  part "$name" ${args[$name]}
done
echo "total $(( $(date +%s) - t0 )) s"
