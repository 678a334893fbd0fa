#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds adjsh (Release, CUDA on) into build-gpu/, runs the
# CUDA-vs-CPU tests, then the GPU benchmarks, and prints a correctness, timing and memory report
# in Markdown, ready to paste into docs/BENCHMARKS.md. Unattended; budgeted for about 8 minutes
# on one H200 with 16 cores (every step has its own time limit).
#   scripts/gpu-check.sh [REPORT.md]        (default: gpu-check.md; raw logs in gpu-check-logs/)
set -uo pipefail
cd "$(dirname "$0")/.."
report=${1:-gpu-check.md}
logs=gpu-check-logs
rm -rf "$logs"
mkdir -p "$logs"
start=$(date +%s)
step() { echo "== $(($(date +%s) - start)) s: $*" >&2; }

if ! nvidia-smi -L >"$logs/nvidia-smi.txt" 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L failed): nothing to check" >&2
  exit 1
fi
cat "$logs/nvidia-smi.txt" >&2
jobs=$(nproc 2>/dev/null || echo 4)

step "configure and build (Release, CUDA on, this GPU's architecture)"
# Missing packages are installed when the machine can reach its package mirror.
timeout 180 scripts/install-deps.sh >"$logs/install-deps.txt" 2>&1 || echo "gpu-check: install-deps failed (see $logs/install-deps.txt); trying with what is installed" >&2
arch=native
if ! cmake --version | awk 'NR==1 { split($3, v, "."); exit !(v[1] > 3 || (v[1] == 3 && v[2] >= 24)) }'; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
fi
if ! timeout 300 cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DADJSH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$logs/configure.txt" 2>&1; then
  tail -30 "$logs/configure.txt" >&2
  echo "gpu-check: configure failed" >&2
  exit 1
fi
if ! grep -q "adjsh CUDA backend: ON" "$logs/configure.txt"; then
  echo "gpu-check: CMake did not enable CUDA (no nvcc found?)" >&2
  exit 1
fi
if ! timeout 360 cmake --build build-gpu -j "$jobs" --target cuda_backend_test kernels_test \
    grad_bench cuda_scan_bench adjsh >"$logs/build.txt" 2>&1; then
  tail -40 "$logs/build.txt" >&2
  echo "gpu-check: build failed" >&2
  exit 1
fi

step "tests: CUDA against CPU f64 and the oracle; backend selection"
timeout 300 build-gpu/tests/cuda/cuda_backend_test >"$logs/cuda_tests.txt" 2>&1
cuda_rc=$?
timeout 120 build-gpu/tests/kernels/kernels_test --gtest_filter='ParseDevice*:Backend*' \
  >"$logs/backend_tests.txt" 2>&1
backend_rc=$?
timeout 300 /usr/bin/python3 tests/cli/test_device.py --adjsh build-gpu/cli/adjsh \
  >"$logs/cli_device.txt" 2>&1
cli_rc=$?
tail -5 "$logs/cuda_tests.txt" >&2

step "scan kernels: effective bandwidth against cudaMemcpy device to device"
for storage in f32 bf16; do
  timeout 60 build-gpu/bench/cuda_scan_bench --len 2048 --inner 1536 --state 16 \
    --storage "$storage" >>"$logs/scan.jsonl" 2>>"$logs/scan.err"
done

step "device memory per worker against T (D=768, K=2, chunk 2048)"
for T in 65536 262144 1048576 4194304; do
  timeout 150 build-gpu/bench/grad_bench --device cuda:0 --hidden-size 768 --layers 2 \
    --vocab-size 256 --chunk 2048 --tokens "$T" --threads "$jobs" \
    >>"$logs/memory.jsonl" 2>>"$logs/memory.err" || echo "{\"tokens\": $T, \"failed\": true}" >>"$logs/memory.jsonl"
done

step "full gradient tokens/s, D=768 K=24 V=50280 (adjsh on cuda:0; PyTorch autograd on cuda)"
for T in 4096 16384; do
  for storage in full bf16; do
    timeout 120 build-gpu/bench/grad_bench --device cuda:0 --storage "$storage" \
      --hidden-size 768 --layers 24 --vocab-size 50280 --chunk 2048 --tokens "$T" \
      --threads "$jobs" --repeat 2 >>"$logs/tokens.jsonl" 2>>"$logs/tokens.err" ||
      echo "{\"tokens\": $T, \"storage\": \"$storage\", \"failed\": true}" >>"$logs/tokens.jsonl"
  done
done
if /usr/bin/python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  timeout 240 /usr/bin/python3 bench/torch_baseline.py --device cuda --hidden-size 768 \
    --layers 24 --vocab-size 50280 --state-size 16 --tokens 4096 --warmup-tokens 64 \
    >"$logs/torch.json" 2>"$logs/torch.err" || echo '{"failed": true}' >"$logs/torch.json"
else
  echo '{"unavailable": "torch with CUDA is not importable by /usr/bin/python3"}' >"$logs/torch.json"
fi

step "report"
/usr/bin/python3 bench/gpu_report.py --logs "$logs" --cuda-tests-rc "$cuda_rc" \
  --backend-tests-rc "$backend_rc" --cli-tests-rc "$cli_rc" --seconds $(($(date +%s) - start)) >"$report"
cat "$report"
echo "gpu-check: report in $report, raw logs in $logs/" >&2
[ "$cuda_rc" -eq 0 ] && [ "$backend_rc" -eq 0 ] && [ "$cli_rc" -eq 0 ]
