#!/usr/bin/env bash
# Builds and installs the Python package and runs its tests (tests/python).
# CPU-only by default, so that CI (2 cores, no GPU) builds it in about a minute; FLASHATTN_CUDA=AUTO (or
# ON) builds the CUDA kernels too. Needs scikit-build-core==0.11.6, nanobind==2.9.2, numpy and pytest
# (scripts/install_deps.sh installs them, and torch). Without torch the torch tests are skipped, except
# under CI (CI=true), where the set-up installed it and FLASHATTN_REQUIRE_TORCH=1 makes its absence an error.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
export FLASHATTN_CUDA="${FLASHATTN_CUDA:-OFF}"
if [ -n "${CI:-}" ]; then export FLASHATTN_REQUIRE_TORCH="${FLASHATTN_REQUIRE_TORCH:-1}"; fi
start=$(date +%s)
"$PY" -m pip install -q --no-build-isolation --no-deps .
echo "python package built and installed in $(( $(date +%s) - start )) s (FLASHATTN_CUDA=$FLASHATTN_CUDA)"
# The source tree's python/ is not on sys.path: the tests import the installed package.
"$PY" -m pytest tests/python -q -rs
