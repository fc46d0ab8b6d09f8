#!/usr/bin/env bash
# A decode-path patch against the checkout in one build: the small build of sm90_bwd_loop.sh (DEV_HDIMS, default
# d128) packaged as "base", then PATCH applied in place (reverted at exit), the build brought up to date (only the
# units the patch touches recompile) and packaged as "patched". On the patched build: the decode GPU cases of
# decode_dev.sh and memcheck on the split decode cases. Then decode_splits.py --profile (DEV_SPLITS, default the
# plan's pick and 16,32) on both packages, A B B A, each in its own process.
# usage: bench/gpu/dev/decode_patch_ab.sh OUTDIR PATCH     (PATCH relative to the checkout)
set -uo pipefail
OUT=$1; PATCH=$2
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-decode-ab} DEV_HDIMS=${DEV_HDIMS:-128}
W=$DEV_BWD_WORK
mkdir -p "$OUT"
DEV_BWD_BENCH=0 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/base" none || exit 1
rm -rf "$W/pyroot_base" && cp -r "$W/pyroot" "$W/pyroot_base"
(cd "$REPO" && git apply --whitespace=nowarn "$PATCH") || { echo "patch does not apply"; exit 1; }
trap '(cd "$REPO" && git apply -R --whitespace=nowarn "$PATCH")' EXIT
cases='Sm90/Forward.*packed*:Sm90/Forward.*split*:Sm90/Forward.*sinks*:GpuMerge.*:Paged*:*TileShape*'
DEV_BWD_SANITIZE=0 DEV_BWD_BENCH=0 DEV_GTEST_S=${DEV_GTEST_S:-150} bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" \
  "$OUT/patched" "$cases:-*fp16*"
rm -rf "$W/pyroot_patched" && cp -r "$W/pyroot" "$W/pyroot_patched"
BIN=$(find "$W/build" -name 'flashattn_gpu_tests' -type f | head -1)
timeout "${DEV_SAN_S:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" \
  --gtest_filter='Sm90/Forward.*split*:GpuMerge.*:-*fp16*' >"$OUT/san_memcheck.log" 2>&1
echo "sanitizer memcheck rc $?"; grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/san_memcheck.log" | head -5
for tag in base patched patched base; do
  PYTHONPATH=$W/pyroot_$tag timeout 120 python3 "$REPO/bench/gpu/dev/decode_splits.py" --profile \
    --splits "${DEV_SPLITS:-0,16,32}" >>"$OUT/decode_$tag.log" 2>&1
  echo "decode_splits $tag rc $?"
done
for tag in base patched; do echo "== $tag"; grep -v -i warn "$OUT/decode_$tag.log" | grep -E 'profile|ours|cudnn' | head -60; done
