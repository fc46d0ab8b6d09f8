#!/usr/bin/env bash
# Where the short calls' time goes, in one device call: the small build of sm90_bwd_loop.sh (ci kernels, sm90
# d64/d128, the Python package; no tests), then each kernel's CUDA time per call (torch.profiler) beside the call's
# time, for ours and cuDNN: the backward at short sequences (preprocess, main kernel, dQ conversion) and decode
# (main kernel, split-KV combine), with decode also timed through cuDNN on the caches' own layout. The backward's
# main-kernel times are then split into a per-step and a per-CTA part (bwd_cta_fit.py).
# usage: bench/gpu/dev/profile_dev.sh OUTDIR   (DEV_SEQLENS: the backward's lengths, default 512,1024,16384)
# DEV_DECODE_NCU="1x65536 32x8192": also one ncu report (--set full) per decode shape of our main kernel and combine
# and cuDNN's (decode_once.py makes each call twice and ncu reports both: the second is the warm one), with their
# headline metrics printed (ncu_decode_details.txt has the rest).
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-bwd} DEV_HDIMS=${DEV_HDIMS:-64;128}
DEV_BWD_BENCH=0 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" none
cd "$REPO/bench/gpu/dev" || exit 1
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 200 python3 bwd_vs_cudnn.py --csv "$OUT/bwd_profile.csv" --profile \
  --hdims 64,128 --seqlens "${DEV_SEQLENS:-512,1024,16384}" >"$OUT/bwd_profile.log" 2>&1
echo "bwd_vs_cudnn rc $?"; grep -E "profile" "$OUT/bwd_profile.log" | head -80
python3 bwd_cta_fit.py "$OUT/bwd_profile.log"  # the main kernel's per-step and per-CTA times
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 120 python3 decode_splits.py --splits 0 --profile --cudnn-bshd \
  --csv "$OUT/decode_profile.csv" >"$OUT/decode_profile.log" 2>&1
echo "decode_splits rc $?"; cat "$OUT/decode_profile.log"
if [[ -n ${DEV_DECODE_NCU:-} ]]; then
  n=$(wc -w <<<"$DEV_DECODE_NCU")
  # Per shape: ours (main kernel, + combine when split) and cuDNN (main, + reduction), each call twice.
  PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 300 ncu --clock-control none --set full \
    -k regex:'fwd_kernel|split_combine|flash_fprop|lean_reduction' -f -o "$OUT/decode_ncu" \
    python3 decode_once.py $DEV_DECODE_NCU >"$OUT/ncu_decode.log" 2>&1
  echo "decode ncu rc $? ($n shapes)"; tail -3 "$OUT/ncu_decode.log"
  ncu -i "$OUT/decode_ncu.ncu-rep" --page details >"$OUT/ncu_decode_details.txt" 2>&1
  grep -E "^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Waves Per SM|Grid Size|Dynamic Shared" \
    "$OUT/ncu_decode_details.txt" | head -120
fi
