#!/usr/bin/env bash
# The main job, on a fresh machine or again: builds adjsh, makes a model and a long token
# sequence from the built-in corpus (the license texts every Debian machine has), and computes
# the exact gradient of the whole sequence by adjoint sharding on all cores, then the same with
# a truncated window, reporting loss, speed and memory.
#   scripts/run.sh [T]        T: sequence length in tokens (default 65536)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-65536}
scripts/build.sh >/dev/null
work=${ADJSH_WORK:-build/run}
mkdir -p "$work"
adjsh=build/cli/adjsh
echo "== model: D=256, K=4, N=16, byte vocabulary (V=256)"
[ -f "$work/model/config.json" ] ||
  "$adjsh" init --out "$work/model" --hidden-size 256 --layers 4 --vocab-size 256 --seed 1
echo "== corpus: /usr/share/common-licenses as bytes, $T tokens"
corpus=$(find /usr/share/common-licenses -maxdepth 1 -type f | sort | paste -sd, -)
"$adjsh" tokenize --text "$corpus" --out "$work/corpus.u16" --length "$T"
echo "== exact gradient (adjoint sharding over (layer, chunk) tasks)"
"$adjsh" grad --model "$work/model" --tokens "$work/corpus.u16" --out "$work/grad.safetensors"
echo "== truncated adjoint, window 1024"
"$adjsh" grad --model "$work/model" --tokens "$work/corpus.u16" --out "$work/grad_w1024.safetensors" \
  --window 1024
echo "gradients written to $work/"
