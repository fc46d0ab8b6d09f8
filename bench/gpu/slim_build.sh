#!/usr/bin/env bash
# Copies of a build folder only what run.sh --build-dir uses (executables, shared objects and Python
# modules, CMakeCache.txt, the CTest files), so that it fits the device tool's 64 MiB carry limit.
# usage: bash bench/gpu/slim_build.sh BUILD DEST
set -euo pipefail
[[ $# -eq 2 && -f $1/CMakeCache.txt ]] || { echo "usage: $0 BUILD DEST (BUILD holds CMakeCache.txt)"; exit 2; }
src=$(cd "$1" && pwd)
rm -rf "$2"; mkdir -p "$2"; dest=$(cd "$2" && pwd)
cd "$src"
# CMakeFiles/ holds objects and the compiler probes; nothing there is run.
find . -path '*/CMakeFiles' -prune -o -type f \( -name CMakeCache.txt -o -name CTestTestfile.cmake \
  -o -name '*_include.cmake' -o -name '*_tests.cmake' -o -name '*.so' -o -name '*.so.*' \
  -o \( -perm -u+x ! -name '*.sh' \) \) -print | tar -cf - -T - | tar -xf - -C "$dest"
du -sh "$dest"
