#!/usr/bin/env bash
# A patch of the FP8 forward against the checkout on one card (#21): fp8_commit_ab.sh with the patched copy as its
# "old" tree, whose build also runs the FP8 GPU suite's d128 cases (the patched kernels' correctness check).
# usage: bench/gpu/dev/fp8_patch_ab.sh OUTDIR PATCH   (PATCH relative to the checkout; "old" in the table = patched)
set -uo pipefail
OUT=$1; PATCH=$2
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
COPY=/tmp/fp8-patched/$(basename "$PATCH" .patch)
rm -rf "$COPY" && mkdir -p "$COPY" "$OUT"
tar -C "$REPO" --exclude=./build --exclude=./.git -cf - . | tar -C "$COPY" -xf -
if command -v git >/dev/null 2>&1; then
  git -C "$COPY" apply --whitespace=nowarn "$REPO/$PATCH"
else
  patch -d "$COPY" -p1 --quiet <"$REPO/$PATCH"
fi || { echo "fp8_patch_ab: $PATCH does not apply"; exit 1; }
FP8AB_OLD_TESTS='Sm90/Fp8Forward.*:Fp8Forward.*' bash "$REPO/bench/gpu/dev/fp8_commit_ab.sh" "$OUT" "$COPY"
echo "patched tree's FP8 suite:"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" "$OUT/old/gtest.log" | head -20
