#!/usr/bin/env bash
# The GPU check, in the order of what matters most: a preflight (the driver, the CUDA runtime, a
# usable device); the CUDA-against-CPU tests (again with ADJSH_CUDA_SYNC=1, which names a kernel
# that faults, and under compute-sanitizer's memcheck and racecheck where it is installed); a
# gradient through GPU workers against the CPU's (tests/cli/test_device.py --expect-gpu); device
# memory against T; tokens/s; scan bandwidth; then a correctness, timing and memory report in
# Markdown, ready to paste into docs/BENCHMARKS.md. Unattended; every step runs under its own
# time limit, and the logs and the report are written as it goes, so a run stopped midway leaves
# both; where $OUT names a folder (the device tool's), gpu-check.md and gpu-check-logs.tar.gz are
# copied there after every step.
#
#   scripts/gpu-check.sh [REPORT.md]     on a GPU machine, the full check (about 49 minutes of
#                                        step limits; default report: gpu-check.md, raw logs in
#                                        gpu-check-logs/). Uses gpu-bundle.tar.xz when it is
#                                        there, else builds into build-gpu/ (Release, CUDA on).
#   scripts/gpu-check.sh --quick [REPORT.md]
#                                        the check in at most 8 minutes of GPU time: the
#                                        preflight, the tests (the sanitizers on a few small
#                                        tests), memory for T up to 256K, one tokens/s point
#                                        (T=4096, f32), the scan bench, no PyTorch baseline.
#                                        Needs binaries: gpu-bundle.tar.xz or --prebuilt DIR (a
#                                        build there can outlast 8 minutes).
#   --plan                               print the steps with their time limits and the total
#                                        (for the mode and binaries given), then exit: no GPU
#                                        needed, nothing runs.
#   scripts/gpu-check.sh --bundle        on any machine with the CUDA toolkit and adjsh's build
#                                        packages, no GPU needed: builds the binaries the check
#                                        runs (sm_80 and sm_90, portable CPU code) with every
#                                        shared library they need but glibc's, into
#                                        gpu-bundle.tar.xz, for a GPU machine with no package
#                                        mirror (carry the file there).
#   scripts/gpu-check.sh --rehearse --prebuilt DIR [--quick] [REPORT.md]
#                                        without a GPU: every step with binaries from DIR (a
#                                        build tree, or an unpacked bundle), to check the script,
#                                        the binaries' flags and the report. What would fail on
#                                        a GPU machine (the preflight, skipped CUDA tests) is
#                                        shown as "would fail" and does not fail the rehearsal;
#                                        the GPU benchmarks fail, each with its reason.
#   --logs DIR                           raw logs there instead of gpu-check-logs/
#
# On a GPU machine the check fails (exit 1, saying why) when no device is usable: no GPU, a
# driver too old for the binaries' CUDA runtime, a device the CUDA test binary cannot use (the
# preflight stops the run there); and, after the remaining steps ran, when any step failed: a
# test that failed or skipped itself (every test must run on a GPU), a sanitizer error, a
# benchmark that exited non-zero, crashed (a signal) or outran its limit. The report is
# rewritten after every step with a table of the steps (limit, seconds, result); SIGTERM, SIGINT
# or SIGHUP stops the running step, records it and exits 128+signal.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
mode=check rehearse=0 quick=0 plan_only=0 prebuilt="" report=gpu-check.md logs=gpu-check-logs
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) mode=bundle ;;
    --rehearse) rehearse=1 ;;
    --quick) quick=1 ;;
    --plan) plan_only=1 ;;
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
elapsed() { echo $(($(date +%s) - start)); }
step() { echo "== $(elapsed) s: $*" >&2; }
jobs=$(nproc 2>/dev/null || echo 4)
# What the check runs, by its path in a build tree (a bundle keeps the file names in bin/).
targets=(cli/adjsh tests/cuda/cuda_backend_test tests/cuda/launch_check_test
         tests/kernels/kernels_test bench/grad_bench bench/cuda_scan_bench)
# Every command runs under `timeout`: SIGTERM at its step's deadline, SIGKILL grace s later.
grace=2
# Line-buffered output, so that each log holds what its step has printed so far.
lb="env"
command -v stdbuf >/dev/null 2>&1 && lb="stdbuf -oL -eL"
export PYTHONUNBUFFERED=1
# compute-sanitizer: on PATH, else in a CUDA install (the toolkit keeps it in bin/ and in
# compute-sanitizer/). The bundle does not carry it: where it is absent its steps say so and pass.
sanitizer=$(command -v compute-sanitizer 2>/dev/null)
if [ -z "$sanitizer" ]; then
  for f in ${CUDA_HOME:+"$CUDA_HOME/bin/compute-sanitizer"} /usr/local/cuda/bin/compute-sanitizer \
      /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    if [ -x "$f" ]; then sanitizer=$f; break; fi
  done
fi
# What runs under it: small shapes that reach every kernel (one block's forward and backward in
# f32 and bf16 storage with halo rows, a whole gradient with the head, a Mamba-2 block), so that
# the instrumented run takes seconds.
sanitize_filter='CudaTest.BlockMatchesCpuF64WithHaloStateAndAdjoint:CudaTest.GradientMatchesTheOracle:Shapes/Mamba2CudaTest.MatchesCpuF64/D16_G1_P4'

# lim CMD...: CMD under what is left of the current step's limit (step_deadline); 124 when the
# step has no time left. Run in the background and waited for, so a signal stops it at once.
step_deadline=0 child=""
lim() {
  local left=$((step_deadline - $(date +%s))) rc=0
  if [ "$left" -le 0 ]; then
    echo "gpu-check: the step's limit is spent; not run: $*" >&2
    return 124
  fi
  timeout -k "$grace" "$left" "$@" &
  child=$!
  wait "$child" || rc=$?
  child=""
  return "$rc"
}

# configure DIR ARCHS [CMAKE ARGS...] and compile DIR: Release, CUDA on, the check's binaries.
configure() {
  local dir=$1 arch=$2
  shift 2
  if ! lim cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DADJSH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" "$@" >"$logs/configure.txt" 2>&1; then
    tail -30 "$logs/configure.txt" >&2
    echo "gpu-check: configure failed" >&2
    return 1
  fi
  if ! grep -q "adjsh CUDA backend: ON" "$logs/configure.txt"; then
    echo "gpu-check: CMake did not enable CUDA (no nvcc found?)" >&2
    return 1
  fi
}
compile() {
  if ! lim cmake --build "$1" -j "$jobs" --target "${targets[@]##*/}" >"$logs/build.txt" 2>&1; then
    tail -40 "$logs/build.txt" >&2
    echo "gpu-check: build failed" >&2
    return 1
  fi
}

if [ "$mode" = bundle ]; then
  logs="gpu-bundle-logs"
  rm -rf "$logs" && mkdir -p "$logs"
  step "install the build packages, configure and build into build-bundle/ (sm_80, sm_90)"
  ADJSH_DEPS=build scripts/install-deps.sh || exit 1
  # The binaries look for their libraries in ../lib first (DT_RPATH, which also covers the
  # libraries' own dependencies), so nothing on the GPU machine needs LD_LIBRARY_PATH.
  step_deadline=$(($(date +%s) + 300))
  configure build-bundle "80;90" -DADJSH_NATIVE=OFF '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags || exit 1
  step_deadline=$(($(date +%s) + 1800))
  compile build-bundle || exit 1
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

# Where the binaries come from: --prebuilt, else the bundle, else a build here.
if [ -n "$prebuilt" ]; then src=prebuilt
elif [ -f gpu-bundle.tar.xz ]; then src=bundle
else src=build
fi
if [ "$quick" = 1 ] && [ "$src" = build ]; then
  echo "gpu-check: --quick runs prebuilt binaries: give --prebuilt DIR or bring gpu-bundle.tar.xz" \
    "(scripts/gpu-check.sh --bundle, on any machine with the toolkit); a build on the GPU machine" \
    "alone can outlast the 8 minutes" >&2
  exit 2
fi
mode_name=full
[ "$quick" = 1 ] && mode_name=--quick
cmdline="scripts/gpu-check.sh"
[ "$quick" = 1 ] && cmdline="$cmdline --quick"

# The plan: every step, its time limit in seconds (quick's, full's) and what it does.
P_NAME=() P_LIMIT=() P_DESC=()
add() { P_NAME+=("$1"); P_LIMIT+=("$2"); P_DESC+=("$3"); }
q() { if [ "$quick" = 1 ]; then echo "$1"; else echo "$2"; fi; }
add preflight.gpu "$(q 15 20)" "nvidia-smi: the GPU, its driver and the CUDA version it supports (none, or older than CUDA 13: stop)"
case "$src" in
  bundle) add unpack "$(q 20 60)" "unpack gpu-bundle.tar.xz" ;;
  build)
    add build.deps 180 "scripts/install-deps.sh (missing packages, where a package mirror answers)"
    add build.configure 300 "cmake: build-gpu/, Release, CUDA on, this GPU's architecture"
    add build.compile 1800 "build the check's binaries" ;;
esac
# The order is what matters most, first (a run stopped early has the most important results):
# the device usable; the CUDA tests; a gradient through GPU workers against the CPU's; memory
# flat in T; tokens/s; scan bandwidth. --quick's limits sum to at most 480 s, kill grace and the
# bundle's unpack included (tests/cuda/test_gpu_check.py holds it to that).
add preflight.device "$(q 25 30)" "the binaries' CUDA runtime against the driver; libcublas.so.13; one CUDA test on cuda:0 (no usable device: stop)"
add tests.cuda "$(q 60 300)" "cuda_backend_test: CUDA against CPU f64 and the oracle (a skipped test fails the check)"
add tests.cuda.sync "$(q 40 300)" "launch_check_test (a faulting kernel is named), then cuda_backend_test with ADJSH_CUDA_SYNC=1 (a sync after every launch)"
add sanitizer.memcheck "$(q 40 180)" "compute-sanitizer --tool memcheck, cuda_backend_test on a few small tests (skipped where compute-sanitizer is absent)"
add sanitizer.racecheck "$(q 30 180)" "compute-sanitizer --tool racecheck, the same tests (skipped where compute-sanitizer is absent)"
add tests.backend "$(q 10 120)" "kernels_test ParseDevice*:Backend*: backend selection"
add tests.cli "$(q 60 300)" "tests/cli/test_device.py (--expect-gpu on a GPU machine): --device on adjsh grad, train and worker; the gradient through GPU workers against the CPU's"
mem_tokens="65536 262144"
[ "$quick" = 1 ] || mem_tokens="$mem_tokens 1048576 4194304"
for T in $mem_tokens; do
  add "memory.T$T" "$(q $((T > 65536 ? 35 : 25)) 150)" "grad_bench D=768 K=2 V=256 chunk 2048 T=$T: device memory"
done
if [ "$quick" = 1 ]; then
  add tokens.T4096.full 45 "grad_bench D=768 K=24 V=50280 T=4096, f32 storage: tokens/s"
else
  for T in 4096 16384; do
    for s in full bf16; do
      add "tokens.T$T.$s" 120 "grad_bench D=768 K=24 V=50280 T=$T, $s storage: tokens/s"
    done
  done
  add torch 240 "bench/torch_baseline.py --device cuda, T=4096 (where a python3 has torch with CUDA)"
fi
for s in f32 bf16; do
  add "scan.$s" "$(q 12 60)" "cuda_scan_bench --storage $s: scan bandwidth against a device-to-device copy"
done
add report "$(q 10 30)" "bench/gpu_report.py: the report"
plan_total=0
for l in "${P_LIMIT[@]}"; do plan_total=$((plan_total + l)); done
plan_worst=$((plan_total + grace * ${#P_NAME[@]}))

print_plan() {
  local i
  echo "plan: $cmdline ($mode_name; binaries: $src${prebuilt:+ $prebuilt})"
  for i in "${!P_NAME[@]}"; do
    printf 'step %-19s %5d s  %s\n' "${P_NAME[i]}" "${P_LIMIT[i]}" "${P_DESC[i]}"
  done
  echo "total $plan_total s of step limits; at most $plan_worst s with ${grace} s per step to kill" \
    "a command past its limit ($(((plan_worst + 59) / 60)) min)"
}
if [ "$plan_only" = 1 ]; then
  print_plan
  exit 0
fi
if [ "$src" = prebuilt ] && [ ! -d "$prebuilt" ]; then
  echo "gpu-check: --prebuilt $prebuilt: no such directory" >&2
  exit 1
fi

rm -rf "$logs" && mkdir -p "$logs" || exit 1
# say MESSAGE: to stderr and to the run's own log.
say() { echo "$*" >&2; echo "$*" >>"$logs/run.log"; }
print_plan >"$logs/plan.txt"
cat "$logs/plan.txt" >&2

py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
gpu=0 driver=unknown drv_cuda="" runtime="" fatal=0 fatal_why="" would=() failed_steps=()
cuda_rc=-1 backend_rc=-1 cli_rc=-1
binaries="build-gpu (built here)"
if [ "$src" = prebuilt ]; then
  binaries=$prebuilt
  [ -f "$prebuilt/BUNDLE.txt" ] && binaries="$prebuilt: $(tr '\n' ' ' <"$prebuilt/BUNDLE.txt")"
fi
[ "$src" = bundle ] && binaries="gpu-bundle"
[ "$quick" = 1 ] && echo '{"unavailable": "not run by --quick"}' >"$logs/torch.json"

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

# The steps' state, for the report's table.
S_RES=() S_SECS=()
for i in "${!P_NAME[@]}"; do S_RES[i]="not reached"; S_SECS[i]="-"; done
cur="" step_t0=0 note=""
run_state="Running: the table is rewritten after every step; a step with no result was stopped there."

steps_table() {
  local i
  echo "### Steps ($mode_name: step limits $plan_total s in all)"
  echo
  echo "| # | step | limit | seconds | result |"
  echo "|---|---|---|---|---|"
  for i in "${!P_NAME[@]}"; do
    printf '| %d | %s | %s s | %s | %s |\n' $((i + 1)) "${P_NAME[i]}" "${P_LIMIT[i]}" \
      "${S_SECS[i]}" "$(printf '%s' "${S_RES[i]}" | tr '|\n' '/ ')"
  done
  echo
  echo "$run_state"
  echo
}

# render_report: the report as the logs stand, with the steps' table, replacing the last one
# whole (rename); 1 when bench/gpu_report.py could not render the results (the table is there).
render_report() {
  local tmp="$report.tmp$$" ok=1
  if timeout -k 1 10 "$py" bench/gpu_report.py --logs "$logs" --cuda-tests-rc "$cuda_rc" \
      --backend-tests-rc "$backend_rc" --cli-tests-rc "$cli_rc" --binaries "$binaries" \
      --seconds "$(elapsed)" >"$tmp" 2>"$logs/report.err"; then
    CMDLINE=$cmdline awk '$0 == "Command: `scripts/gpu-check.sh`" { print "Command: `" ENVIRON["CMDLINE"] "`"; next }
      $0 != "<!-- gpu:end -->" { print }' "$tmp" >"$tmp.2"
    echo >>"$tmp.2"
  else
    ok=0
    { echo "<!-- gpu:begin -->"; echo "## CUDA backend (scripts/gpu-check.sh)"; echo
      echo "Command: \`$cmdline\`"; echo
      echo "No results rendered yet (bench/gpu_report.py: $(tail -1 "$logs/report.err" | tr -d '`'))."
      echo; } >"$tmp.2"
  fi
  { steps_table; echo "<!-- gpu:end -->"; } >>"$tmp.2"
  mv -f "$tmp.2" "$report"
  rm -f "$tmp"
  [ "$ok" = 1 ]
}

# fatal WHY: the check cannot go on (on a GPU machine). would_fail WHY: in a rehearsal without a
# GPU, what would fail here on one.
fatal() { fatal=1; fatal_why=$1; note="FAILED: $1"; }
would_fail() {
  note="would fail on a GPU machine: $1"
  would+=("${P_NAME[cur]}: $1")
  say "gpu-check: REHEARSAL: would fail here on a GPU machine: $1"
}

# timed_out RC: whether RC is `timeout`'s for the step's limit: 124, or 137 (SIGKILL after the
# grace) once the deadline has passed; a 137 before it is a kill from elsewhere (the OOM killer).
timed_out() { [ "$1" -eq 124 ] || { [ "$1" -eq 137 ] && [ "$(date +%s)" -ge "$step_deadline" ]; }; }
# crash RC: "crashed (SIGSEGV)" for a command a signal ended (timeout passes its signal on as
# 128+N), else nothing.
crash() {
  [ "$1" -gt 128 ] && [ "$1" -lt 160 ] && ! timed_out "$1" || return 0
  echo "crashed (SIG$(kill -l $(($1 - 128)) 2>/dev/null || echo $(($1 - 128))))"
}

# failed RC ERR_FILE KEY VALUE...: a JSON line for a step that failed, with its reason: the
# limit when it timed out, the signal when it crashed (with its last line of stderr), else the
# first line of its stderr when it was told its usage, else the last. Sets last_why.
last_why=""
failed() {
  local rc=$1 err=$2 why pick=tail
  shift 2
  grep -q '^usage:' "$err" 2>/dev/null && pick="head"
  why=$(grep -v '^\s*$' "$err" 2>/dev/null | $pick -1 | tr -d '"\\' | cut -c1-200)
  if timed_out "$rc"; then why="timed out: the step's limit is ${P_LIMIT[cur]} s"
  elif [ -n "$(crash "$rc")" ]; then why="$(crash "$rc")${why:+: $why}"
  fi
  last_why=${why:-no output}
  echo "{$(printf '"%s": %s, ' "$@")\"failed\": true, \"why\": \"$last_why\"}"
}

# gtest_counts FILE: "RAN SKIPPED" from a gtest binary's output.
gtest_counts() {
  local ran skipped
  ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran\..*/\1/p' "$1" | tail -1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below:.*/\1/p' "$1" | tail -1)
  echo "${ran:-0} ${skipped:-0}"
}
# gtest_verdict FILE RC: the step's rc; no test run fails, and on a GPU machine a skipped test
# fails (in a rehearsal without one it would).
gtest_verdict() {
  local file=$1 rc=$2 ran skipped
  read -r ran skipped < <(gtest_counts "$file")
  if [ "$rc" -eq 0 ] && [ "$ran" -eq 0 ]; then
    note="FAILED: no test ran"
    return 1
  fi
  if [ "$skipped" -gt 0 ]; then
    local why
    why=$(grep -m1 -A1 ': Skipped$' "$file" | tail -1 | cut -c1-160)
    if [ "$gpu" = 1 ]; then
      note="FAILED: $skipped of $ran tests skipped on a GPU machine (every CUDA test must run): $why"
      say "gpu-check: $(basename "$file" .txt): $skipped of $ran tests skipped: $why"
      return 1
    fi
    would_fail "$skipped of $ran tests skipped ($why); on a GPU machine a skipped test fails the check"
  fi
  return "$rc"
}

preflight_gpu() {
  local rc=0 why
  lim nvidia-smi -L >"$logs/nvidia-smi.txt" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    why="nvidia-smi -L: $(grep -v '^\s*$' "$logs/nvidia-smi.txt" | head -1 | cut -c1-160)"
    [ "$rc" -eq 127 ] && why="nvidia-smi not found"
    echo "driver: none ($why)" >"$logs/preflight.txt"
    if [ "$rehearse" = 1 ]; then
      echo "rehearsal without a GPU on $(hostname)" >"$logs/nvidia-smi.txt"
      say "gpu-check: driver: none; rehearsal without a GPU on $(hostname)"
      would_fail "no NVIDIA GPU ($why)"
      return 0
    fi
    fatal "no GPU: no NVIDIA GPU here ($why): nothing to check (--rehearse runs the steps anyway)"
    return 1
  fi
  gpu=1
  [ "$rehearse" = 1 ] && say "gpu-check: --rehearse on a machine with a GPU: running the real check"
  lim nvidia-smi >"$logs/preflight.txt" 2>&1
  lim nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv \
    >>"$logs/preflight.txt" 2>&1
  driver=$(lim nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  driver=${driver:-unknown}
  drv_cuda=$(grep -o 'CUDA Version: *[0-9][0-9.]*' "$logs/preflight.txt" | head -1 | grep -o '[0-9][0-9.]*$')
  cat "$logs/nvidia-smi.txt" >&2
  say "gpu-check: driver $driver, which supports CUDA up to ${drv_cuda:-an unknown version}"
  if [ -n "$drv_cuda" ] && [ "${drv_cuda%%.*}" -lt 13 ]; then
    fatal "driver $driver supports CUDA up to $drv_cuda; the binaries are CUDA 13 (driver 580 or later): every CUDA test would skip"
    return 1
  fi
}

preflight_device() {
  local t f rt_from="" rc=0 why ran skipped
  for t in "${targets[@]}"; do
    [ -x "$(bin "${t##*/}")" ] || { fatal "$(bin "${t##*/}") is missing"; return 1; }
  done
  # The CUDA runtime is linked statically: its version is the toolkit's that built the binaries.
  if [ -f "$prebuilt/BUNDLE.txt" ]; then
    runtime=$(sed -n 's/^cuda: release \([0-9.]*\).*/\1/p' "$prebuilt/BUNDLE.txt") rt_from="$prebuilt/BUNDLE.txt"
  else
    for f in "$prebuilt"/CMakeFiles/*/CMakeCUDACompiler.cmake; do
      [ -f "$f" ] && runtime=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")$/\1/p' "$f") rt_from=$f
    done
  fi
  say "gpu-check: CUDA runtime ${runtime:-unknown} (static in the binaries${rt_from:+, from $rt_from}); driver $driver${drv_cuda:+, CUDA up to $drv_cuda}"
  echo "runtime: CUDA ${runtime:-unknown}${rt_from:+ ($rt_from)}" >>"$logs/preflight.txt"
  if [ "$gpu" = 1 ] && [ -n "$runtime" ] && [ -n "$drv_cuda" ] && [ "${runtime%%.*}" -gt "${drv_cuda%%.*}" ]; then
    fatal "the driver ($driver) supports CUDA up to $drv_cuda, the binaries' runtime is CUDA $runtime: a newer driver is needed"
    return 1
  fi
  # cuBLAS is loaded at first use: where the loader does not know it, its folder is named here:
  # the toolkit's, or a pip wheel's (CUDA 12 wheels: nvidia/cublas/lib; CUDA 13: nvidia/cu13/lib).
  local cublas_dir="" d
  if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13 '; then
    local p wheels=""
    for p in $(printf '%s\n' "$py" "$(command -v python3)" | sort -u); do
      wheels="$wheels $(lim "$p" -c 'import nvidia, os; print(*[os.path.join(p, s) for p in nvidia.__path__ for s in ("cu13/lib", "cublas/lib")])' 2>/dev/null)"
    done
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $wheels; do
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
  say "gpu-check: libcublas.so.13 from $cublas_dir"
  # One CUDA test that needs the device (it skips itself without one).
  lim $lb "$(bin cuda_backend_test)" --gtest_filter=CudaTest.UnsupportedOpsAreRefused \
    >"$logs/device_probe.txt" 2>&1 || rc=$?
  read -r ran skipped < <(gtest_counts "$logs/device_probe.txt")
  if [ "$rc" -eq 0 ] && [ "$ran" -eq 1 ] && [ "$skipped" -eq 0 ]; then
    say "gpu-check: cuda:0 is usable (cuda_backend_test --gtest_filter=CudaTest.UnsupportedOpsAreRefused passed)"
    return 0
  fi
  why=$(grep -m1 -o 'no CUDA device.*' "$logs/device_probe.txt" | cut -c1-200)
  [ -n "$why" ] || why="cuda_backend_test exit $rc, $ran run, $skipped skipped: $(tail -1 "$logs/device_probe.txt" | cut -c1-160)"
  if [ "$gpu" = 1 ]; then
    fatal "no usable CUDA device ($why; see $logs/device_probe.txt): every CUDA test would skip"
    return 1
  fi
  would_fail "no usable CUDA device ($why)"
}

# body NAME: the plan's step NAME; sets note (the result's text) where it has more to say.
body() {
  local name=$1 rc=0 T s
  case "$name" in
    preflight.gpu) preflight_gpu ;;
    unpack)
      rm -rf gpu-bundle
      lim tar -xJf gpu-bundle.tar.xz || { fatal "cannot unpack gpu-bundle.tar.xz"; return 1; }
      prebuilt="gpu-bundle"
      binaries="gpu-bundle: $(tr '\n' ' ' <gpu-bundle/BUNDLE.txt 2>/dev/null)" ;;
    build.deps)
      # Missing packages are installed when the machine can reach its package mirror.
      lim scripts/install-deps.sh >"$logs/install-deps.txt" 2>&1 ||
        note="failed (see install-deps.txt); trying with what is installed" ;;
    build.configure)
      local arch=native
      if ! cmake --version | awk 'NR==1 { split($3, v, "."); exit !(v[1] > 3 || (v[1] == 3 && v[2] >= 24)) }'; then
        arch=$(lim nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
      fi
      configure build-gpu "$arch" || { fatal "configure failed (see $logs/configure.txt)"; return 1; } ;;
    build.compile)
      compile build-gpu || { fatal "build failed (see $logs/build.txt)"; return 1; }
      prebuilt=build-gpu ;;
    preflight.device) preflight_device ;;
    tests.cuda)
      lim $lb "$(bin cuda_backend_test)" >"$logs/cuda_tests.txt" 2>&1
      cuda_rc=$?
      tail -5 "$logs/cuda_tests.txt" >&2
      gtest_verdict "$logs/cuda_tests.txt" "$cuda_rc" || rc=$?
      [ "$cuda_rc" -ne 0 ] || cuda_rc=$rc
      return "$rc" ;;
    tests.cuda.sync)
      # The check itself first: on a GPU, a kernel that faults on the device is named.
      local rc2=0 first=""
      lim $lb "$(bin launch_check_test)" >"$logs/launch_check.txt" 2>&1 || rc=$?
      gtest_verdict "$logs/launch_check.txt" "$rc" || rc=$?
      [ "$rc" -eq 0 ] || first="launch_check_test: ${note:-exit $rc}; "
      # Then every CUDA test with a sync after each launch: a fault names its kernel, where
      # tests.cuda (no sync, as users run) would report it at a later sync, unnamed.
      lim env ADJSH_CUDA_SYNC=1 $lb "$(bin cuda_backend_test)" >"$logs/cuda_tests_sync.txt" 2>&1 || rc2=$?
      tail -3 "$logs/cuda_tests_sync.txt" >&2
      gtest_verdict "$logs/cuda_tests_sync.txt" "$rc2" || rc2=$?
      if [ "$rc2" -eq 0 ] && [ "$gpu" = 1 ] && ! grep -q 'ADJSH_CUDA_SYNC=1: the device is synchronised' "$logs/cuda_tests_sync.txt"; then
        note="FAILED: cuda_backend_test did not take ADJSH_CUDA_SYNC=1 (binaries older than this script?)"
        rc2=1
      fi
      if [ -n "$first" ]; then
        note="FAILED: $first${note:-cuda_backend_test: exit $rc2}"
      fi
      [ "$rc" -ne 0 ] || rc=$rc2
      return "$rc" ;;
    sanitizer.*)
      local tool=${name#sanitizer.} errors
      if [ -z "$sanitizer" ]; then
        note="skipped: no compute-sanitizer (not on PATH, nor in /usr/local/cuda*/ or \$CUDA_HOME)"
        return 0
      fi
      say "gpu-check: $sanitizer --tool $tool, cuda_backend_test --gtest_filter=$sanitize_filter"
      lim $lb "$sanitizer" --tool "$tool" --error-exitcode 99 "$(bin cuda_backend_test)" \
        --gtest_filter="$sanitize_filter" >"$logs/$name.txt" 2>&1 || rc=$?
      tail -3 "$logs/$name.txt" >&2
      # A sandbox can keep the tool from the device (seen under gVisor: "Device not supported"):
      # the tool cannot run here, which says nothing of the kernels.
      if grep -q 'Device not supported' "$logs/$name.txt"; then
        note="skipped: compute-sanitizer cannot use this device here ($(grep -m1 'Device not supported' "$logs/$name.txt" | cut -c1-120))"
        return 0
      fi
      # memcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards displayed
      # (N errors, W warnings)".
      errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ error|\([0-9]+ error' "$logs/$name.txt" | grep -oE '[0-9]+' | tail -1)
      if [ "${errors:-0}" -gt 0 ] || [ "$rc" -eq 99 ]; then
        note="FAILED: $tool found ${errors:-some} error(s): $(grep -m1 -E '^========= (Invalid|Error|Race|Program hit)' "$logs/$name.txt" | cut -c11-170)"
        return 1
      fi
      gtest_verdict "$logs/$name.txt" "$rc" || rc=$?
      return "$rc" ;;
    tests.backend)
      lim $lb "$(bin kernels_test)" --gtest_filter='ParseDevice*:Backend*' >"$logs/backend_tests.txt" 2>&1
      backend_rc=$?
      gtest_verdict "$logs/backend_tests.txt" "$backend_rc" || rc=$?
      [ "$backend_rc" -ne 0 ] || backend_rc=$rc
      return "$rc" ;;
    tests.cli)
      # On a GPU machine cuda:0 must be used: --expect-gpu fails where it is refused.
      local expect=()
      [ "$gpu" = 1 ] && expect=(--expect-gpu)
      lim "$py" tests/cli/test_device.py --adjsh "$(bin adjsh)" "${expect[@]}" >"$logs/cli_device.txt" 2>&1
      cli_rc=$?
      tail -1 "$logs/cli_device.txt" >&2
      return "$cli_rc" ;;
    scan.*)
      s=${name#scan.}
      lim $lb "$(bin cuda_scan_bench)" --len 2048 --inner 1536 --state 16 --storage "$s" \
        >>"$logs/scan.jsonl" 2>"$logs/$name.err" || rc=$?
      [ "$rc" -eq 0 ] || { failed "$rc" "$logs/$name.err" storage "\"$s\"" >>"$logs/scan.jsonl"; note="failed (exit $rc): $last_why"; }
      return "$rc" ;;
    memory.T*)
      T=${name#memory.T}
      lim $lb "$(bin grad_bench)" --device cuda:0 --hidden-size 768 --layers 2 \
        --vocab-size 256 --chunk 2048 --tokens "$T" --threads "$jobs" \
        >>"$logs/memory.jsonl" 2>"$logs/$name.err" || rc=$?
      [ "$rc" -eq 0 ] || { failed "$rc" "$logs/$name.err" tokens "$T" >>"$logs/memory.jsonl"; note="failed (exit $rc): $last_why"; }
      return "$rc" ;;
    tokens.T*)
      T=${name#tokens.T} && s=${T#*.} && T=${T%%.*}
      lim $lb "$(bin grad_bench)" --device cuda:0 --storage "$s" \
        --hidden-size 768 --layers 24 --vocab-size 50280 --chunk 2048 --tokens "$T" \
        --threads "$jobs" --repeat 2 >>"$logs/tokens.jsonl" 2>"$logs/$name.err" || rc=$?
      [ "$rc" -eq 0 ] || { failed "$rc" "$logs/$name.err" tokens "$T" storage "\"$s\"" >>"$logs/tokens.jsonl"; note="failed (exit $rc): $last_why"; }
      return "$rc" ;;
    torch)
      # The baseline needs torch with CUDA, from whichever interpreter has it.
      local p torch_py=""
      for p in $(command -v python3) /usr/bin/python3; do
        if lim "$p" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
          torch_py=$p; break
        fi
      done
      if [ -z "$torch_py" ]; then
        echo '{"unavailable": "no python3 here imports torch with CUDA available"}' >"$logs/torch.json"
        note="unavailable: no python3 here imports torch with CUDA available"
        return 0
      fi
      lim "$torch_py" bench/torch_baseline.py --device cuda --hidden-size 768 \
        --layers 24 --vocab-size 50280 --state-size 16 --tokens 4096 --warmup-tokens 64 \
        >"$logs/torch.json" 2>"$logs/torch.err" || rc=$?
      [ "$rc" -eq 0 ] || { failed "$rc" "$logs/torch.err" tokens 4096 >"$logs/torch.json"; note="failed (exit $rc): $last_why"; }
      return "$rc" ;;
    report)
      run_state="Finished in $(elapsed) s."
      render_report || { note="FAILED: bench/gpu_report.py: $(tail -1 "$logs/report.err")"; return 1; } ;;
    *) echo "gpu-check: no such step: $name" >&2; return 1 ;;
  esac
}

# gpu_step NAME: the steps that need a GPU to pass at all (a rehearsal shows their failures).
gpu_step() { case "$1" in scan.* | memory.* | tokens.* | torch | sanitizer.*) return 0 ;; esac; return 1; }

# publish: where $OUT names a folder (the device tool brings back what it holds, also from a run
# stopped at its limit), the report as gpu-check.md and the logs as gpu-check-logs.tar.gz, each
# replaced whole.
publish() {
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
  { cp -f "$report" "$OUT/gpu-check.md.tmp" && mv -f "$OUT/gpu-check.md.tmp" "$OUT/gpu-check.md" &&
    tar -C "$(dirname "$logs")" -czf "$OUT/gpu-check-logs.tmp" "$(basename "$logs")" &&
    mv -f "$OUT/gpu-check-logs.tmp" "$OUT/gpu-check-logs.tar.gz"; } 2>>"$logs/run.log" ||
    echo "gpu-check: could not copy the report and logs to \$OUT=$OUT (see $logs/run.log)" >&2
}

# run_step I: the plan's step I under its limit; its state in the report before and after.
run_step() {
  local i=$1 rc=0
  cur=$i note=""
  step_t0=$(date +%s)
  step_deadline=$((step_t0 + P_LIMIT[i]))
  S_RES[i]="started at $((step_t0 - start)) s, no result"
  say "== $((step_t0 - start)) s: [$((i + 1))/${#P_NAME[@]}] ${P_NAME[i]} (limit ${P_LIMIT[i]} s): ${P_DESC[i]}"
  render_report
  body "${P_NAME[i]}" || rc=$?
  S_SECS[i]=$(($(date +%s) - step_t0))
  if [ -n "$note" ]; then S_RES[i]=$note
  elif [ "$rc" -eq 0 ]; then S_RES[i]=ok
  elif timed_out "$rc"; then S_RES[i]="timed out (limit ${P_LIMIT[i]} s)"
  elif [ -n "$(crash "$rc")" ]; then S_RES[i]="FAILED: $(crash "$rc")"
  else S_RES[i]="failed (exit $rc)"
  fi
  # Any step that did not pass fails the check; in a rehearsal without a GPU, the GPU steps
  # (benchmarks, sanitizers) fail by design and are only shown.
  if [ "$rc" -ne 0 ] || [[ "${S_RES[i]}" == FAILED* ]]; then
    if [ "$gpu" = 1 ] || [ "$rehearse" = 0 ] || ! gpu_step "${P_NAME[i]}"; then
      failed_steps+=("${P_NAME[i]}: ${S_RES[i]}")
    fi
  fi
  # The report first, then the step's line in steps.tsv: a run killed between the two leaves a
  # report at least as far as steps.tsv.
  [ "$fatal" = 1 ] && run_state="Stopped after $(elapsed) s at ${P_NAME[i]}: $fatal_why"
  render_report
  printf '%s\t%s\t%s\t%s\n' "${P_NAME[i]}" "${P_LIMIT[i]}" "${S_SECS[i]}" "${S_RES[i]}" >>"$logs/steps.tsv"
  say "   ${P_NAME[i]}: ${S_RES[i]} (${S_SECS[i]} s)"
  cur=""
  if [ "$fatal" = 1 ]; then
    say "gpu-check: $fatal_why"
    say "gpu-check: partial report in $report, raw logs in $logs/${OUT:+; copied to $OUT}"
    publish
    exit 1
  fi
  publish
}

# on_signal NAME NUMBER: stop the running step, record it, write the report, exit 128+NUMBER.
on_signal() {
  trap - TERM INT HUP
  if [ -n "$child" ]; then
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  if [ -n "$cur" ]; then
    S_SECS[cur]=$(($(date +%s) - step_t0))
    S_RES[cur]="stopped by SIG$1"
    printf '%s\t%s\t%s\t%s\n' "${P_NAME[cur]}" "${P_LIMIT[cur]}" "${S_SECS[cur]}" "${S_RES[cur]}" >>"$logs/steps.tsv"
  fi
  run_state="Stopped by SIG$1 after $(elapsed) s${cur:+ during ${P_NAME[cur]}}: the steps not reached did not run."
  render_report
  say "gpu-check: stopped by SIG$1${cur:+ during ${P_NAME[cur]}}; partial report in $report, raw logs in $logs/"
  publish
  exit $((128 + $2))
}
trap 'on_signal TERM 15' TERM
trap 'on_signal INT 2' INT
trap 'on_signal HUP 1' HUP

for i in "${!P_NAME[@]}"; do
  run_step "$i"
done
report_ok=1
grep -q '^| [0-9]* | report | .* | ok |$' "$report" || report_ok=0
cat "$report"
if [ "${#would[@]}" -gt 0 ]; then
  say "gpu-check: rehearsal without a GPU: on a GPU machine these would fail the check:"
  for w in "${would[@]}"; do say "  $w"; done
fi
if [ "${#failed_steps[@]}" -gt 0 ]; then
  say "gpu-check: FAILED: ${#failed_steps[@]} step(s) did not pass:"
  for f in "${failed_steps[@]}"; do say "  $f"; done
fi
say "gpu-check: report in $report, raw logs in $logs/ ($(elapsed) s; step limits $plan_total s)${OUT:+; copied to $OUT}"
publish
[ "$report_ok" = 1 ] && [ "${#failed_steps[@]}" -eq 0 ] && [ "$cuda_rc" -eq 0 ] && [ "$backend_rc" -eq 0 ] &&
  [ "$cli_rc" -eq 0 ]
