#!/usr/bin/env bash
# Backward A/B of several source trees in one process: each tree's libflashattn_capi.so built with the small
# configuration of sm90_bwd_loop.sh (ci kernels + the sm90 head dims of DEV_HDIMS, default 64), then bench_bwd.py
# timing every library beside FA2 and cuDNN on the same inputs, twice, the second time in the reverse order.
# usage: bench/gpu/dev/bwd_ab.sh OUTDIR TREE:TAG [TREE:TAG ...]   (TREE: a source tree, "." for this one, or a
# libflashattn_capi.so already built, e.g. by sm90_bwd_loop.sh in the call before)
# DEV_AB_HDIMS: the benchmarks' --hdims (default 64); DEV_AB_SEQLENS (default 512 1024 2048 4096 8192 16384);
# DEV_AB_BENCH: which of bench_bwd.py / bench_fwd.py time the libraries (default "bwd"; "fwd", "fwd bwd").
set -uo pipefail
OUT=$1; shift
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
libs=()
for spec in "$@"; do
  tree=${spec%%:*}; tag=${spec#*:}
  if [[ $tree == *.so ]]; then
    [[ -f $tree ]] && libs+=("$tree:$tag") || echo "$tag: no library at $tree"
    continue
  fi
  [[ $tree == /* ]] || tree=$REPO/$tree
  mkdir -p "$tree/.whl" && cp -n "$REPO"/.whl/* "$tree/.whl/" 2>/dev/null
  t0=$(date +%s)
  DEV_BWD_WORK=/tmp/dev-ab-$tag DEV_HDIMS=${DEV_HDIMS:-64} DEV_PYTHON=OFF DEV_TARGET=flashattn_capi DEV_BWD_SANITIZE=0 \
    DEV_GTEST_S=1 bash "$tree/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/build_$tag" >/dev/null 2>&1
  so=$(find /tmp/dev-ab-$tag/build -name 'libflashattn_capi.so' | head -1)
  echo "$tag: build $(( $(date +%s) - t0 )) s, ${so:-NO LIBRARY}"; grep -m 5 -E "error" "$OUT/build_$tag/build.log"
  [[ -n $so ]] && libs+=("$so:$tag")
done
rev=(); for ((i = ${#libs[@]} - 1; i >= 0; i--)); do rev+=("${libs[i]}"); done
cd "$REPO/bench/gpu/dev" || exit 1
for bench in ${DEV_AB_BENCH:-bwd}; do
  for order in fwd rev; do
    if [[ $order == fwd ]]; then set -- "${libs[@]}"; else set -- "${rev[@]}"; fi
    f=$OUT/ab_$order.tsv; [[ $bench == bwd ]] || f=$OUT/ab_${bench}_$order.tsv
    timeout 200 python3 "bench_$bench.py" "$@" --hdims "${DEV_AB_HDIMS:-64}" \
      ${DEV_AB_SEQLENS:-512 1024 2048 4096 8192 16384} >"$f" 2>&1
    echo "$bench order $order rc $?"
  done
done
