#!/usr/bin/env bash
# Installs missing system packages, then configures and builds adjsh into build/ (incremental;
# safe to run again). Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build build -j "$jobs"
