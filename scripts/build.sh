#!/usr/bin/env bash
# Installs missing system packages, then configures and builds adjsh into build/ (incremental;
# safe to run again), printing a line per stage and the build's own [done/total] progress.
#   scripts/build.sh                       everything: the adjsh binary, benchmarks and tests
#   scripts/build.sh --target adjsh        only what that target needs (scripts/run.sh does this)
#   scripts/build.sh [--target T ...] [CMAKE_CONFIGURE_ARGS...]
# The first full build takes about 10 minutes on 2 cores, the adjsh binary alone about 3.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
names=()
configure=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target)
      [ $# -ge 2 ] || { echo "build.sh: --target needs a target name" >&2; exit 2; }
      targets+=(--target "$2"); names+=("$2"); shift 2 ;;
    -h|--help)
      sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) configure+=("$1"); shift ;;
  esac
done
what="everything"
[ ${#names[@]} -eq 0 ] || what="${names[*]}"
echo "build: [1/3] checking system packages (scripts/install-deps.sh)" >&2
scripts/install-deps.sh
if [ ! -f build/build.ninja ]; then
  echo "build: [2/3] configuring build/ (CMake, Release)" >&2
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${configure[@]}" >&2
else
  echo "build: [2/3] build/ is configured" >&2
fi
jobs=$(nproc 2>/dev/null || echo 2)
echo "build: [3/3] building $what with $jobs jobs (a first build takes minutes: about 3 for" \
     "adjsh alone, 10 for everything on 2 cores; an up-to-date tree, seconds)" >&2
start=$SECONDS
cmake --build build -j "$jobs" "${targets[@]}" >&2
echo "build: done in $((SECONDS - start)) s" >&2
