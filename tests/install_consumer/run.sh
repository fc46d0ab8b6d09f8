#!/usr/bin/env bash
# Installs an already-built flashattn tree into a scratch prefix, builds this consumer project against it with
# find_package(flashattn) and runs it (CPU tensors, so it needs no GPU).
#   tests/install_consumer/run.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
build="$(cd "${1:-build}" && pwd)"
work="$build/install-consumer"
start=$(date +%s)
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" --component flashattn_dev >/dev/null
# Only the installed prefix is on the search path: nothing of the source or build tree is visible to the consumer.
cmake -S tests/install_consumer -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
echo "install consumer: installed, configured with find_package(flashattn), built and run in $(( $(date +%s) - start )) s"
