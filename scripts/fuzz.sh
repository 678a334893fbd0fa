#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang under ASan and UBSan (into build-fuzz/, apart
# from the g++ build/) and runs each for a while, starting from its seed corpus
# fuzz/corpus/<target>/, with the dictionary fuzz/dict/<target>.dict where there is one. New
# interesting inputs go to BUILD_DIR/corpus/<target>/; a crash is written to
# BUILD_DIR/artifacts/<target>/ and makes the script exit 1 (add the input under
# tests/fuzz/<target>/, where the replay tests of the normal build pick it up, and fix it).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/fuzz.sh [--minutes N | --seconds N] [--build-dir DIR] [target...]
  targets: safetensors config job_spec tensor_codec (default: all), each run N minutes
  (default 1) one after the other. Needs clang and libclang-rt (scripts/install-deps.sh).
USAGE
}

seconds=60
build_dir=build-fuzz
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) [ $# -ge 2 ] || { usage >&2; exit 2; }; seconds=$(( $2 * 60 )); shift 2 ;;
    --seconds) [ $# -ge 2 ] || { usage >&2; exit 2; }; seconds=$2; shift 2 ;;
    --build-dir) [ $# -ge 2 ] || { usage >&2; exit 2; }; build_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(safetensors config job_spec tensor_codec)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  case " ${all[*]} " in *" $t "*) ;; *) echo "fuzz.sh: unknown target '$t' (${all[*]})" >&2; exit 2 ;; esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "fuzz.sh: the run time must be a positive whole number" >&2; exit 2
fi
if ! command -v clang++ >/dev/null || ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang not found (scripts/install-deps.sh installs it)" >&2; exit 1
fi

if [ ! -f "$build_dir/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DADJSH_FUZZ=ON -DADJSH_NATIVE=OFF >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]/#/fuzz_}"

status=0
for t in "${targets[@]}"; do
  mkdir -p "$build_dir/corpus/$t" "$build_dir/artifacts/$t"
  log="$build_dir/fuzz-$t.log"
  echo "fuzz.sh: $t for ${seconds} s" >&2
  dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=(-dict="fuzz/dict/$t.dict")
  if "$build_dir/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/$t/" \
      "${dict[@]}" "$build_dir/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    echo "fuzz.sh: $t: ${runs:-?} runs in ${seconds} s, no crash" >&2
  else
    status=1
    echo "fuzz.sh: $t: CRASH, input in $build_dir/artifacts/$t/; log:" >&2
    grep -E 'ERROR|SUMMARY|fuzz property failed|check failed|runtime error' "$log" | head -20 >&2 || true
  fi
done
exit $status
