#!/bin/bash
# Builds libsm80_tiles.so (sm_90a, like the H200 build) into $1 (default: build-sm80-tiles). ~2-3 min per unit.
# ONLY="unit ..." rebuilds just those units (the others' objects are reused when present).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
SRC=${SRC_ROOT:-$ROOT}  # SRC_ROOT: another source tree (e.g. a patched copy) to build the variants from
OUT=${1:-$ROOT/build-sm80-tiles}
mkdir -p "$OUT"
CUTLASS=${CUTLASS_INCLUDE:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source/include"))')}
FLAGS="-I$SRC/include -I$SRC/src -isystem=$CUTLASS -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -Xcompiler=-fPIC
       -gencode arch=compute_90a,code=sm_90a -Xptxas -v"
pids=()
for f in "$HERE"/*.cu; do
  n=$(basename "$f" .cu)
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $n "* ]] && [ -f "$OUT/$n.o" ]; then continue; fi
  (nvcc $FLAGS -c "$f" -o "$OUT/$n.o" 2> "$OUT/$n.ptxas.log" || { cat "$OUT/$n.ptxas.log"; exit 1; }) &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do sleep 2; done
done
for p in "${pids[@]}"; do wait "$p"; done
# -Bsymbolic: each library binds its own kernels, so that two of them (an A/B) can be loaded in one process.
nvcc -shared -Xlinker -Bsymbolic -o "$OUT/libsm80_tiles.so" "$OUT"/*.o -lcudart
grep -h -E "Compiling entry|spill|registers" "$OUT"/*.ptxas.log | grep -B2 "registers" | grep -E "fwd_kernel|dkdv_kernel|spill|registers" > "$OUT/ptxas_summary.txt" || true
echo "built $OUT/libsm80_tiles.so"
