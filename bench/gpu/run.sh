#!/usr/bin/env bash
# The GPU verification and benchmark harness, one invocation on the GPU machine:
#   build (or take a carried build) -> C++ GPU tests -> Python GPU correctness suite -> compute-sanitizer
#   memcheck + racecheck on a small subset -> ours vs torch SDPA cuDNN and FA2 -> results.md, results.csv,
#   plots.png and logs in OUTDIR (the 7 files: results.md results.csv plots.png build.log check.log
#   sanitizer.log bench.log; the device tool brings back at most 8).
#
# usage: bench/gpu/run.sh OUTDIR [--quick] [--build-dir DIR] [--archs LIST] [--jobs N] [--skip STEP,...]
#                          [--budget S] [--mock] [--ablations] [--training DTYPES]
#   --quick       a few shapes (about a minute after the build); without it the full record run
#   --build-dir   a build folder made elsewhere (its paths are rewritten for ctest); default: configure and
#                 build here with cmake -G Ninja -DFLASHATTN_KERNELS=default
#   --archs       CUDA architectures to build (default 90a: the H200); the sm80 (FA2) family is built for the
#                 same architectures without the 'a' (FLASHATTN_SM80_ARCHS), so it runs natively there
#   --skip        any of build,ctest,ctest_cpu,check,pytest,sanitize,bench (to rerun a part; ctest_cpu: only the CPU
#                 suites of ctest, which CI runs too; without the build step 'ours'
#                 is whatever `import flashattn` finds)
#   --budget S    seconds the whole run may take (default 570: the device tool's 600 s call limit less a
#                 margin); the C++ suites and the Python suite get timeouts from it, and the benchmarks stop
#                 adding shapes in time for the report to be written
#   --mock        test the harness itself: 'ours' is bench/gpu/mock/flashattn_mock (torch's plain implementation), whatever
#                 was built; its rows say nothing about our kernels
#   FLASHATTN_BENCH_ARGS (environment): extra bench.py arguments, e.g. --decode-only for the decode rows alone
#                 beside the correctness steps (FLASHATTN_BENCH_RESERVE: the seconds they keep for it, default 90)
#   FlashAttention-4 runs beside the others (backend fa4: an FA4 and an ours/FA4 column in results.md) wherever
#                 `flash_attn.cute` imports: e.g. eval "$(bash bench/gpu/dev/fa4_parts.sh install .peers/fa4)" before
#                 this script, after the two stashing calls fa4_parts.sh describes. Each shape then takes 8 timings, not 6.
#   --training DTYPES  the training table alone (forward and backward rows) in these dtypes, e.g. bf16 (the bars'
#                 dtype, ../shared/anchors/targets_vs_cudnn_h200.tsv): no decode or feature rows. With every correctness
#                 step skipped the build then makes only the units that table runs (FLASHATTN_DTYPES, no sm90 dropout
#                 or FP8 units; 12 kernel units instead of 42 for bf16): the same instantiations as the default set's,
#                 so its rows time the default build's kernels (estimated at half a full record run's device time).
#   --ablations   for a build with the sm90 ablation variants only: bench.py --ablations times the sm90 bf16 d128
#                 forward once per FLASHATTN_SM90_MECHANISMS variant (seqlen 2k/8k/16k, causal and not, cuDNN
#                 beside it) after the main table, which leaves it its time; results.md gets an Ablation table.
#                 FLASHATTN_ABLATION_VARIANTS (environment, comma-separated, e.g. plain_pv_wait,plain_pv_wait_d64):
#                 build and time only those (a _d64 / _d256 variant at its head dim, beside the default kernel there)
# The compute-sanitizer step reruns a check.py --tiny run that was not clean once per tiny case (60 s at most
# in all) and reports which case fails alone, with the tail of its log.
# Dependencies the machine cannot download come from the repo's ignored .whl/ folder (bench/README.md):
#   .whl/nvidia_cutlass-*.whl (CuTe/CUTLASS headers; or set FLASHATTN_CUTLASS_DIR) and, when the machine
#   has no GoogleTest, .whl/googletest-*.tar.gz. The Python package is imported from the build tree when the
#   build made it for this interpreter, else installed with pip --no-build-isolation into a scratch folder.
# Exit status: 0 when every step that ran found nothing wrong.
set -uo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 2; }
[[ $# -ge 1 && $1 != -* ]] || usage
OUTDIR=$1; shift
QUICK=0; BUILD_DIR=""; ARCHS="90a"; JOBS=$(nproc); SKIP=""; MOCK=0; BUDGET=570; ABLATIONS=""; TRAINING=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --build-dir) BUILD_DIR=$2; shift ;;
    --archs) ARCHS=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --skip) SKIP=$2; shift ;;
    --mock) MOCK=1 ;;
    --ablations) ABLATIONS=--ablations ;;
    --budget) BUDGET=$2; shift ;;
    --training) TRAINING=$2; shift ;;
    *) usage ;;
  esac
  shift
done

[[ -z $TRAINING || $TRAINING =~ ^(bf16|fp16)(,(bf16|fp16))?$ ]] ||
  { echo "--training: a comma-separated list of bf16 and fp16 (got '$TRAINING')" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d /tmp/flashattn-harness.XXXXXX)
MODE=$([[ $QUICK == 1 ]] && echo quick || echo full)
[[ -n $TRAINING ]] && MODE="training $TRAINING"  # the report's header: a bars-only run, not a full record
QFLAG=$([[ $QUICK == 1 ]] && echo --quick || true)
PY=$(command -v python3)
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
# A build made on another machine may record a different CUDA library folder in its run path.
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
DEADLINE=$(( T0 + BUDGET ))
# Seconds left before the deadline less a reserve, never under a floor (a step always gets some time).
left() { local l=$(( DEADLINE - $(date +%s) - $1 )); (( l < $2 )) && l=$2; echo $l; }
STATUS=0
skip() { [[ ",$SKIP," == *",$1,"* ]]; }
# Seconds the correctness steps leave for the benchmarks: none when they are skipped; FLASHATTN_BENCH_ARGS (extra
# bench.py arguments, e.g. --decode-only) with FLASHATTN_BENCH_RESERVE (default 90) for a partial benchmark.
if skip bench; then BENCH_RESERVE=0
elif [[ -n ${FLASHATTN_BENCH_ARGS:-} ]]; then BENCH_RESERVE=${FLASHATTN_BENCH_RESERVE:-90}
else BENCH_RESERVE=180; fi
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
json_str() { "$PY" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }

BUILD_LOG=$OUTDIR/build.log CHECK_LOG=$OUTDIR/check.log SAN_LOG=$OUTDIR/sanitizer.log BENCH_LOG=$OUTDIR/bench.log
: >"$BUILD_LOG"; : >"$CHECK_LOG"; : >"$SAN_LOG"; : >"$BENCH_LOG"
stamp "harness ($MODE) in $REPO, work $WORK, out $OUTDIR" | tee -a "$BUILD_LOG"

# ------------------------------------------------------------------ environment
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$BUILD_LOG"
"$PY" - "$WORK/env.json" "$MODE" "$REPO" <<'EOF' 2>>"$BUILD_LOG"
import json, subprocess, sys, datetime
sys.path.insert(0, sys.argv[3] + "/bench/gpu")
import common
info = common.env_info()
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return "?"
info["driver"] = sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1") or "?"
info["nvcc"] = sh("nvcc --version | sed -n 's/.*release \\([0-9.]*\\).*/\\1/p'") or "?"
# The device tool sends the tree without .git: the caller names the commit (FLASHATTN_COMMIT=...).
import os
info["commit"] = (os.environ.get("FLASHATTN_COMMIT") or sh(f"git -C {sys.argv[3]} rev-parse --short HEAD 2>/dev/null")
                  or "(not a git checkout; set FLASHATTN_COMMIT)")
info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
info["mode"] = sys.argv[2]
json.dump(info, open(sys.argv[1], "w"))
print("env:", info)
EOF
{ compute-sanitizer --version 2>&1 | tail -1; cmake --version | head -1; echo "ninja $(ninja --version)"; } \
  >>"$BUILD_LOG" 2>&1

# ------------------------------------------------------------------ dependencies
# CuTe/CUTLASS headers: FLASHATTN_CUTLASS_DIR, an installed nvidia-cutlass, or the carried wheel (a pure
# Python py3-none-any zip: only its include tree is extracted, no pip needed).
find_cutlass() {
  if [[ -n ${FLASHATTN_CUTLASS_DIR:-} ]]; then echo "$FLASHATTN_CUTLASS_DIR"; return; fi
  local inc
  inc=$("$PY" -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))" 2>/dev/null)
  if [[ -n $inc && -f $inc/cute/tensor.hpp ]]; then echo "$inc"; return; fi
  local whl
  whl=$(ls "$REPO"/.whl/nvidia_cutlass-*.whl 2>/dev/null | head -1)
  [[ -n $whl ]] || return 0
  "$PY" - "$whl" "$WORK/cutlass" <<'EOF' >&2
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(prefix)])
EOF
  inc=$WORK/cutlass/cutlass_library/source/include
  [[ -f $inc/cute/tensor.hpp ]] && echo "$inc"
}

# GoogleTest: the system's if cmake can find one, else built from the carried source tarball (seconds).
gtest_args() {
  local cfg
  for cfg in /usr/lib/*/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake \
             /usr/local/lib*/cmake/GTest/GTestConfig.cmake; do
    [[ -f $cfg ]] && { echo "GoogleTest: $cfg" >&2; return 0; }
  done
  local tgz
  tgz=$(ls "$REPO"/.whl/googletest*.tar.gz 2>/dev/null | head -1)
  if [[ -z $tgz ]]; then echo "no GoogleTest on this machine and none carried (.whl/googletest-*.tar.gz)" >&2; return 0; fi
  mkdir -p "$WORK/gtest-src"
  tar -xzf "$tgz" -C "$WORK/gtest-src" --strip-components=1 &&
    cmake -S "$WORK/gtest-src" -B "$WORK/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$WORK/gtest" -DCMAKE_POSITION_INDEPENDENT_CODE=ON >&2 &&
    cmake --build "$WORK/gtest-build" >&2 && cmake --install "$WORK/gtest-build" >&2 &&
    echo "-DCMAKE_PREFIX_PATH=$WORK/gtest -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=$WORK/gtest-src"
}

# ------------------------------------------------------------------ build
BUILD=$WORK/build
BUILD_SUMMARY="not built"
PY_SUMMARY="not available"
if ! skip build; then
  stamp "build" | tee -a "$BUILD_LOG"
  CUTLASS=$(find_cutlass 2>>"$BUILD_LOG")
  echo "CUTLASS headers: ${CUTLASS:-none found (CUDA backends off)}" | tee -a "$BUILD_LOG"
  if [[ -n $BUILD_DIR ]]; then
    # A build made elsewhere: copy it, then point its CTest files at this checkout and this folder.
    cp -a "$BUILD_DIR/." "$BUILD/" 2>>"$BUILD_LOG" || mkdir -p "$BUILD"
    old_build=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
    old_src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
    if [[ -n $old_build && -n $old_src ]]; then
      find "$BUILD" -name '*.cmake' |
        xargs -r sed -i "s#$old_build#$BUILD#g; s#$old_src#$REPO#g"
    fi
    BUILD_SUMMARY="carried build from $BUILD_DIR (built at $old_build)"
  else
    extra=()
    [[ -n $CUTLASS ]] && extra+=("-DFLASHATTN_CUTLASS_DIR=$CUTLASS") || extra+=("-DFLASHATTN_CUDA=OFF")
    pyext=()
    if [[ -f $REPO/python/CMakeLists.txt ]]; then
      # The extension is built in the same tree (the kernels compile once) for this machine's python3.
      pyext=("-DFLASHATTN_PYTHON=ON" "-DPython_EXECUTABLE=$PY" "-Dnanobind_DIR=$("$PY" -m nanobind --cmake_dir 2>/dev/null)")
    fi
    # A run without the correctness steps (a record benchmark) builds what the benchmarks run: no C++ test binaries
    # (nor GoogleTest) and no sm90 score-mods units (softcap/ALiBi are not benchmarked): 42 kernel units instead of
    # 48 and no test units, about 580 s of compile time less (estimated from bench/results/2026-12-05_build_units.md;
    # some 35 s of a 16-core build, which session 29's record run needed: its budget ran out before the last rows).
    gt=()
    if skip ctest && skip ctest_cpu && skip check && skip pytest && skip sanitize; then
      extra+=(-DFLASHATTN_TESTS=OFF -DFLASHATTN_SM90_SCORE_MODS=OFF)
      BENCH_SET=" (benchmarked kernels only: no tests, no sm90 score-mods units)"
      if [[ -n $TRAINING ]]; then
        # Fewer units than cores: the split units shorten the longest one (src/cuda/CMakeLists.txt).
        extra+=("-DFLASHATTN_DTYPES=${TRAINING//,/;}" -DFLASHATTN_SM90_DROPOUT=OFF -DFLASHATTN_SM90_FP8=OFF
                -DFLASHATTN_FINE_UNITS=ON)
        BENCH_SET=" (the training table's kernels only: dtypes $TRAINING, no sm90 dropout, FP8 or score-mods units, no tests)"
      fi
    else
      read -r -a gt <<<"$(gtest_args 2>>"$BUILD_LOG")"
    fi
    # Configured when cmake succeeds, or when it reports an error but still wrote build.ninja (a generate-time
    # complaint about one target need not stop the rest); then fewer parts until something configures.
    configure() {
      rm -rf "$BUILD"
      echo "+ configure $*" >>"$BUILD_LOG"
      cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_KERNELS=default \
        -DFLASHATTN_CUDA_ARCHS="$ARCHS" -DFLASHATTN_SM80_ARCHS="${ARCHS//a/}" \
        ${ABLATIONS:+-DFLASHATTN_SM90_ABLATIONS=ON} \
        ${FLASHATTN_ABLATION_VARIANTS:+-DFLASHATTN_SM90_ABLATION_VARIANTS=${FLASHATTN_ABLATION_VARIANTS//,/;}} \
        "${extra[@]}" "$@" >>"$BUILD_LOG" 2>&1 ||
        { [[ -f $BUILD/build.ninja ]] && CONFIG_NOTE+=" (cmake reported errors, see build.log)"; }
    }
    CONFIG_NOTE=""
    if configure "${pyext[@]}" "${gt[@]}"; then :
    elif [[ ${#pyext[@]} -gt 0 ]] && configure "${gt[@]}"; then CONFIG_NOTE+=" (Python extension off: its configure failed)"
    elif configure -DFLASHATTN_TESTS=OFF; then CONFIG_NOTE+=" (Python extension and C++ tests off: their configure failed)"
    else STATUS=1; CONFIG_NOTE+=" (CONFIGURE FAILED)"
    fi
    tests_note=$CONFIG_NOTE
    tb=$(date +%s)
    if cmake --build "$BUILD" -j "$JOBS" >>"$BUILD_LOG" 2>&1; then
      BUILD_SUMMARY="built here in $(( $(date +%s) - tb )) s with $JOBS jobs, archs $ARCHS, kernels default${BENCH_SET:-}$tests_note"
    else
      BUILD_SUMMARY="BUILD FAILED after $(( $(date +%s) - tb )) s$tests_note (see build.log)"; STATUS=1
      grep -m 20 -E "error|Error" "$BUILD_LOG" | tail -20
    fi
  fi
  stamp "$BUILD_SUMMARY" | tee -a "$BUILD_LOG"
  # Where the build's time goes (the units are compiled 16 at a time: the total and the longest units say whether
  # more, smaller units would help; src/cuda/CMakeLists.txt, FLASHATTN_FINE_UNITS).
  if [[ -f $BUILD/.ninja_log ]]; then
    awk '!/^#/ {d = ($2 - $1) / 1000; t += d; printf "%6.1f s %s\n", d, $4} END {printf "%6.1f s in all\n", t}' \
      "$BUILD/.ninja_log" | sort -rn | head -8 >>"$BUILD_LOG"
  fi

  # The Python package: from the build tree when it imports there, else pip into a scratch folder.
  import_ok() { PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import flashattn; flashattn.flash_attn_func" >/dev/null 2>&1; }
  PYROOT=""
  [[ $MOCK == 1 ]] && SKIP_PKG=1 || SKIP_PKG=0  # the mock stands in for the package: do not build it
  pkg_src=$(find "$REPO/python" "$REPO/src" -path '*/flashattn/__init__.py' 2>/dev/null | head -1)
  for cand in "$BUILD/python" "$BUILD"; do
    if [[ $SKIP_PKG == 0 ]] && import_ok "$cand"; then PYROOT=$cand; break; fi
  done
  if [[ $SKIP_PKG == 0 && -z $PYROOT && -n $pkg_src && -d $BUILD ]]; then
    # Compose the package from its sources and the extension the build made.
    mkdir -p "$WORK/pyroot"; cp -r "$(dirname "$pkg_src")" "$WORK/pyroot/"
    find "$BUILD" -name "*.cpython-*.so" -o -name "*.abi3.so" | while read -r so; do cp "$so" "$WORK/pyroot/flashattn/"; done
    import_ok "$WORK/pyroot" && PYROOT=$WORK/pyroot
  fi
  if [[ $SKIP_PKG == 0 && -z $PYROOT && -f $REPO/pyproject.toml ]]; then
    stamp "pip install --no-build-isolation (the build tree has no importable package)" | tee -a "$BUILD_LOG"
    cs=(-C "cmake.define.FLASHATTN_CUDA_ARCHS=$ARCHS" -C "cmake.define.FLASHATTN_SM80_ARCHS=${ARCHS//a/}"
        -C cmake.define.FLASHATTN_KERNELS=default -C "build-dir=$WORK/pybuild")
    [[ -n ${CUTLASS:-} ]] && cs+=(-C "cmake.define.FLASHATTN_CUTLASS_DIR=$CUTLASS")
    tp=$(date +%s)
    if "$PY" -m pip install --no-build-isolation --no-deps --no-index --target "$WORK/pysite" "${cs[@]}" "$REPO" \
         >>"$BUILD_LOG" 2>&1 && import_ok "$WORK/pysite"; then
      PYROOT=$WORK/pysite; PY_SUMMARY="pip-installed in $(( $(date +%s) - tp )) s"
    else
      PY_SUMMARY="pip install FAILED (see build.log)"; STATUS=1
    fi
  fi
  if [[ -n $PYROOT ]]; then
    export PYTHONPATH="$PYROOT${PYTHONPATH:+:$PYTHONPATH}"
    [[ $PY_SUMMARY == pip* ]] || PY_SUMMARY="imported from $PYROOT"
  elif [[ ! -f $REPO/pyproject.toml ]]; then
    PY_SUMMARY="not available (no pyproject.toml in this checkout)"
  fi
  stamp "python package: $PY_SUMMARY" | tee -a "$BUILD_LOG"
fi
if [[ $MOCK == 1 ]]; then
  export PYTHONPATH="$HERE/mock${PYTHONPATH:+:$PYTHONPATH}" FLASHATTN_BENCH_PACKAGE=flashattn_mock
  PY_SUMMARY="MOCK (bench/gpu/mock/flashattn_mock: torch's plain implementation stands in for ours; harness self-test only)"
  stamp "python package: $PY_SUMMARY" | tee -a "$BUILD_LOG"
fi
echo "{\"summary\": $(json_str "$BUILD_SUMMARY"), \"python\": $(json_str "$PY_SUMMARY")}" >"$WORK/build.json"

# ------------------------------------------------------------------ a. C++ suites
ctest_summary() {  # "N passed, M failed" from a ctest log, or why nothing ran
  if grep -q "No tests were found" "$1"; then echo "no tests with this label"; return; fi
  local line total failed
  # CMake 3 prints "90% tests passed, 1 tests failed out of 10"; CMake 4 drops the middle part at 100%.
  line=$(grep -E "[0-9]+% tests passed.* out of [0-9]+" "$1" | tail -1)
  [[ -n $line ]] || { echo "did not finish (see check.log)"; return; }
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  failed=$(grep -oE "[0-9]+ tests? failed" <<<"$line" | grep -oE "^[0-9]+" || true)
  echo "$(( total - ${failed:-0} )) passed, ${failed:-0} failed"
}
GPU_CT="not built"; CPU_CT="not built"; CTEST_PID=""
# On a compute capability 9.0 GPU with a build for 90a the sm90 cases must run: a skip there (a build without the
# sm90 kernels) is a failure (tests/gpu/gpu_support.hpp).
GPU_CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
if [[ $GPU_CAP == 9.0 && $ARCHS == *90a* && -z $BUILD_DIR ]]; then export FLASHATTN_REQUIRE_SM90=1; fi
if ! skip ctest && [[ -f $BUILD/CTestTestfile.cmake ]]; then
  # Full: the whole GPU binary (it holds the 'sanitizer' subset too, so that label is not run twice).
  # --quick: the fast 'sanitizer' subset only. The suite spends most of its time in its CPU reference, so it
  # runs beside the Python suite and the sanitizer (correctness only, nothing timed) and is awaited before
  # the benchmarks.
  if [[ $QUICK == 1 ]]; then GPU_SEL=(-L "^sanitizer?$"); else GPU_SEL=(-L gpu -LE "^sanitizer?$"); fi
  GPU_CT_WHAT="ctest ${GPU_SEL[*]}"
  stamp "$GPU_CT_WHAT (in the background)" | tee -a "$CHECK_LOG"
  # Per-test timeout: what is left once the benchmarks (3 min) are reserved, so a hung kernel cannot eat the run.
  ( ctest --test-dir "$BUILD" "${GPU_SEL[@]}" --output-on-failure --timeout "$(left $BENCH_RESERVE 60)" >"$WORK/ctest_gpu.log" 2>&1
    echo $? >"$WORK/ctest_gpu.rc" ) &
  CTEST_PID=$!
fi
finish_ctest() {
  [[ -n $CTEST_PID ]] || return 0
  wait "$CTEST_PID"
  [[ $(cat "$WORK/ctest_gpu.rc" 2>/dev/null) == 0 ]] || STATUS=1
  { echo "----- $GPU_CT_WHAT"; cat "$WORK/ctest_gpu.log"; } >>"$CHECK_LOG"
  GPU_CT="$(ctest_summary "$WORK/ctest_gpu.log") ($GPU_CT_WHAT)"
  # The fast tier only: the deep tier (CpuDeep, the fuzz's 10^4 cases) is scripts/run_tests.sh --deep's, and timed
  # out inside this harness's budget (bench/results/2026-12-01_h200_session7/check.log).
  if skip ctest_cpu; then CPU_CT="skipped (--skip ctest_cpu)"; else
    stamp "ctest -LE gpu -L fast (CPU suites)" | tee -a "$CHECK_LOG"
    # No GPU visible: as in CI. With one, every CLI the fuzz starts with an auto or CUDA backend made a CUDA context,
    # and Fuzz.Cli's 150 processes outgrew their timeout (bench/results/2026-12-01_h200_session11/check.log).
    CUDA_VISIBLE_DEVICES="" ctest --test-dir "$BUILD" -LE gpu -L fast -j "$JOBS" --output-on-failure \
      --timeout "$(left $BENCH_RESERVE 60)" >"$WORK/ctest_cpu.log" 2>&1 || STATUS=1
    tail -n 40 "$WORK/ctest_cpu.log" >>"$CHECK_LOG"
    CPU_CT=$(ctest_summary "$WORK/ctest_cpu.log")
  fi
  stamp "ctest: gpu $GPU_CT; cpu $CPU_CT" | tee -a "$CHECK_LOG"
}

# ------------------------------------------------------------------ b. Python GPU suite
if ! skip check; then
  stamp "check.py $QFLAG" | tee -a "$CHECK_LOG"
  timeout "$(left $(( BENCH_RESERVE + 60 )) 60)" "$PY" "$HERE/check.py" $QFLAG --json "$WORK/check.json" >>"$CHECK_LOG" 2>&1 || STATUS=1
  stamp "$(grep -E '^# check:' "$CHECK_LOG" | tail -1)"
fi

# ------------------------------------------------------------------ b2. the Python package's own tests
# tests/python on this machine: the numpy CPU tests and the torch tests with their CUDA cases (autograd,
# torch.compile fullgraph, CUDA-graph capture and replay, non-contiguous inputs, GQA, varlen).
PYTEST="not run"
if ! skip pytest && [[ -n ${PYROOT:-} && -d $REPO/tests/python ]]; then
  stamp "pytest tests/python" | tee -a "$CHECK_LOG"
  # Without the Python fuzz (CPU-only bad input, one interpreter per case: CI runs it): it doubled this step.
  # Without the CPU inductor compiles (CI runs them): one of them outlasted the step's remaining minutes here
  # (bench/results/2026-12-01_h200_session11/check.log).
  # -v: one line per test as it ends, so that a run cut by its timeout still names what passed and failed.
  (cd "$REPO" && timeout "$(left $(( BENCH_RESERVE + 60 )) 60)" "$PY" -m pytest tests/python -v -rfEs --durations=15 -p no:cacheprovider \
     --deselect tests/python/test_bad_input.py::test_fuzz \
     --deselect "tests/python/test_torch.py::test_torch_compile_fullgraph[cpu-inductor]" \
     --deselect "tests/python/test_torch.py::test_torch_compile_fullgraph_inference[cpu-inductor]") \
    >"$WORK/pytest.log" 2>&1 || STATUS=1
  cat "$WORK/pytest.log" >>"$CHECK_LOG"
  PYTEST=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$WORK/pytest.log" | tail -1 | tr -d '=' | xargs)
  stamp "pytest: ${PYTEST:-no summary (see check.log)}" | tee -a "$CHECK_LOG"
  grep -E " (FAILED|ERROR)( |$)|^(FAILED|ERROR) " "$WORK/pytest.log" | head -20
fi

# ------------------------------------------------------------------ c. compute-sanitizer
# The subset: ctest tests labelled 'sanitizer' (the C++ suite's small cases) and the Python --tiny cases
# (through the binding; in --quick only when there are no ctest ones). Only our kernels are instrumented
# (--kernel-name) when they all carry 'flashattn'. A check.py --tiny run that is not clean (hazards, errors,
# an "Internal Sanitizer Error", a nonzero exit) is rerun once per tiny case (check.py --list / --cases) to
# name the case(s) that fail alone; those reruns take at most LOCALISE_S seconds in all.
LOCALISE_S=60
if ! skip sanitize; then
  stamp "compute-sanitizer" | tee -a "$SAN_LOG"
  # Each sanitizer run is bounded (instrumented code runs 10-100x slower): 45 s in --quick, 300 s in full.
  "$PY" - "$WORK" "$BUILD" "$HERE" "$SAN_LOG" "$([[ $QUICK == 1 ]] && echo 45 || echo 300)" "$QUICK" \
    "$(( DEADLINE - 200 ))" "$LOCALISE_S" <<'EOF' || STATUS=1
import json, os, re, subprocess, sys, time
work, build, here, log_path = sys.argv[1:5]
limit_s, quick = int(sys.argv[5]), sys.argv[6] == "1"
deadline = float(sys.argv[7])  # the benchmarks' share of the run's budget is kept free
localise_s = float(sys.argv[8])
log = open(log_path, "a")
check_py = os.path.join(here, "check.py")
runs, localised, note, failed = [], [], "", False


def run_tool(tool, cmd, extra, timeout):
    """One compute-sanitizer run: (clean, result line, output)."""
    full = ["compute-sanitizer", "--tool", tool, "--report-api-errors", "no", *extra, *cmd]
    log.write(f"$ {' '.join(full)}\n"); log.flush()
    t = time.time()
    try:
        # torch's caching allocator sub-allocates large segments, so an access past a tensor's end usually
        # lands in valid memory and memcheck stays silent: give every tensor its own allocation.
        p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, timeout=timeout)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    log.write(out[-20000:] + "\n"); log.flush()
    m = re.search(r"(ERROR|RACECHECK) SUMMARY: (\d+) (errors?|hazards?)[^\n]*", out)
    internal = re.search(r"Internal Sanitizer Error[^\n]*", out)
    clean = m is not None and m.group(2) == "0" and rc == 0 and internal is None
    result = (m.group(0) if m else f"no summary (exit {rc})") + f", exit {rc}, {time.time() - t:.0f} s"
    if internal:
        result += f"; {internal.group(0).strip()}"
    return clean, result, out


def sanitize(tool, target, cmd, extra=()):
    global failed
    clean, result, _ = run_tool(tool, cmd, extra, max(20, min(limit_s, deadline - time.time())))
    failed |= not clean
    runs.append({"tool": tool, "target": target, "result": ("clean: " if clean else "PROBLEM: ") + result})
    return clean


def tail(out, first=6, last=10):
    """The sanitizer's first reports and the output's last lines: enough to see what failed where."""
    lines = [l.rstrip() for l in out.splitlines() if l.strip()]
    reports = [l for l in lines if l.startswith("=========") and "COMPUTE-SANITIZER" not in l][:first]
    return "\n".join(reports + [l for l in lines[-last:] if l not in reports])


def localise(tool, extra, budget_end):
    """Reruns check.py --tiny under `tool` once per tiny case, to name the case(s) that fail alone."""
    try:
        p = subprocess.run([sys.executable, check_py, "--tiny", "--list"], capture_output=True, text=True, timeout=60)
        labels = [l.strip() for l in p.stdout.splitlines() if l.strip()] if p.returncode == 0 else []
    except subprocess.TimeoutExpired:
        labels = []
    if not labels:
        localised.append({"tool": tool, "case": "(all)", "clean": False,
                          "result": "not localised: check.py --tiny --list gave no cases", "tail": ""})
        return
    log.write(f"# {tool}: check.py --tiny was not clean; rerunning its {len(labels)} cases one by one\n")
    for i, label in enumerate(labels):
        share = (budget_end - time.time()) / (len(labels) - i)  # what is left, split over the cases left
        if share < 10:
            localised.append({"tool": tool, "case": label, "clean": None, "tail": "",
                              "result": f"not rerun: out of time (reruns get {localise_s:.0f} s in all, within the run's budget)"})
            continue
        regex = "^" + re.escape(label).replace("\\ ", " ") + "$"
        clean, result, out = run_tool(tool, [sys.executable, check_py, "--tiny", "--plain-on-cpu", "--cases", regex], extra, share)
        localised.append({"tool": tool, "case": label, "clean": clean,
                          "result": ("clean alone: " if clean else "FAILS alone: ") + result,
                          "tail": "" if clean else tail(out)})


tests = []
if os.path.exists(os.path.join(build, "CTestTestfile.cmake")):
    p = subprocess.run(["ctest", "--test-dir", build, "-L", "^sanitizer?$", "--show-only=json-v1"],
                       capture_output=True, text=True)
    try:
        tests = [(t["name"], t["command"]) for t in json.loads(p.stdout).get("tests", []) if t.get("command")]
    except ValueError:
        tests = []
for name, cmd in tests:
    for tool in ("memcheck", "racecheck"):
        sanitize(tool, f"ctest {name}", cmd)  # unfiltered: the test binary launches little besides ours
if not tests or not quick:
    probe = subprocess.run([sys.executable, check_py, "--kernel-filter"], capture_output=True, text=True, timeout=300)
    log.write(probe.stdout + probe.stderr)
    ours = probe.returncode == 0 and "ours: not available" not in probe.stdout
    if probe.returncode != 0:
        failed = True
        note = f"check.py --kernel-filter failed (exit {probe.returncode}): Python cases not sanitised"
    elif not ours and tests:
        note = "Python --tiny cases skipped: ours not available in Python"
    elif not ours:
        # Nothing of ours to check: still prove the tool and the summary parsing on torch's FA2 kernels.
        note = "no ctest 'sanitizer' tests and ours not available in Python: tool probe on torch SDPA FA2 only"
        probe_py = ("import torch, torch.nn.functional as F\n"
                    "from torch.nn.attention import sdpa_kernel, SDPBackend\n"
                    "q = torch.randn(2, 4, 113, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
                    "with sdpa_kernel(SDPBackend.FLASH_ATTENTION):\n"
                    "    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()\n"
                    "torch.cuda.synchronize()\n")
        for tool in ("memcheck", "racecheck"):
            sanitize(tool, "probe: torch SDPA FA2 (kernels *flash*)", [sys.executable, "-c", probe_py],
                     ["--kernel-name", "kns=flash"])
    else:
        kfilter = (probe.stdout.strip().splitlines() or [""])[-1]
        extra = ["--kernel-name", f"kns={kfilter}"] if kfilter and not kfilter.startswith("#") else []
        label = "check.py --tiny --plain-on-cpu" + (f" (kernels *{kfilter}*)" if extra else " (all kernels)")
        localise_end = None  # the reruns of both tools share one allowance, which starts at the first rerun
        for tool in ("memcheck", "racecheck"):
            if not sanitize(tool, label, [sys.executable, check_py, "--tiny", "--plain-on-cpu"], extra):
                localise_end = localise_end or min(time.time() + localise_s, deadline)
                localise(tool, extra, localise_end)
json.dump({"runs": runs, "note": note, "localised": localised}, open(os.path.join(work, "sanitizer.json"), "w"))
for r in runs:
    print(f"sanitizer: {r['tool']} {r['target']}: {r['result']}")
for r in localised:
    print(f"sanitizer: {r['tool']} check.py --tiny case '{r['case']}': {r['result']}")
if note:
    print("sanitizer: " + note)
sys.exit(1 if failed else 0)
EOF
fi

finish_ctest
echo "{\"gpu\": $(json_str "$GPU_CT"), \"cpu\": $(json_str "$CPU_CT"), \"pytest\": $(json_str "${PYTEST:-not run}")}" >"$WORK/ctest.json"

# ------------------------------------------------------------------ d. benchmarks
if ! skip bench; then
  stamp "bench.py $QFLAG $ABLATIONS" | tee -a "$BENCH_LOG"
  # bench.py stops adding shapes at its deadline (the report needs ~15 s); timeout is the backstop.
  training=(); [[ -n $TRAINING ]] && training=(--training-only --dtypes "$TRAINING")
  timeout "$(left 5 30)" "$PY" "$HERE/bench.py" --csv "$OUTDIR/results.csv" $QFLAG $ABLATIONS "${training[@]}" \
    ${FLASHATTN_BENCH_ARGS:-} \
    ${FLASHATTN_ABLATION_VARIANTS:+--ablation-variants "$FLASHATTN_ABLATION_VARIANTS"} \
    --deadline $(( DEADLINE - 15 )) \
    >>"$BENCH_LOG" 2>&1 || STATUS=1
  stamp "$(tail -1 "$BENCH_LOG")"
fi

# ------------------------------------------------------------------ e. report
"$PY" "$HERE/report.py" --out "$OUTDIR" --work "$WORK" 2>&1 | tee -a "$BENCH_LOG"
stamp "done, status $STATUS" | tee -a "$BENCH_LOG"
# The end of the output is what the device tool shows first (its last 12,000 characters): the summaries (without
# the sanitizer's log tails), the table without its notes, the geometric means, the ablation table. All of it
# is in results.md.
sed -n '/^## Correctness/,/^## Throughput/p' "$OUTDIR/results.md" | grep -v '^## Throughput' |
  awk '/^```/ { skip = !skip; next } !skip'
grep -E '^\| (dir|fwd|bwd) ' "$OUTDIR/results.md" | sed -E 's/\| [^|]* \|$/|/' | head -66
grep -E '^Geometric means' "$OUTDIR/results.md"
sed -n '/^## Ablation/,/^## /p' "$OUTDIR/results.md" | grep -E '^\|'
exit $STATUS
