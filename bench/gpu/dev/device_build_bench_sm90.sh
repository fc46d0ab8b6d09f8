#!/bin/bash
# One device call for sm90 forward tuning when the local machine is too slow to build: builds the C ABI library on
# the GPU machine's cores (default kernel set + the sm90 ablation variants), times cuda-sm90 and cuda-sm80 next to
# torch SDPA flash (FA2) and cuDNN, then each ablation variant of the bf16 d128 kernel (FLASHATTN_SM90_MECHANISMS).
# Needs .whl/nvidia_cutlass-*.whl carried (bench/gpu/prepare_deps.sh). Usage: device_build_bench_sm90.sh OUT [seqlen ...]
O=$1; shift
SEQLENS=${*:-2048 8192 16384}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
W=/tmp/fa_dev; mkdir -p $W
t0=$(date +%s)
python3 - .whl/nvidia_cutlass-*.whl $W/cut <<'PY'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(prefix)])
PY
cmake -S . -B $W/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_KERNELS=default -DFLASHATTN_CUDA_ARCHS=90a \
  -DFLASHATTN_SM80_ARCHS=90 -DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_TESTS=OFF -DFLASHATTN_CLI=OFF \
  -DFLASHATTN_CUTLASS_DIR=$W/cut/cutlass_library/source/include > $O/build.log 2>&1
ninja -C $W/b -j$(nproc) flashattn_capi >> $O/build.log 2>&1 || { echo BUILD FAILED; grep -m5 error $O/build.log; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
L=$(find $W/b -name libflashattn_capi.so | head -1)
cuobjdump -res-usage "$L" 2>/dev/null | grep -A1 "sm90.*fwd_kernel" | grep -oE "REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+" | paste -sd' ' | head -c 1500; echo
timeout 200 python3 bench/gpu/dev/bench_fwd.py "$L" $SEQLENS --backends sm90,sm80 > "$O/bench_fwd.tsv" 2>&1
echo "== bench rc=$?"; grep -v "^#" "$O/bench_fwd.tsv"
for v in default no_pingpong no_overlap not_persistent stages1 block_k128 no_pingpong_no_overlap; do
  FLASHATTN_SM90_MECHANISMS=$v timeout 60 python3 bench/gpu/dev/bench_fwd.py "$L" $SEQLENS --hdims 128 --ours-only \
    --backends sm90 2>&1 | grep -v "^#" | grep -v "^backend" | sed "s/^sm90/$v/"
done | tee "$O/ablation.tsv"
