#!/usr/bin/env bash
# Builds flashattn and runs the fast test tier (C++ via CTest, the install consumer (tests/install_consumer),
# Python CPU tests via pytest).
#   scripts/run_tests.sh            fast tier
#   scripts/run_tests.sh --deep     fast + deep tiers
# Under CI (CI=true) the CUDA kernels are compiled as one translation unit per kernel family, which proves
# every family compiles within CI's time; the full set is built and run on the GPU machine (bench/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
labels="fast"
if [ "${1:-}" = "--deep" ]; then
  labels="fast|deep"
  export FA_FUZZ_PY_CASES="${FA_FUZZ_PY_CASES:-2000}"  # the Python fuzz slice of the deep tier
fi
jobs=$(nproc)

if [ -z "${FLASHATTN_SKIP_DEPS:-}" ]; then scripts/install_deps.sh; fi
if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

# Lint first (seconds): the Python sources (python/, tests/python/, bench/) against [tool.ruff] in pyproject.toml.
# Required under CI; elsewhere skipped with a note when ruff is not installed.
if python3 -m ruff --version >/dev/null 2>&1; then
  python3 -m ruff check .
elif [ -n "${CI:-}" ]; then
  echo "ruff is not installed (scripts/install_deps.sh installs it)" >&2; exit 1
else
  echo "ruff not installed: lint skipped (pip install ruff==0.17.6)"
fi

# The C++/CUDA sources against .clang-format: same rule. (Hand-aligned case tables in the tests sit between
# `// clang-format off` and `// clang-format on`.)
cxx_sources() { find src include tools python/src tests bench -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort; }
if command -v clang-format >/dev/null 2>&1 && [ "$(clang-format --version | grep -oE '[0-9]+' | head -1)" = 23 ]; then
  cxx_sources | xargs clang-format --dry-run --Werror
elif [ -n "${CI:-}" ]; then
  echo "clang-format 23 is not installed (scripts/install_deps.sh installs it)" >&2; exit 1
else
  echo "clang-format 23 not installed: C++ format check skipped (pip install clang-format==23.1.5)"
fi

kernels="${FLASHATTN_KERNELS:-default}"
if [ -n "${CI:-}" ]; then kernels=ci; fi
cmake -S . -B build -G Ninja -DFLASHATTN_KERNELS="$kernels" >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest -L "$labels" -j "$jobs" --output-on-failure --timeout 900)
# The library as a newcomer's CMake project gets it: cmake --install, find_package(flashattn), a C ABI call on CPU.
tests/install_consumer/run.sh build

if [ -f pyproject.toml ] && [ -d tests/python ]; then
  scripts/python_tests.sh
fi
