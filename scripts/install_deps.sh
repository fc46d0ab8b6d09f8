#!/usr/bin/env bash
# Installs what building and testing flashattn needs on a fresh Debian 12 machine (run as root or with sudo).
# The CUDA toolkit itself is expected to be installed already (nvcc on PATH or at /usr/local/cuda/bin);
# without it everything still builds, CPU-only.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

need=()
for pkg in build-essential cmake ninja-build libgtest-dev ccache python3 python3-pip python3-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Debian's system Python refuses user pip installs (PEP 668) unless told otherwise.
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
PY=python3
# Python package build + tests (CPU path needs numpy and pytest only).
$PY -m pip install -q "nanobind==2.9.2" "scikit-build-core==0.11.6" numpy pytest
# The lints CI runs: ruff for Python ([tool.ruff] in pyproject.toml), clang-format for C++/CUDA (.clang-format;
# PyPI's wheel of it, pinned: its output changes between major versions).
$PY -m pip install -q "ruff==0.17.6" "clang-format==23.1.5"
# torch, for the flash_attn-compatible API's tests (tests/python/test_torch.py), which then run in CI on CPU
# tensors. PyPI has no CPU-only torch wheel for Linux: its wheel pulls the CUDA libraries as packages, about
# 5 GB on disk and about a minute to install here (an already satisfied pin costs a second or two). It works
# without a GPU. FLASHATTN_NO_TORCH=1 skips it (the torch tests are then skipped, outside CI).
if [ -z "${FLASHATTN_NO_TORCH:-}" ]; then
  $PY -m pip install -q "torch==2.15.0"
fi
# CuTe/CUTLASS headers for the CUDA kernels, pinned; header-only, found by cmake/cuda.cmake.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  $PY -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"
fi
