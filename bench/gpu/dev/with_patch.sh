#!/usr/bin/env bash
# Runs one of these development scripts on a copy of the checkout with a patch applied (the kept experiments of
# docs/journal/patches/), leaving the checkout as it is, so that one device call can try a patch and then another
# (each in its own copy and work folder) without a second machine start.
# usage: bench/gpu/dev/with_patch.sh PATCH SCRIPT [ARGS...]   (PATCH and SCRIPT relative to the checkout)
# e.g.   bench/gpu/dev/with_patch.sh docs/journal/patches/fwd_dropout_mask_warps.patch bench/gpu/dev/dropout_dev.sh $OUT/a
#        DEV_BWD_WORK=/tmp/dev-trace DEV_HDIMS=128 DEV_BWD_BENCH=0 DEV_CMAKE_ARGS=-DFLASHATTN_SM90_TRACE=ON \
#          bench/gpu/dev/with_patch.sh docs/journal/patches/fwd_trace.patch bench/gpu/dev/sm90_bwd_loop.sh $OUT/b none
# The copy is $WITH_PATCH_DIR/<patch name> (default /tmp/patched/...); its scripts see the copy as their checkout, so a
# script run after this one (e.g. fwd_trace.py on DEV_BWD_WORK's package) is read from there.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
PATCH=$1
SCRIPT=$2
shift 2
COPY=${WITH_PATCH_DIR:-/tmp/patched}/$(basename "$PATCH" .patch)
rm -rf "$COPY"
mkdir -p "$COPY"
# The checkout as it travelled (tracked and carried files: .whl's CUTLASS and GoogleTest), without build folders.
tar -C "$REPO" --exclude=./build --exclude=./.git -cf - . | tar -C "$COPY" -xf -
if command -v git >/dev/null 2>&1; then
  git -C "$COPY" apply --whitespace=nowarn "$REPO/$PATCH"
else
  patch -d "$COPY" -p1 --quiet <"$REPO/$PATCH"
fi
echo "with_patch: $PATCH applied in $COPY"
exec bash "$COPY/$SCRIPT" "$@"
