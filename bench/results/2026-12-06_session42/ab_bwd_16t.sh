#!/usr/bin/env bash
# Session 42 (#19): the 16-thread fp32 backward on the device host, A/B in one call. Two CLIs from copies of the tree,
# both with bwd_knobs.patch (FLASHATTN_CPU_BWD_KG: key blocks per pass; FLASHATTN_CPU_BWD_TPT: tasks per thread;
# unset = the code's defaults): "base" without and "pool" with pool.patch (the scratch cache: large blocks reused
# across calls). Rounds alternate the variants.
#   bash bench/results/2026-12-06_session42/ab_bwd_16t.sh OUT
# (from a tree at c640dc4 or 5c3876a: pool.patch is their cache, applied in reverse for "base")
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
D=$REPO/bench/results/2026-12-06_session42
mkdir -p "$OUT"
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread"; echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)";
  echo "defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"; } | tee "$OUT/host.txt"
t0=$(date +%s)
build() {  # name, extra patch args
  local src=/tmp/ab-src-$1 b=/tmp/ab-build-$1
  rm -rf "$src" && mkdir -p "$src" && (cd "$REPO" && git ls-files -z | xargs -0 cp --parents -t "$src") &&
    (cd "$src" && patch -p1 <"$D/bwd_knobs.patch" && { [[ $1 == pool ]] || patch -R -p1 <"$D/pool.patch"; }) &&
    cmake -S "$src" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=OFF -DFLASHATTN_TESTS=OFF \
      -DFLASHATTN_PYTHON=OFF && cmake --build "$b" -j 8
}
build base >/tmp/ab_build_base.log 2>&1 & pa=$!
build pool >/tmp/ab_build_pool.log 2>&1 & pb=$!
wait $pa || { tail -20 /tmp/ab_build_base.log; exit 1; }
wait $pb || { tail -20 /tmp/ab_build_pool.log; exit 1; }
grep -c scratch_take /tmp/ab-src-base/src/cpu/scratch.hpp /tmp/ab-src-pool/src/cpu/scratch.hpp
echo "builds $(( $(date +%s) - t0 )) s"
T=$OUT/ab_bwd_16t.tsv
echo -e "round\tvariant\tseqlen\tmask\tfwd_ms\tbwd_ms\tbwd_tflops" >"$T"
one() {  # round variant seqlen mask iters env...
  local r=$1 v=$2 s=$3 m=$4 it=$5; shift 5
  local bin=/tmp/ab-build-base/flashattn flag=""
  [[ $v == pool* ]] && bin=/tmp/ab-build-pool/flashattn
  [[ $m == causal ]] && flag=--causal
  local o; o=$(env "$@" "$bin" run --seqlen "$s" --heads 16 --hdim 128 --dtype fp32 $flag --bwd --threads 16 \
    --iters "$it" --backend cpu 2>&1)
  local f b bt
  f=$(awk '/^forward/{print $3}' <<<"$o"); b=$(awk '/^backward/{print $3}' <<<"$o"); bt=$(awk '/^backward/{print $5}' <<<"$o")
  echo -e "$r\t$v\t$s\t$m\t$f\t$b\t$bt" | tee -a "$T"
}
declare -A V=([base]="X=1" [pool]="X=1" [kg4]="FLASHATTN_CPU_BWD_KG=4" [tpt1]="FLASHATTN_CPU_BWD_TPT=1"
  [pool_kg4]="FLASHATTN_CPU_BWD_KG=4" [pool_tpt1]="FLASHATTN_CPU_BWD_TPT=1")
for r in 1 2 3; do
  for v in base pool pool_kg4 pool_tpt1; do
    one $r $v 1024 none 20 ${V[$v]}
    one $r $v 1024 causal 20 ${V[$v]}
    one $r $v 4096 none 4 ${V[$v]}
  done
done
for r in 1; do
  for v in base pool pool_tpt1; do one $r $v 16384 causal 1 ${V[$v]}; done
done
echo "total $(( $(date +%s) - t0 )) s"
