#!/usr/bin/python3
"""Markdown report of scripts/gpu-check.sh from its logs (one section for docs/BENCHMARKS.md).

  /usr/bin/python3 bench/gpu_report.py --logs gpu-check-logs --cuda-tests-rc 0 \
      --backend-tests-rc 0 --seconds 420 > gpu-check.md
"""
import argparse
import datetime
import json
import os
import re


def jsonl(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        rows.append({"failed": True, "line": line})
    return rows


def failure(row):
    """A failed step's table cell: its reason (the last line it printed on stderr)."""
    why = row.get("why", "").replace("|", "/")
    return f"failed: {why}" if why else "failed"


def mib(b):
    return f"{b / 1048576:.1f} MiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True)
    ap.add_argument("--cuda-tests-rc", type=int, required=True)
    ap.add_argument("--backend-tests-rc", type=int, required=True)
    ap.add_argument("--cli-tests-rc", type=int, default=-1)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--binaries", default="build-gpu (built here)")
    a = ap.parse_args()
    L = lambda name: os.path.join(a.logs, name)  # noqa: E731

    gpu = open(L("nvidia-smi.txt")).read().strip().splitlines()
    out = ["<!-- gpu:begin -->", "## CUDA backend (scripts/gpu-check.sh)", ""]
    out.append("Command: `scripts/gpu-check.sh`")
    out.append("")
    out.append(f"Measured {datetime.date.today().isoformat()} on {gpu[0] if gpu else 'unknown GPU'}"
               f" ({os.cpu_count()} CPU cores); the whole check took {a.seconds} s. "
               f"Binaries: {a.binaries}.")
    out.append("")

    # Correctness: the test binary prints one line per gradient it compares.
    tests = open(L("cuda_tests.txt")).read() if os.path.exists(L("cuda_tests.txt")) else ""
    errs = {}
    for m in re.finditer(r"\[ adjsh-cuda \] .*? (f32|bf16) max_rel_err=(\S+) \((\S*)\) "
                         r"whole_rel_err=(\S+)", tests):
        errs.setdefault(m.group(1), []).append((float(m.group(2)), m.group(3), float(m.group(4))))
    skipped = len(re.findall(r"\[  SKIPPED \]", tests))
    passed = re.search(r"\[  PASSED  \] (\d+) test", tests)
    failed = re.search(r"\[  FAILED  \] (\d+) test", tests)
    out.append("### Correctness: CUDA against CPU f64")
    out.append("")
    out.append(f"cuda_backend_test: exit {a.cuda_tests_rc}, "
               f"{passed.group(1) if passed else 0} passed, {failed.group(1) if failed else 0} failed, "
               f"{skipped} skipped; backend selection tests (kernels_test ParseDevice*:Backend*): "
               f"exit {a.backend_tests_rc}; `--device` CLI checks (tests/cli/test_device.py): "
               f"exit {a.cli_tests_rc}.")
    out.append("")
    out.append("| storage | gradients compared | worst tensor's relative error | "
               "worst whole-gradient relative error | bound |")
    out.append("|---|---|---|---|---|")
    for storage, bound in (("f32", "1e-5 per tensor"), ("bf16", "2e-2 whole gradient")):
        e = errs.get(storage, [])
        if e:
            worst = max(e, key=lambda r: r[0])
            out.append(f"| {storage} | {len(e)} | {worst[0]:.2e} ({worst[1]}) | "
                       f"{max(r[2] for r in e):.2e} | {bound} |")
        else:
            out.append(f"| {storage} | 0 | - | - | {bound} |")
    out.append("")

    out.append("### Scan kernels: effective bandwidth")
    out.append("")
    out.append("| storage | len x Di x N | copy rate (D2D) | forward | of copy | backward | of copy |")
    out.append("|---|---|---|---|---|---|---|")
    for r in jsonl(L("scan.jsonl")):
        if r.get("failed"):
            out.append(f"| {r.get('storage', '?')} | 2048 x 1536 x 16 | {failure(r)} | - | - | - | - |")
            continue
        out.append(f"| {r['storage']} | {r['len']} x {r['inner']} x {r['state']} | {r['copy_gb_s']:.0f} GB/s "
                   f"| {r['forward_gb_s']:.0f} GB/s ({r['forward_ms']:.3f} ms) | {100 * r['forward_of_copy']:.0f}% "
                   f"| {r['backward_gb_s']:.0f} GB/s ({r['backward_ms']:.3f} ms) | {100 * r['backward_of_copy']:.0f}% |")
    out.append("")
    out.append("Bytes are each kernel's compulsory traffic (inputs read once, outputs written once); "
               "the copy rate counts a read and a write per byte.")
    out.append("")

    out.append("### Device memory against T (D=768, K=2, V=256, chunk 2048)")
    out.append("")
    out.append("| T | GPU memory held by adjsh (peak) | seconds | tokens/s |")
    out.append("|---|---|---|---|")
    for r in jsonl(L("memory.jsonl")):
        if r.get("failed"):
            out.append(f"| {r.get('tokens', '?'):,} | {failure(r)} | - | - |")
        else:
            out.append(f"| {r['tokens']:,} | {mib(r['device_peak_bytes'])} | {r['seconds']:.2f} | {r['tokens_per_s']:,.0f} |")
    out.append("")
    out.append("Held = the layers' weights, the per-device workspace (sized by the chunk) and cuBLAS's "
               "workspace; the CUDA context itself (a few hundred MiB per process) comes on top.")
    out.append("")

    out.append("### Full gradient, D=768, K=24, N=16, V=50280, chunk 2048")
    out.append("")
    out.append("| implementation | T | tokens/s | seconds | GPU memory (peak) |")
    out.append("|---|---|---|---|---|")
    for r in jsonl(L("tokens.jsonl")):
        name = f"adjsh cuda:0 ({r.get('storage', 'f32') if r.get('failed') else ('bf16' if 'bf16' in r.get('device', '') else 'f32')} storage)"
        if r.get("failed"):
            out.append(f"| {name} | {r.get('tokens', '?'):,} | {failure(r)} | - | - |")
        else:
            out.append(f"| {name} | {r['tokens']:,} | {r['tokens_per_s']:,.0f} | {r['seconds']:.3f} | {mib(r['device_peak_bytes'])} |")
    torch_rows = jsonl(L("torch.json"))
    t = torch_rows[0] if torch_rows else {"failed": True}
    if "unavailable" in t:
        out.append(f"| PyTorch autograd | - | unavailable: {t['unavailable']} | - | - |")
    elif t.get("failed"):
        out.append(f"| PyTorch autograd (cuda) | 4,096 | {failure(t)} | - | - |")
    else:
        out.append(f"| PyTorch autograd (cuda, {t.get('torch', '')}) | {t['tokens']:,} | {t['tokens_per_s']:,.0f} "
                   f"| {t['seconds']:.3f} | {mib(t.get('cuda_peak_bytes', 0))} |")
    out.append("")
    out.append("adjsh: best of 2 gradients after a warm-up, in-process (the coordinator's forward and head "
               "and the backward tasks on one GPU), host-device copies included. PyTorch: "
               "bench/torch_baseline.py --device cuda (the reference model of tests/torch, "
               "sequential scan over tokens, all activations kept).")
    out.append("<!-- gpu:end -->")
    print("\n".join(out))


if __name__ == "__main__":
    main()
