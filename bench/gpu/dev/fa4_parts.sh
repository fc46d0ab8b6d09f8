#!/usr/bin/env bash
# FlashAttention-4 (PyPI flash-attn-4) onto the GPU machine in three calls. The device tool carries 64 MiB a call,
# the checkout and .whl take about 21 MB of it, and FA4 with its compiler is 100 MB, so it travels in three parts
# (DIR/a and DIR/b: the compiler wheel's halves, DIR/c: the other wheels), each call within the warm window of the
# one before. DIR is ignored by git (/.peers/ in .git/info/exclude), so each call carries its part.
#   here, once:  bash ../shared/peers/fetch_fa4.sh .peers/fa4 && bash bench/gpu/dev/fa4_parts.sh split .peers/fa4
#   call 1 (carry .peers/fa4/a):  bash bench/gpu/dev/fa4_parts.sh stash .peers/fa4
#   call 2 (carry .peers/fa4/b):  bash bench/gpu/dev/fa4_parts.sh stash .peers/fa4
#   call 3 (carry .peers/fa4/c and what the command needs):  eval "$(bash bench/gpu/dev/fa4_parts.sh install .peers/fa4)"
# install unpacks every wheel into SITE (default /tmp/fa4site) with zipfile (several share the nvidia_cutlass_dsl
# folder, which pip --target would not merge) and prints the PYTHONPATH export.
set -euo pipefail
mode=$1; DIR=$2; SITE=${3:-/tmp/fa4site}; STASH=/root/fa4
case $mode in
  split)
    mkdir -p "$DIR/c"
    for w in "$DIR"/b/*.whl; do [[ -e $w ]] && mv "$w" "$DIR/c/"; done
    du -sh "$DIR"/a "$DIR"/b "$DIR"/c
    ;;
  stash | install)
    mkdir -p "$STASH"
    for part in a b c; do [[ -d $DIR/$part ]] && cp "$DIR/$part"/* "$STASH"/; done
    if [[ $mode == stash ]]; then echo "# stashed: $(ls "$STASH" | tr '\n' ' ')" >&2; exit 0; fi
    cd "$STASH"
    name=$(cat libs_cu13.name)
    cat libs_cu13.part00 libs_cu13.part01 >"$name"
    [[ $(sha256sum "$name" | awk '{print $1}') == $(cat libs_cu13.sha256) ]] ||
      { echo "# FA4: checksum mismatch (a part is missing?)" >&2; exit 1; }
    rm -rf "$SITE" && mkdir -p "$SITE"
    for w in "$STASH"/*.whl; do python3 -m zipfile -e "$w" "$SITE"; done
    echo "export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
    ;;
  *) echo "usage: $0 split|stash|install DIR [SITE]" >&2; exit 2 ;;
esac
