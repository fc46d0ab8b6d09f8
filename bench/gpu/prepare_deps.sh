#!/usr/bin/env bash
# Fills the ignored .whl/ folder (repo root) with what run.sh needs on a GPU machine that has no internet:
#   .whl/nvidia_cutlass-4.2.0.0-py3-none-any.whl  CuTe/CUTLASS headers (pure Python wheel, ~6.4 MB; run.sh
#                                                 unzips only its include tree)
#   .whl/googletest-<ver>.tar.gz                  GoogleTest source, for machines without it (~1 MB)
# Run it here (a machine with PyPI), once: bash bench/gpu/prepare_deps.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEST=$REPO/.whl
CUTLASS_VERSION=4.2.0.0  # the pin of cmake/cuda.cmake's error message
mkdir -p "$DEST"
ls "$DEST"/nvidia_cutlass-$CUTLASS_VERSION-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps "nvidia-cutlass==$CUTLASS_VERSION" -d "$DEST"
if ! ls "$DEST"/googletest-*.tar.gz >/dev/null 2>&1; then
  # Debian's libgtest-dev ships the source tree (apt-get install libgtest-dev).
  src=/usr/src/googletest
  [[ -f $src/CMakeLists.txt ]] || { echo "no $src: apt-get install libgtest-dev, or skip (C++ tests off there)"; exit 0; }
  ver=$(sed -n 's/.*GOOGLETEST_VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt" | head -1)
  tar -czf "$DEST/googletest-${ver:-src}.tar.gz" -C "$(dirname "$src")" "$(basename "$src")"
fi
du -sh "$DEST"/*
