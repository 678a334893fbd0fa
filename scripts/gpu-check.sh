#!/usr/bin/env bash
# The GPU check: CUDA-against-CPU tests, then the GPU benchmarks, then a correctness, timing and
# memory report in Markdown, ready to paste into docs/BENCHMARKS.md. Unattended; budgeted for
# about 8 minutes on one H200 with 16 cores (every step has its own time limit).
#
#   scripts/gpu-check.sh [REPORT.md]     on a GPU machine (default report: gpu-check.md, raw
#                                        logs in gpu-check-logs/). Uses gpu-bundle.tar.xz when it
#                                        is there, else builds into build-gpu/ (Release, CUDA on).
#   scripts/gpu-check.sh --bundle        on any machine with the CUDA toolkit and adjsh's build
#                                        packages, no GPU needed: builds the binaries the check
#                                        runs (sm_80 and sm_90, portable CPU code) with every
#                                        shared library they need but glibc's, into
#                                        gpu-bundle.tar.xz, for a GPU machine with no package
#                                        mirror (carry the file there).
#   scripts/gpu-check.sh --rehearse --prebuilt DIR [REPORT.md]
#                                        without a GPU: every step with binaries from DIR (a
#                                        build tree, or an unpacked bundle), to check the script,
#                                        the binaries' flags and the report (GPU steps fail,
#                                        each with its reason).
#   --logs DIR                           raw logs there instead of gpu-check-logs/
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
mode=check rehearse=0 prebuilt="" report=gpu-check.md logs=gpu-check-logs
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) mode=bundle ;;
    --rehearse) rehearse=1 ;;
    --prebuilt)
      [ $# -ge 2 ] || { echo "gpu-check: --prebuilt needs a directory" >&2; exit 2; }
      prebuilt=$2; shift ;;
    --logs)
      [ $# -ge 2 ] || { echo "gpu-check: --logs needs a directory" >&2; exit 2; }
      logs=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) report=$1 ;;
  esac
  shift
done

start=$(date +%s)
step() { echo "== $(($(date +%s) - start)) s: $*" >&2; }
jobs=$(nproc 2>/dev/null || echo 4)
# What the check runs, by its path in a build tree (a bundle keeps the file names in bin/).
targets=(cli/adjsh tests/cuda/cuda_backend_test tests/kernels/kernels_test bench/grad_bench
         bench/cuda_scan_bench)

# configure_and_build DIR ARCHS [CMAKE ARGS...]
configure_and_build() {
  local dir=$1 arch=$2
  shift 2
  if ! timeout 300 cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DADJSH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" "$@" >"$logs/configure.txt" 2>&1; then
    tail -30 "$logs/configure.txt" >&2
    echo "gpu-check: configure failed" >&2
    return 1
  fi
  if ! grep -q "adjsh CUDA backend: ON" "$logs/configure.txt"; then
    echo "gpu-check: CMake did not enable CUDA (no nvcc found?)" >&2
    return 1
  fi
  if ! timeout 1800 cmake --build "$dir" -j "$jobs" --target "${targets[@]##*/}" \
      >"$logs/build.txt" 2>&1; then
    tail -40 "$logs/build.txt" >&2
    echo "gpu-check: build failed" >&2
    return 1
  fi
}

if [ "$mode" = bundle ]; then
  logs=gpu-bundle-logs
  rm -rf "$logs" && mkdir -p "$logs"
  step "install the build packages, configure and build into build-bundle/ (sm_80, sm_90)"
  ADJSH_DEPS=build scripts/install-deps.sh || exit 1
  # The binaries look for their libraries in ../lib first (DT_RPATH, which also covers the
  # libraries' own dependencies), so nothing on the GPU machine needs LD_LIBRARY_PATH.
  configure_and_build build-bundle "80;90" -DADJSH_NATIVE=OFF '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags || exit 1
  step "pack"
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/gpu-bundle/bin" "$stage/gpu-bundle/lib"
  for t in "${targets[@]}"; do
    strip -o "$stage/gpu-bundle/bin/${t##*/}" "build-bundle/$t" || exit 1
  done
  # Every shared library but glibc's own (which the GPU machine has, at least as new).
  glibc='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libutil|libresolv)\.so'
  for t in "${targets[@]}"; do ldd "build-bundle/$t"; done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
    sort -u | while read -r name path; do
      [[ "$name" =~ $glibc ]] && continue
      cp -L "$path" "$stage/gpu-bundle/lib/$name" || exit 1
    done || exit 1
  # Self-contained: from the bundle, every library resolves inside it or to glibc.
  for b in "$stage"/gpu-bundle/bin/*; do
    outside=$(ldd "$b" | awk '$2 == "=>" { print $1, $3 }' |
      grep -v " $stage/gpu-bundle/" | grep -Ev "$glibc" || true)
    if [ -n "$outside" ]; then
      echo "gpu-check: $(basename "$b") resolves libraries outside the bundle: $outside" >&2
      exit 1
    fi
  done
  "$stage/gpu-bundle/bin/adjsh" --help >/dev/null || { echo "gpu-check: bundled adjsh does not run" >&2; exit 1; }
  { echo "revision: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "cuda: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo unknown), sm_80 sm_90"
  } >"$stage/gpu-bundle/BUNDLE.txt"
  tar -C "$stage" -cf - gpu-bundle | xz -6 -T "$jobs" >gpu-bundle.tar.xz.tmp &&
    mv gpu-bundle.tar.xz.tmp gpu-bundle.tar.xz || exit 1
  cat "$stage/gpu-bundle/BUNDLE.txt" >&2
  echo "gpu-check: gpu-bundle.tar.xz, $(du -k gpu-bundle.tar.xz | cut -f1) KiB; on the GPU machine: scripts/gpu-check.sh" >&2
  exit 0
fi

rm -rf "$logs" && mkdir -p "$logs"
if nvidia-smi -L >"$logs/nvidia-smi.txt" 2>&1; then
  [ "$rehearse" = 1 ] && echo "gpu-check: --rehearse on a machine with a GPU: running the real check" >&2
elif [ "$rehearse" = 1 ]; then
  echo "rehearsal without a GPU on $(hostname)" >"$logs/nvidia-smi.txt"
else
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L failed): nothing to check (--rehearse runs the steps anyway)" >&2
  exit 1
fi
cat "$logs/nvidia-smi.txt" >&2

# Where the binaries are: --prebuilt, else the bundle, else a build here.
binaries="build-gpu (built here)"
if [ -z "$prebuilt" ] && [ -f gpu-bundle.tar.xz ]; then
  step "unpack gpu-bundle.tar.xz"
  rm -rf gpu-bundle && tar -xJf gpu-bundle.tar.xz || { echo "gpu-check: cannot unpack gpu-bundle.tar.xz" >&2; exit 1; }
  prebuilt=gpu-bundle
fi
if [ -n "$prebuilt" ]; then
  [ -d "$prebuilt" ] || { echo "gpu-check: --prebuilt $prebuilt: no such directory" >&2; exit 1; }
  binaries="$prebuilt"
  [ -f "$prebuilt/BUNDLE.txt" ] && binaries="$prebuilt: $(tr '\n' ' ' <"$prebuilt/BUNDLE.txt")"
else
  step "configure and build (Release, CUDA on, this GPU's architecture)"
  # Missing packages are installed when the machine can reach its package mirror.
  timeout 180 scripts/install-deps.sh >"$logs/install-deps.txt" 2>&1 ||
    echo "gpu-check: install-deps failed (see $logs/install-deps.txt); trying with what is installed" >&2
  arch=native
  if ! cmake --version | awk 'NR==1 { split($3, v, "."); exit !(v[1] > 3 || (v[1] == 3 && v[2] >= 24)) }'; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
  fi
  configure_and_build build-gpu "$arch" || exit 1
  prebuilt=build-gpu
fi
# bin NAME: the binary's path, in a build tree or a bundle.
bin() {
  local t
  for t in "${targets[@]}"; do
    if [ "${t##*/}" = "$1" ]; then
      if [ -x "$prebuilt/$t" ]; then echo "$prebuilt/$t"; else echo "$prebuilt/bin/$1"; fi
      return
    fi
  done
}
for t in "${targets[@]}"; do
  [ -x "$(bin "${t##*/}")" ] || { echo "gpu-check: $(bin "${t##*/}") is missing" >&2; exit 1; }
done

# cuBLAS is loaded at first use: where the loader does not know it, its folder is named here:
# the toolkit's, or a pip wheel's (CUDA 12 wheels: nvidia/cublas/lib; CUDA 13: nvidia/cu13/lib).
cublas_dir=""
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13 '; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
      $(python3 -c 'import nvidia, os; print(*[os.path.join(p, s) for p in nvidia.__path__ for s in ("cu13/lib", "cublas/lib")])' 2>/dev/null); do
    if [ -e "$d/libcublas.so.13" ]; then
      cublas_dir=$d
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi
if [ -z "$cublas_dir" ]; then
  cublas_dir="the loader path: $(ldconfig -p 2>/dev/null | grep -m1 'libcublas\.so\.13 ' | sed 's/.*=> //')"
fi
echo "gpu-check: libcublas.so.13 from $cublas_dir" >&2
# Python: the tests and the report need only the standard library; the baseline needs torch
# with CUDA, from whichever interpreter has it.
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
torch_py=""
for p in $(command -v python3) /usr/bin/python3; do
  if "$p" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    torch_py=$p; break
  fi
done

step "tests: CUDA against CPU f64 and the oracle; backend selection"
timeout 300 "$(bin cuda_backend_test)" >"$logs/cuda_tests.txt" 2>&1
cuda_rc=$?
timeout 120 "$(bin kernels_test)" --gtest_filter='ParseDevice*:Backend*' >"$logs/backend_tests.txt" 2>&1
backend_rc=$?
timeout 300 "$py" tests/cli/test_device.py --adjsh "$(bin adjsh)" >"$logs/cli_device.txt" 2>&1
cli_rc=$?
tail -5 "$logs/cuda_tests.txt" >&2

# failed ERR_FILE KEY VALUE...: a JSON line for a step that failed, with its reason: the first
# line of its stderr when it was told its usage, else the last.
failed() {
  local err=$1; shift
  local why pick=tail
  grep -q '^usage:' "$err" 2>/dev/null && pick=head
  why=$(grep -v '^\s*$' "$err" 2>/dev/null | $pick -1 | tr -d '"\\' | cut -c1-200)
  echo "{$(printf '"%s": %s, ' "$@")\"failed\": true, \"why\": \"${why:-no output}\"}"
}

step "scan kernels: effective bandwidth against cudaMemcpy device to device"
for storage in f32 bf16; do
  timeout 60 "$(bin cuda_scan_bench)" --len 2048 --inner 1536 --state 16 --storage "$storage" \
    >>"$logs/scan.jsonl" 2>"$logs/scan.err" ||
    failed "$logs/scan.err" storage "\"$storage\"" >>"$logs/scan.jsonl"
done

step "device memory per worker against T (D=768, K=2, chunk 2048)"
for T in 65536 262144 1048576 4194304; do
  timeout 150 "$(bin grad_bench)" --device cuda:0 --hidden-size 768 --layers 2 \
    --vocab-size 256 --chunk 2048 --tokens "$T" --threads "$jobs" \
    >>"$logs/memory.jsonl" 2>"$logs/memory.err" ||
    failed "$logs/memory.err" tokens "$T" >>"$logs/memory.jsonl"
done

step "full gradient tokens/s, D=768 K=24 V=50280 (adjsh on cuda:0; PyTorch autograd on cuda)"
for T in 4096 16384; do
  for storage in full bf16; do
    timeout 120 "$(bin grad_bench)" --device cuda:0 --storage "$storage" \
      --hidden-size 768 --layers 24 --vocab-size 50280 --chunk 2048 --tokens "$T" \
      --threads "$jobs" --repeat 2 >>"$logs/tokens.jsonl" 2>"$logs/tokens.err" ||
      failed "$logs/tokens.err" tokens "$T" storage "\"$storage\"" >>"$logs/tokens.jsonl"
  done
done
if [ -n "$torch_py" ]; then
  timeout 240 "$torch_py" bench/torch_baseline.py --device cuda --hidden-size 768 \
    --layers 24 --vocab-size 50280 --state-size 16 --tokens 4096 --warmup-tokens 64 \
    >"$logs/torch.json" 2>"$logs/torch.err" || failed "$logs/torch.err" tokens 4096 >"$logs/torch.json"
else
  echo '{"unavailable": "no python3 here imports torch with CUDA available"}' >"$logs/torch.json"
fi

step "report"
"$py" bench/gpu_report.py --logs "$logs" --cuda-tests-rc "$cuda_rc" \
  --backend-tests-rc "$backend_rc" --cli-tests-rc "$cli_rc" --binaries "$binaries" \
  --seconds $(($(date +%s) - start)) >"$report" || { echo "gpu-check: the report failed" >&2; exit 1; }
cat "$report"
echo "gpu-check: report in $report, raw logs in $logs/" >&2
[ "$cuda_rc" -eq 0 ] && [ "$backend_rc" -eq 0 ] && [ "$cli_rc" -eq 0 ]
