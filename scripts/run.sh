#!/usr/bin/env bash
# The main job, on a fresh machine or again: builds the adjsh binary alone (installing the
# missing build packages; about 3 minutes the first time on 2 cores, with a line per stage and
# the build's progress), then trains a byte-level Mamba LM (D=128, K=4) on a local cluster (a
# coordinator and 2 worker processes on loopback) on the built-in corpus (the license texts
# every Debian machine has, /usr/share/common-licenses) with 16K-token sequences and the exact
# adjoint-sharded gradient, 40 steps, checkpointing to build/run/ckpt. Each run starts afresh.
#   scripts/run.sh [adjsh train flags...]      e.g. scripts/run.sh --steps 20 --chunk 512
set -euo pipefail
cd "$(dirname "$0")/.."
ADJSH_DEPS=build scripts/build.sh --target adjsh
run=build/run
rm -rf "$run/ckpt"
mkdir -p "$run"
echo "run: training on a local cluster (adjsh train --workers 2 --steps 40; flags: $*)" >&2
build/cli/adjsh train --workers 2 --steps 40 --checkpoint-dir "$run/ckpt" "$@"
if [ -f "$run/ckpt/latest" ]; then
  echo "model and optimizer state: $run/ckpt/$(cat "$run/ckpt/latest")"
fi
