#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test through CTest.
# Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
scripts/setup-venv.sh  # the project venv (tokenizers, transformers, grpcio, kubernetes-validate)
/usr/bin/python3 scripts/fetch-cuda-headers.py  # CUDA 12.8's headers, for the cuda12_headers test
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j "$jobs" "$@"
