#!/usr/bin/env bash
# Development loop for the sm90 backward on the GPU machine (not the record harness, run.sh): a small build
# (FLASHATTN_KERNELS=ci plus the sm90 head dims 64 and 128), the backward GPU suite's cases for both families,
# compute-sanitizer memcheck/racecheck on the sm90 backward's sanitizer cases, then bwd_vs_cudnn.py.
# usage: bench/gpu/dev/sm90_bwd_loop.sh OUTDIR [gtest filter]   (filter "none": build and package only, no tests
# and no sanitizers; the profiling and benchmark loops build through it)
# DEV_HDIMS: the sm90 head dims (default "64;128"); DEV_SAN_FILTER: the sanitizers' gtest filter; DEV_PYTHON=OFF:
# no Python extension and no benchmark (a C++-only check, e.g. of the forward's load paths); DEV_TARGET: build only it;
# DEV_BWD_BENCH=0: no backward benchmark; DEV_GTEST_S: the GPU suite's timeout (default 200 s), DEV_SAN_S each
# sanitizer's (default 90 s); DEV_CMAKE_ARGS: more
# configure arguments (e.g. -DFLASHATTN_SM90_ABLATIONS=ON); DEV_FINE_UNITS=OFF: the kernel units of the full build
# (the default splits them in two: src/cuda/CMakeLists.txt, FLASHATTN_FINE_UNITS).
set -uo pipefail
OUT=$1; FILTER=${2:-'*Backward*'}
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
W=${DEV_BWD_WORK:-/tmp/dev-bwd}
mkdir -p "$W" "$OUT"
PY=$(command -v python3)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ ! -f $W/cutlass/cutlass_library/source/include/cute/tensor.hpp ]]; then
  "$PY" - "$(ls "$REPO"/.whl/nvidia_cutlass-*.whl | head -1)" "$W/cutlass" <<'PYEOF'
import sys, zipfile
p = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(p)])
PYEOF
fi
gt=()
if ! ls /usr/lib/*/cmake/GTest/GTestConfig.cmake >/dev/null 2>&1 && [[ ! -d $W/gtest ]]; then
  mkdir -p "$W/gtest-src" && tar -xzf "$(ls "$REPO"/.whl/googletest*.tar.gz | head -1)" -C "$W/gtest-src" --strip-components=1 &&
    cmake -S "$W/gtest-src" -B "$W/gtest-build" -G Ninja -DCMAKE_INSTALL_PREFIX="$W/gtest" -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null &&
    cmake --build "$W/gtest-build" >/dev/null && cmake --install "$W/gtest-build" >/dev/null
fi
[[ -d $W/gtest ]] && gt=(-DCMAKE_PREFIX_PATH="$W/gtest" -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST="$W/gtest-src")
t0=$(date +%s)
cmake -S "$REPO" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_KERNELS=ci -DFLASHATTN_SM90_HDIMS="${DEV_HDIMS:-64;128}" \
  -DFLASHATTN_CUDA_ARCHS=90a -DFLASHATTN_SM80_ARCHS=90 -DFLASHATTN_CUTLASS_DIR="$W/cutlass/cutlass_library/source/include" \
  -DFLASHATTN_PYTHON="${DEV_PYTHON:-ON}" -DPython_EXECUTABLE="$PY" -Dnanobind_DIR="$("$PY" -m nanobind --cmake_dir)" \
  -DFLASHATTN_FINE_UNITS="${DEV_FINE_UNITS:-ON}" "${gt[@]}" ${DEV_CMAKE_ARGS:-} >"$OUT/build.log" 2>&1
seen=$(cat "$W/build/.ninja_log" 2>/dev/null | wc -l)
cmake --build "$W/build" -j "$(nproc)" ${DEV_TARGET:+--target "$DEV_TARGET"} >>"$OUT/build.log" 2>&1 || { grep -m 30 -E "error" "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
# The longest units of this build (fine units, FLASHATTN_FINE_UNITS: the longest unit bounds the build on 16 cores).
tail -n +"$((seen + 1))" "$W/build/.ninja_log" | awk '!/^#/ {printf "%6.1f s %s\n", ($2 - $1) / 1000, $4}' | sort -rn | head -4
grep -E "spill|Used [0-9]+ registers" "$OUT/build.log" | sort | uniq -c | head -5
BIN=$(find "$W/build" -name 'flashattn_gpu_tests' -type f | head -1)
[[ -n $BIN ]] || BIN=$(find "$W/build" -name '*gpu*test*' -type f -executable | head -1)
if [[ $FILTER != none ]]; then
  echo "tests: $BIN"
  FLASHATTN_REQUIRE_SM90=1 timeout "${DEV_GTEST_S:-200}" "$BIN" --gtest_filter="$FILTER" >"$OUT/gtest.log" 2>&1
  echo "gtest rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" "$OUT/gtest.log" | head -40
fi
if [[ $FILTER != none && ${DEV_BWD_SANITIZE:-1} == 1 ]]; then
  for tool in memcheck racecheck; do
    timeout "${DEV_SAN_S:-90}" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" --gtest_filter="${DEV_SAN_FILTER:-Sanitizer*sm90_bwd_d64*:Sanitizer*sm90_bwd_d128*:Sanitizer*sm90_bwd_varlen_window_gqa*}" >"$OUT/san_$tool.log" 2>&1
    echo "sanitizer $tool rc $?"; grep -E "ERROR SUMMARY|Hazard|Invalid" "$OUT/san_$tool.log" | head -5
  done
fi
[[ ${DEV_PYTHON:-ON} == ON ]] || exit 0
PYROOT=$W/pyroot; rm -rf "$PYROOT"; mkdir -p "$PYROOT"; cp -r "$REPO/python/flashattn" "$PYROOT/"
find "$W/build" -name "*.cpython-*.so" -o -name "*.abi3.so" | while read -r so; do cp "$so" "$PYROOT/flashattn/"; done
if [[ -n ${DEV_BWD_NCU:-} ]]; then  # e.g. DEV_BWD_NCU="d128c4096 d64n4096": one ncu report of the main kernel per shape
  n=$(wc -w <<<"$DEV_BWD_NCU")
  PYTHONPATH=$PYROOT timeout 240 ncu --clock-control none --set full -k regex:bwd_kernel -c "$n" -f -o "$OUT/bwd_ncu" \
    "$PY" "$REPO/bench/gpu/dev/bwd_once.py" $DEV_BWD_NCU >"$OUT/ncu.log" 2>&1
  echo "ncu rc $?"; tail -3 "$OUT/ncu.log"
  ncu -i "$OUT/bwd_ncu.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
  ncu -i "$OUT/bwd_ncu.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_source.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|No Eligible" "$OUT/ncu_details.txt" | head -20
fi
[[ ${DEV_BWD_BENCH:-1} == 1 ]] || exit 0  # DEV_BWD_BENCH=0: the package only (another loop's benchmark follows)
PYTHONPATH=$PYROOT timeout ${DEV_BWD_BENCH_S:-150} "$PY" "$REPO/bench/gpu/dev/bwd_vs_cudnn.py" --csv "$OUT/bwd_dev.csv" ${DEV_BWD_BENCH_ARGS:-} >"$OUT/bwd_dev.log" 2>&1; tail -60 "$OUT/bwd_dev.log"
