#!/usr/bin/env bash
# The CPU backend beside torch's CPU SDPA on the GPU machine's host (the issue's "same host"): a CPU-only Release
# build with every core, then bench/cpu/compare_torch_cpu.py at 16 threads (CPU_RUNS times: the host's runs of the
# same command have spread 2x at 1k, where a call takes milliseconds) and at 2 threads, one table per run under OUT.
# usage: bench/cpu/device_table.sh OUT   (CPU_SEQLENS, default 1024,4096; CPU_RUNS, default 2 (0: no 16-thread table);
# CPU_ARGS: more compare_torch_cpu.py arguments, e.g. "--dtypes fp32 --reps 2"; CPU_TWO=0: no 2-thread table;
# CPU_SEQLENS_2T and CPU_ARGS_2T: the 2-thread table's, default the same. 16k rows take minutes at 2 threads.)
set -uo pipefail
OUT=$1
mkdir -p "$OUT"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
B=/tmp/cpu-table-build
t0=$(date +%s)
cmake -S "$REPO" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=OFF -DFLASHATTN_TESTS=OFF \
  -DFLASHATTN_PYTHON=OFF >"$OUT/build.log" 2>&1 && cmake --build "$B" -j "$(nproc)" >>"$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz" >"$OUT/host.txt"
for run in $(seq 1 "${CPU_RUNS:-2}"); do
  python3 "$REPO/bench/cpu/compare_torch_cpu.py" --cli "$B/flashattn" --threads 16 \
    --seqlens "${CPU_SEQLENS:-1024,4096}" ${CPU_ARGS:-} --out "$OUT/cpu_vs_torch_16t_run$run.md" >"$OUT/16t_run$run.log" 2>&1
  echo "16 threads run $run rc $?"; grep "^| [fb]" "$OUT/cpu_vs_torch_16t_run$run.md"
done
[[ ${CPU_TWO:-1} == 1 ]] || exit 0
python3 "$REPO/bench/cpu/compare_torch_cpu.py" --cli "$B/flashattn" --threads 2 \
  --seqlens "${CPU_SEQLENS_2T:-${CPU_SEQLENS:-1024,4096}}" ${CPU_ARGS_2T:-${CPU_ARGS:-}} --out "$OUT/cpu_vs_torch_2t.md" \
  >"$OUT/2t.log" 2>&1
echo "2 threads rc $?"; grep "^| [fb]" "$OUT/cpu_vs_torch_2t.md"
