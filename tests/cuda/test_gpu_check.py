#!/usr/bin/env python3
"""scripts/gpu-check.sh and bench/gpu_report.py, without a GPU.

Usage:
  test_gpu_check.py --build BUILD_DIR

The GPU check runs where a GPU is lent for minutes: a wrong flag or a broken report there costs
the run. Here: its usage (--help, bad options); a rehearsal of every step with this build's
binaries (`--rehearse --prebuilt BUILD_DIR`), which must reach each binary's device check (every
failed step's reason names the missing CUDA device, never a flag) and render every table with
one row per step; and the report's rows for results as the benchmarks print them on a GPU.
On a machine with a GPU this exits 77 (skipped): the check itself is the test there.
Standard library only; prints PASS/FAIL per case and exits 1 if any failed.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu-check.sh")
REPORT = os.path.join(ROOT, "bench", "gpu_report.py")
failures = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        failures.append(name)


def run(args, timeout=600):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def table(report, title):
    """The data rows of the table under the heading that starts with title."""
    sec = report.split("### " + title, 1)
    if len(sec) < 2:
        return None
    body = sec[1].split("###", 1)[0]
    rows = [ln for ln in body.splitlines() if ln.startswith("|")]
    return rows[2:]  # header and rule


def usage_cases():
    rc, out, err = run([SCRIPT, "--help"])
    check("--help exits 0 and names every mode", rc == 0 and "--bundle" in out and "--rehearse" in out,
          f"rc={rc}")
    rc, out, err = run([SCRIPT, "--no-such-option"])
    check("an unknown option is bad usage (2), named", rc == 2 and "--no-such-option" in err,
          f"rc={rc} err={err!r}")
    rc, out, err = run([SCRIPT, "--prebuilt"])
    check("--prebuilt without a directory is bad usage (2)", rc == 2, f"rc={rc}")
    with tempfile.TemporaryDirectory() as tmp:
        logs = os.path.join(tmp, "logs")
        rc, out, err = run([SCRIPT, "--logs", logs, os.path.join(tmp, "r.md")])
        check("without a GPU and without --rehearse: exit 1, saying why",
              rc == 1 and "no NVIDIA GPU" in err, f"rc={rc} err={err!r}")
        rc, out, err = run([SCRIPT, "--rehearse", "--prebuilt", os.path.join(tmp, "none"),
                            "--logs", logs, os.path.join(tmp, "r.md")])
        check("--prebuilt of a missing directory: exit 1, named", rc == 1 and "none" in err,
              f"rc={rc} err={err!r}")


def rehearsal(build):
    with tempfile.TemporaryDirectory() as tmp:
        logs, report_path = os.path.join(tmp, "logs"), os.path.join(tmp, "report.md")
        rc, out, err = run([SCRIPT, "--rehearse", "--prebuilt", build, "--logs", logs, report_path],
                           timeout=900)
        check("rehearsal exits 0 (tests skipped, nothing failed)", rc == 0, f"rc={rc}\n{err[-2000:]}")
        if not os.path.exists(report_path):
            check("rehearsal writes the report", False, err[-2000:])
            return
        report = open(report_path).read()
        check("the report is delimited for docs/BENCHMARKS.md",
              report.startswith("<!-- gpu:begin -->") and report.rstrip().endswith("<!-- gpu:end -->"))
        check("the report names the binaries it ran", f"Binaries: {build}" in report)
        m = re.search(r"cuda_backend_test: exit (\d+), (\d+) passed, (\d+) failed, (\d+) skipped", report)
        check("the CUDA tests ran and skipped themselves",
              m is not None and m.group(1) == "0" and m.group(3) == "0" and int(m.group(4)) > 0,
              m.group(0) if m else "no summary line")
        check("backend and CLI device tests passed",
              "(kernels_test ParseDevice*:Backend*): exit 0" in report
              and "(tests/cli/test_device.py): exit 0" in report)
        expected = {"Scan kernels": 2, "Device memory against T": 4, "Full gradient": 5}
        for title, n in expected.items():
            rows = table(report, title)
            check(f"table '{title}' has a row per step ({n})", rows is not None and len(rows) == n,
                  f"{rows}")
            for row in rows or []:
                cells = [c.strip() for c in row.strip("|").split("|")]
                reason = next((c for c in cells if c.startswith("failed") or c.startswith("unavailable")), None)
                ok = reason is not None and (
                    "no CUDA device" in reason or "unavailable" in reason)
                check(f"'{title}' row fails at the device check, not earlier: {cells[:2]}", ok, row)


def report_rows():
    """Rows as the benchmarks print them on a GPU, rendered with their numbers."""
    with tempfile.TemporaryDirectory() as logs:
        def write(name, rows):
            with open(os.path.join(logs, name), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        open(os.path.join(logs, "nvidia-smi.txt"), "w").write("GPU 0: NVIDIA H200 (UUID: x)\n")
        open(os.path.join(logs, "cuda_tests.txt"), "w").write(
            "[ adjsh-cuda ] K=2 T=97 chunk=7 f32 max_rel_err=3.0e-06 (in_proj) whole_rel_err=1.0e-06\n"
            "[ adjsh-cuda ] K=2 T=97 chunk=7 bf16 max_rel_err=9.0e-03 (x_proj) whole_rel_err=4.0e-03\n"
            "[  PASSED  ] 15 tests.\n")
        write("scan.jsonl", [{"device": "NVIDIA H200", "storage": "f32", "len": 2048, "inner": 1536,
                              "state": 16, "copy_gb_s": 4300.0, "forward_ms": 0.1, "forward_gb_s": 2500.0,
                              "forward_of_copy": 0.58, "backward_ms": 0.3, "backward_gb_s": 2200.0,
                              "backward_of_copy": 0.51}])
        row = {"impl": "adjsh", "tokens": 65536, "seconds": 1.5, "tokens_per_s": 43690.7,
               "device": "cuda:0", "device_name": "NVIDIA H200", "device_peak_bytes": 123 << 20}
        write("memory.jsonl", [row, {"tokens": 4194304, "failed": True, "why": "out of memory"}])
        write("tokens.jsonl", [dict(row, tokens=4096, device="cuda:0 (bf16 storage)")])
        write("torch.json", [{"tokens": 4096, "tokens_per_s": 1000.0, "seconds": 4.1, "torch": "2.11.0",
                              "cuda_peak_bytes": 2 << 30}])
        rc, out, err = run([sys.executable, REPORT, "--logs", logs, "--cuda-tests-rc", "0",
                            "--backend-tests-rc", "0", "--cli-tests-rc", "0", "--seconds", "400",
                            "--binaries", "gpu-bundle: revision: abc"])
        check("the report renders results", rc == 0, err[-2000:])
        want = ["| f32 | 1 | 3.00e-06 (in_proj) | 1.00e-06 |", "| bf16 | 1 | 9.00e-03 (x_proj) |",
                "| 4300 GB/s | 2500 GB/s (0.100 ms) | 58% |", "| 65,536 | 123.0 MiB | 1.50 | 43,691 |",
                "| 4,194,304 | failed: out of memory |", "| adjsh cuda:0 (bf16 storage) | 4,096 | 43,691 |",
                "| PyTorch autograd (cuda, 2.11.0) | 4,096 | 1,000 |", "on GPU 0: NVIDIA H200",
                "Binaries: gpu-bundle: revision: abc."]
        for w in want:
            check(f"report shows {w!r}", w in out, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="a CMake build tree with the CUDA backend")
    a = ap.parse_args()
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        print("SKIPPED: this machine has a GPU: run scripts/gpu-check.sh itself")
        return 77
    usage_cases()
    report_rows()
    rehearsal(os.path.abspath(a.build))
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
