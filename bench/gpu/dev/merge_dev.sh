#!/usr/bin/env bash
# Device check of fa_merge_partials and of the split-KV combine that shares its rule (core/merge_rule.hpp): the small
# build of sm90_bwd_loop.sh (FLASHATTN_KERNELS=ci, sm90 head dims 64/128/256) with the Python package, the GpuMerge
# suite and the sm90 split-KV and sinks forward cases (bf16: the ci build has no fp16 kernels), compute-sanitizer
# memcheck/racecheck on the merge and split cases, the ring tests (gloo on CPU, the merge on CUDA), then the CPU
# backend beside torch's CPU SDPA at 4, 8 and 16 threads (DEV_CPU_THREADS, DEV_CPU_SEQLENS) with the build's CLI.
# usage: bench/gpu/dev/merge_dev.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-merge} DEV_HDIMS=${DEV_HDIMS:-"64;128;256"}
DEV_BWD_SANITIZE=0 DEV_BWD_BENCH=0 DEV_GTEST_S=200 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" \
  'GpuMerge.*:Sm90/Forward.*split*:Sm90/Forward.*sinks*:-*fp16*'
BIN=$(find "$DEV_BWD_WORK/build" -name 'flashattn_gpu_tests' -type f | head -1)
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" \
    --gtest_filter='GpuMerge.*:Sm90/Forward.*split_decode*:-*fp16*' >"$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc $?"; grep -E "ERROR SUMMARY|Hazard|Invalid|PASSED|FAILED" "$OUT/san_$tool.log" | head -5
done
(cd "$REPO" && PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 150 python3 -m pytest tests/python/test_ring.py -q -rs \
  >"$OUT/pytest.log" 2>&1)
echo "pytest rc $?"; tail -4 "$OUT/pytest.log"
CLI=$(find "$DEV_BWD_WORK/build" -maxdepth 1 -name flashattn -type f -executable | head -1)
[[ -n $CLI ]] || { echo "no CLI in the build"; exit 0; }
timeout "${DEV_CPU_S:-200}" python3 "$REPO/bench/cpu/compare_torch_cpu.py" --cli "$CLI" \
  --threads "${DEV_CPU_THREADS:-4,8,16}" --seqlens "${DEV_CPU_SEQLENS:-1024}" --out "$OUT/cpu_vs_torch.md" \
  >"$OUT/cpu_vs_torch.log" 2>&1
echo "cpu compare rc $?"; cat "$OUT/cpu_vs_torch.log" | tail -20
