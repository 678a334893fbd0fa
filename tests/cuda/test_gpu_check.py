#!/usr/bin/env python3
"""scripts/gpu-check.sh and bench/gpu_report.py, without a GPU.

Usage:
  test_gpu_check.py --build BUILD_DIR

The GPU check runs where a GPU is lent for minutes: a wrong flag or a broken report there costs
the run. Here: its usage (--help, bad options); its plan (--plan: every step's limit; --quick's
at most 480 s in all, kill grace included, with the bundle's unpack too); a rehearsal of every
step with this build's binaries (`--rehearse --prebuilt BUILD_DIR`, full and --quick), which must
reach each binary's device check (every failed step's reason names the missing CUDA device, never
a flag), show the preflight and the skipped CUDA tests as what would fail on a GPU machine, and
render every table with one row per step; the dry run on this machine (`--quick --prebuilt`
without a GPU: exit 1 at the preflight, "no GPU", within 10 s, the report and logs copied to
$OUT); the plan's order (preflight, CUDA tests, the gradient through GPU workers, memory,
tokens/s, scan); the GPU machine's failures, with a stand-in nvidia-smi on PATH (a driver too old
for CUDA 13, no usable device: the preflight stops the check with exit 1; a device the probe
passes but CUDA tests that skip: exit 1; a benchmark that crashes, a sanitizer that finds an
error: exit 1, each step named, the rest still run); a rehearsal killed midway
(SIGKILL to all its processes, SIGTERM to the script), which must leave its logs and a report
naming the steps done; and the report's rows for results as the benchmarks print them on a GPU.
On a machine with a GPU this exits 77 (skipped): the check itself is the test there.
Standard library only; prints PASS/FAIL per case and exits 1 if any failed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import proc_stat  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu-check.sh")
REPORT = os.path.join(ROOT, "bench", "gpu_report.py")
failures = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        failures.append(name)


def run(args, timeout=600, env=None):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, cwd=ROOT, env=env)
    return p.returncode, p.stdout, p.stderr


QUICK_BUDGET_S = 480  # --quick: at most 8 minutes of GPU time


def parse_plan(out):
    """[(step, limit_s)], the total and the worst case (kill grace included) of a --plan."""
    steps = [(m.group(1), int(m.group(2))) for m in re.finditer(r"^step (\S+) +(\d+) s ", out, re.M)]
    m = re.search(r"^total (\d+) s of step limits; at most (\d+) s", out, re.M)
    return steps, (int(m.group(1)) if m else None), (int(m.group(2)) if m else None)


def steps_table(report):
    """{step: (limit, seconds, result)} from the report's table of steps."""
    rows = table(report, "Steps") or []
    out = {}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) >= 5:
            out[cells[1]] = (cells[2], cells[3], cells[4])
    return out


def fake_nvidia_smi(tmp, driver="580.159.03", cuda="13.0"):
    """A PATH with an nvidia-smi that answers as a GPU machine's would (an H200 with this driver)."""
    d = os.path.join(tmp, f"fake-smi-{driver}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "nvidia-smi"), "w") as f:
        f.write(f"""#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-stand-in)" ;;
  *noheader*) echo "{driver}" ;;
  *--query-gpu*) echo "index, name, driver_version, memory.total [MiB], compute_cap"
                 echo "0, NVIDIA H200, {driver}, 143771 MiB, 9.0" ;;
  *) echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}   |" ;;
esac
""")
    os.chmod(os.path.join(d, "nvidia-smi"), 0o755)
    return dict(os.environ, PATH=d + os.pathsep + os.environ.get("PATH", ""))


def session_pids(sid):
    """The live processes of session sid (timeout puts each step in a process group of its own)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = proc_stat(name)
            if fields and int(fields[3]) == sid and fields[0] != "Z":  # a zombie: not yet reaped
                pids.append(int(name))
    return pids


def kill_session(sid):
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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
    check("--help exits 0 and names every mode",
          rc == 0 and all(w in out for w in ("--bundle", "--rehearse", "--quick", "--plan")), f"rc={rc}")
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


def plan_cases(build):
    rc, out, err = run([SCRIPT, "--plan", "--quick", "--prebuilt", build])
    steps, total, worst = parse_plan(out)
    names = [n for n, _ in steps]
    print(out, end="")
    check("--plan --quick exits 0 and prints steps and a total", rc == 0 and steps and total is not None,
          f"rc={rc} out={out!r} err={err!r}")
    if not steps or total is None:
        return
    check("--plan's total is the sum of its step limits", total == sum(l for _, l in steps),
          f"{total} != {sum(l for _, l in steps)}")
    check(f"--quick's step limits fit {QUICK_BUDGET_S} s, kill grace included",
          worst is not None and worst <= QUICK_BUDGET_S, f"total {total} s, at most {worst} s")
    check("the preflight comes first and the device check before the tests",
          names[0] == "preflight.gpu" and "preflight.device" in names and "tests.cuda" in names
          and names.index("preflight.device") < names.index("tests.cuda"), names)
    first = lambda prefix: next((i for i, n in enumerate(names) if n.startswith(prefix)), -1)  # noqa: E731
    order = [first(p) for p in ("preflight.device", "tests.cuda", "tests.cli", "memory.", "tokens.", "scan.")]
    check("the plan's order: preflight, CUDA tests, gradient through GPU workers, memory, tokens/s, scan",
          -1 not in order and order == sorted(order), f"{names}")
    check("the CUDA tests run again with ADJSH_CUDA_SYNC=1 and under memcheck and racecheck",
          {"tests.cuda.sync", "sanitizer.memcheck", "sanitizer.racecheck"} <= set(names)
          and max(first("tests.cuda.sync"), first("sanitizer.")) < first("tests.cli"), f"{names}")
    mem = [int(n[len("memory.T"):]) for n in names if n.startswith("memory.T")]
    check("--quick: the CUDA tests, the scan bench, T up to 256K, one tokens/s point, no baseline",
          "scan.f32" in names and "scan.bf16" in names and mem and max(mem) == 262144
          and len([n for n in names if n.startswith("tokens.")]) == 1 and "torch" not in names, names)
    quick = dict(steps)

    rc, out, err = run([SCRIPT, "--plan", "--prebuilt", build])
    full, ftotal, fworst = parse_plan(out)
    print(out, end="")
    check("--plan (full) prints every step with its limit",
          rc == 0 and ftotal == sum(l for _, l in full) and "torch" in dict(full)
          and len([n for n, _ in full if n.startswith("memory.T")]) == 4
          and len([n for n, _ in full if n.startswith("tokens.")]) == 4, out)
    check("each --quick limit is at most the full mode's",
          all(n in dict(full) and l <= dict(full)[n] for n, l in quick.items()), f"{quick} {full}")

    # With the bundle (the GPU machine's usual case) and without binaries, in a copy of the script.
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "scripts"))
        copy = os.path.join(tmp, "scripts", "gpu-check.sh")
        shutil.copy(SCRIPT, copy)
        rc, out, err = run([copy, "--plan", "--quick"])
        check("--quick without binaries (no --prebuilt, no bundle): bad usage (2), saying why",
              rc == 2 and "--prebuilt" in err and "gpu-bundle.tar.xz" in err, f"rc={rc} err={err!r}")
        open(os.path.join(tmp, "gpu-bundle.tar.xz"), "w").close()
        rc, out, err = run([copy, "--plan", "--quick"])
        steps, total, worst = parse_plan(out)
        check(f"--quick with gpu-bundle.tar.xz (unpack first) fits {QUICK_BUDGET_S} s too",
              rc == 0 and "unpack" in dict(steps) and worst is not None and worst <= QUICK_BUDGET_S,
              f"rc={rc} {out!r}")
        os.remove(os.path.join(tmp, "gpu-bundle.tar.xz"))
        rc, out, err = run([copy, "--plan"])
        steps, total, worst = parse_plan(out)
        check("--plan without binaries lists the build steps",
              rc == 0 and {"build.configure", "build.compile"} <= set(dict(steps)), out)


def dry_run(build):
    """The --quick check on this machine (no GPU): it fails cleanly at the preflight, fast, and
    leaves the report and the logs in $OUT (the device tool's folder) too."""
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "out")
        os.makedirs(out_dir)
        env = dict(os.environ, OUT=out_dir)
        t0 = time.time()
        rc, out, err = run([SCRIPT, "--quick", "--prebuilt", build, "--logs", os.path.join(tmp, "logs"),
                            os.path.join(tmp, "r.md")], env=env)
        secs = time.time() - t0
        check(f"dry run --quick without a GPU: exit 1 at the preflight, 'no GPU', in {secs:.1f} s (< 10 s)",
              rc == 1 and "no GPU" in err and "preflight.gpu: FAILED" in err and secs < 10,
              f"rc={rc} {err[-1500:]}")
        got = sorted(os.listdir(out_dir))
        check("dry run: $OUT holds gpu-check.md and gpu-check-logs.tar.gz, nothing else",
              got == ["gpu-check-logs.tar.gz", "gpu-check.md"], f"{got}")
        if "gpu-check-logs.tar.gz" in got:
            with tarfile.open(os.path.join(out_dir, "gpu-check-logs.tar.gz")) as t:
                names = t.getnames()
            check("dry run: the logs' tarball has run.log, steps.tsv and the preflight's log",
                  all(f"logs/{n}" in names for n in ("run.log", "steps.tsv", "preflight.txt")), f"{names}")
            report = open(os.path.join(out_dir, "gpu-check.md")).read()
            check("dry run: $OUT's report shows the preflight failed",
                  steps_table(report).get("preflight.gpu", ("", "", ""))[2].startswith("FAILED: no GPU"),
                  report[-800:])


def rehearsal(build, quick=False):
    flag = ["--quick"] if quick else []
    label = "--quick rehearsal" if quick else "rehearsal"
    rc, out, err = run([SCRIPT, "--plan", "--prebuilt", build] + flag)
    plan, _, _ = parse_plan(out)
    with tempfile.TemporaryDirectory() as tmp:
        logs, report_path = os.path.join(tmp, "logs"), os.path.join(tmp, "report.md")
        rc, out, err = run([SCRIPT, "--rehearse", "--prebuilt", build, "--logs", logs, report_path] + flag,
                           timeout=900)
        check(f"{label} exits 0 (tests skipped, nothing failed)", rc == 0, f"rc={rc}\n{err[-2000:]}")
        for name, limit in plan:
            check(f"{label} prints step {name} with its limit ({limit} s)",
                  re.search(rf"\] {re.escape(name)} \(limit {limit} s\)", err) is not None, err[-2000:])
        for name, what in (("preflight.gpu", "no NVIDIA GPU"), ("preflight.device", "no usable CUDA device"),
                           ("tests.cuda", "skipped")):
            check(f"{label} shows {name} as what would fail on a GPU machine ({what})",
                  re.search(r"would fail here on a GPU machine: .*" + what, err) is not None, err[-3000:])
        check(f"{label} prints the binaries' CUDA runtime version",
              re.search(r"CUDA runtime \d+\.\d+", err) is not None, err[-2000:])
        for log in ("preflight.txt", "device_probe.txt", "cuda_tests.txt", "steps.tsv", "run.log"):
            check(f"{label} leaves logs/{log}", os.path.exists(os.path.join(logs, log)))
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
        done = steps_table(report)
        check(f"{label}: the report's table of steps has every step of the plan, each with a result",
              [n for n, _ in plan] == list(done) and all(
                  r[2] not in ("not reached",) and not r[2].startswith("started") for r in done.values())
              and done.get("report", ("", "", ""))[2] == "ok", f"{done}")
        check(f"{label}: the table shows each step's limit",
              all(done.get(n, ("",))[0] == f"{l} s" for n, l in plan), f"{done}")
        check(f"{label}: the table shows the preflight as what would fail",
              done.get("preflight.gpu", ("", "", ""))[2].startswith("would fail on a GPU machine")
              and done.get("preflight.device", ("", "", ""))[2].startswith("would fail on a GPU machine"),
              f"{done}")
        if quick:
            check("--quick report names its command", "Command: `scripts/gpu-check.sh --quick`" in report)
        expected = ({"Scan kernels": 2, "Device memory against T": 2, "Full gradient": 2} if quick else
                    {"Scan kernels": 2, "Device memory against T": 4, "Full gradient": 5})
        for title, n in expected.items():
            rows = table(report, title)
            check(f"{label}: table '{title}' has a row per step ({n})", rows is not None and len(rows) == n,
                  f"{rows}")
            for row in rows or []:
                cells = [c.strip() for c in row.strip("|").split("|")]
                reason = next((c for c in cells if c.startswith("failed") or c.startswith("unavailable")), None)
                ok = reason is not None and (
                    "no CUDA device" in reason or "unavailable" in reason)
                check(f"{label}: '{title}' row fails at the device check, not earlier: {cells[:2]}", ok, row)


def gpu_machine_failures(build):
    """The real check (no --rehearse) on a stand-in GPU machine: nvidia-smi answers, but..."""
    with tempfile.TemporaryDirectory() as tmp:
        logs, report_path = os.path.join(tmp, "logs"), os.path.join(tmp, "report.md")
        # ... the driver is too old for CUDA 13: stop at the preflight.
        env = fake_nvidia_smi(tmp, driver="550.54.15", cuda="12.4")
        rc, out, err = run([SCRIPT, "--quick", "--prebuilt", build, "--logs", logs, report_path], env=env)
        steps = steps_table(open(report_path).read()) if os.path.exists(report_path) else {}
        check("GPU machine, driver too old for CUDA 13: exit 1 at the preflight, saying why",
              rc == 1 and "CUDA 13" in err and "550.54.15" in err
              and steps.get("preflight.gpu", ("", "", ""))[2].startswith("FAILED")
              and steps.get("tests.cuda", ("", "", ""))[2] == "not reached", f"rc={rc} {steps} {err[-1500:]}")
        # ... the binaries cannot use the device (here: no device behind the stand-in).
        env = fake_nvidia_smi(tmp)
        rc, out, err = run([SCRIPT, "--quick", "--prebuilt", build, "--logs", logs, report_path], env=env)
        steps = steps_table(open(report_path).read()) if os.path.exists(report_path) else {}
        check("GPU machine, no usable device: exit 1 at the preflight's device check, saying why",
              rc == 1 and "no usable CUDA device" in err and "580.159.03" in err
              and re.search(r"CUDA runtime \d+\.\d+", err) is not None
              and steps.get("preflight.device", ("", "", ""))[2].startswith("FAILED")
              and steps.get("tests.cuda", ("", "", ""))[2] == "not reached", f"rc={rc} {steps} {err[-1500:]}")
        # ... the device check passes, but CUDA tests skip themselves: the check fails.
        bundle = os.path.join(tmp, "bundle")
        os.makedirs(os.path.join(bundle, "bin"))
        open(os.path.join(bundle, "BUNDLE.txt"), "w").write("revision: stand-in\ncuda: release 13.0, sm_80 sm_90\n")
        scripts = {
            "cuda_backend_test": """case "$*" in
  *--gtest_filter=*) echo '[==========] 1 test from 1 test suite ran. (1 ms total)'
                     echo '[  PASSED  ] 1 test.' ;;
  *) echo '[ RUN      ] CudaTest.A'; echo 'cuda_backend_test.cc:58: Skipped'
     echo 'no CUDA device: stand-in'; echo '[  SKIPPED ] CudaTest.A (0 ms)'
     echo '[==========] 2 tests from 1 test suite ran. (1 ms total)'
     echo '[  PASSED  ] 1 test.'; echo '[  SKIPPED ] 1 test, listed below:'
     echo '[  SKIPPED ] CudaTest.A' ;;
esac""",
            "kernels_test": "echo '[==========] 9 tests from 2 test suites ran. (5 ms total)'; echo '[  PASSED  ] 9 tests.'",
            "launch_check_test": "echo '[==========] 4 tests from 1 test suite ran. (5 ms total)'; echo '[  PASSED  ] 4 tests.'",
            "cuda_scan_bench": "echo 'cuda_scan_bench: stand-in' >&2; exit 1",
            "grad_bench": "echo 'grad_bench: stand-in' >&2; exit 1",
            "adjsh": "echo 'adjsh: stand-in' >&2; exit 1",
        }
        for name, body in scripts.items():
            path = os.path.join(bundle, "bin", name)
            open(path, "w").write("#!/bin/sh\n" + body + "\n")
            os.chmod(path, 0o755)
        rc, out, err = run([SCRIPT, "--quick", "--prebuilt", bundle, "--logs", logs, report_path],
                           env=env, timeout=600)
        report = open(report_path).read() if os.path.exists(report_path) else ""
        steps = steps_table(report)
        cuda = steps.get("tests.cuda", ("", "", ""))[2]
        check("GPU machine, a CUDA test skipped: the check fails (exit 1), the step says why",
              rc == 1 and steps.get("preflight.device", ("", "", ""))[2] == "ok"
              and cuda.startswith("FAILED") and "skipped on a GPU machine" in cuda
              and re.search(r"cuda_backend_test: exit 1, 1 passed, 0 failed, [1-9]\d* skipped", report),
              f"rc={rc} {steps} {err[-1500:]}")
        check("GPU machine: the steps after a failed test still run, and the report is complete",
              steps.get("report", ("", "", ""))[2] == "ok" and report.rstrip().endswith("<!-- gpu:end -->"),
              f"{steps}")

        # ... the tests pass, but a benchmark crashes (a signal) and memcheck finds an error: the
        # check fails naming both, and every step still runs.
        def write(name, body):
            path = os.path.join(bundle, "bin", name)
            open(path, "w").write("#!/bin/sh\n" + body + "\n")
            os.chmod(path, 0o755)
        write("cuda_backend_test", """case "$*" in
  *=CudaTest.UnsupportedOpsAreRefused) n=1 ;;
  *) n=3 ;;
esac
[ -n "$ADJSH_CUDA_SYNC" ] && echo 'adjsh: ADJSH_CUDA_SYNC=1: the device is synchronised after every kernel launch'
echo "[==========] $n tests from 1 test suite ran. (1 ms total)"
echo "[  PASSED  ] $n tests."
""")
        write("grad_bench", "echo 'grad_bench: about to fault' >&2; kill -SEGV $$")
        sanitizer_dir = os.path.join(tmp, "sanitizer")
        os.makedirs(sanitizer_dir)
        with open(os.path.join(sanitizer_dir, "compute-sanitizer"), "w") as f:
            f.write("""#!/bin/sh
tool=memcheck
while [ $# -gt 0 ]; do
  case "$1" in --tool) tool=$2; shift 2 ;; --error-exitcode) shift 2 ;; --*) shift ;; *) break ;; esac
done
"$@" || exit $?
if [ "$tool" = memcheck ]; then
  echo '========= Invalid __global__ write of size 4 bytes'
  echo '========= ERROR SUMMARY: 2 errors'
  exit 99
fi
echo '========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)'
""")
        os.chmod(os.path.join(sanitizer_dir, "compute-sanitizer"), 0o755)
        env2 = dict(env, PATH=sanitizer_dir + os.pathsep + env["PATH"])
        rc, out, err = run([SCRIPT, "--quick", "--prebuilt", bundle, "--logs", logs, report_path],
                           env=env2, timeout=600)
        report = open(report_path).read() if os.path.exists(report_path) else ""
        steps = steps_table(report)
        failed_list = err.split("did not pass:", 1)[1] if "did not pass:" in err else ""
        crashed = [n for n in steps if n.startswith(("memory.", "tokens.")) and "crashed (SIGSEGV)" in steps[n][2]]
        check("GPU machine, a benchmark crashes (SIGSEGV): the check fails (exit 1), each crashed step named",
              rc == 1 and len(crashed) == 3 and all(n in failed_list for n in crashed), f"rc={rc} {steps} {err[-1500:]}")
        check("GPU machine, memcheck finds errors: that step fails, saying how many; racecheck passes",
              steps.get("sanitizer.memcheck", ("", "", ""))[2].startswith("FAILED: memcheck found 2 error(s): Invalid")
              and "sanitizer.memcheck" in failed_list and steps.get("sanitizer.racecheck", ("", "", ""))[2] == "ok",
              f"{steps}")
        check("GPU machine: the CUDA tests with ADJSH_CUDA_SYNC=1 pass; the steps after the failures ran",
              steps.get("tests.cuda.sync", ("", "", ""))[2] == "ok" and steps.get("scan.bf16", ("", "", ""))[2] != "not reached"
              and steps.get("report", ("", "", ""))[2] == "ok", f"{steps}")
        cli_path = os.path.join(logs, "cli_device.txt")
        cli_log = open(cli_path).read() if os.path.exists(cli_path) else ""
        check("GPU machine: test_device.py runs with --expect-gpu (a refused cuda:0 fails it)",
              "FAIL --expect-gpu: grad --device cuda:0 runs" in cli_log
              and "tests.cli" in failed_list, cli_log[-800:])


def killed_rehearsal(build, sig):
    """A rehearsal stopped after its first steps still leaves its logs and a report naming them."""
    label = "SIGKILL to all its processes" if sig == signal.SIGKILL else "SIGTERM to the script"
    with tempfile.TemporaryDirectory() as tmp:
        logs, report_path = os.path.join(tmp, "logs"), os.path.join(tmp, "report.md")
        p = subprocess.Popen([SCRIPT, "--rehearse", "--prebuilt", build, "--logs", logs, report_path],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        steps_tsv = os.path.join(logs, "steps.tsv")
        done = []
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            if os.path.exists(steps_tsv):
                done = [ln.split("\t")[0] for ln in open(steps_tsv).read().splitlines() if ln]
                if len(done) >= 3 and sig == signal.SIGKILL:
                    break
                # SIGTERM: inside a long step (tests.cli runs the CLI tests, tens of seconds).
                run_log = os.path.join(logs, "run.log")
                if len(done) >= 4 and "] tests.cli (limit" in open(run_log).read():
                    time.sleep(1)
                    break
            time.sleep(0.05)
        finished_early = p.poll() is not None
        t_kill = time.time()
        if sig == signal.SIGKILL:
            kill_session(p.pid)
        else:
            p.send_signal(signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_session(p.pid)
            _, err = p.communicate()
        stop_s = time.time() - t_kill
        time.sleep(0.5)
        left = session_pids(p.pid)
        kill_session(p.pid)
        check(f"killed ({label}) midway: it had not finished, and had done steps {done}",
              not finished_early and len(done) >= 3, f"finished early: {finished_early}, done {done}")
        if sig == signal.SIGTERM:
            check("SIGTERM: the script stops within seconds, exit 143, and its running step too",
                  p.returncode == 143 and stop_s < 15 and not left,
                  f"rc={p.returncode} after {stop_s:.1f} s, left {left}; {err[-1000:]}")
        report = open(report_path).read() if os.path.exists(report_path) else ""
        check(f"killed ({label}): the partial report exists, delimited",
              report.startswith("<!-- gpu:begin -->") and report.rstrip().endswith("<!-- gpu:end -->"),
              report[-500:])
        table_ = steps_table(report)
        names = list(table_)
        check(f"killed ({label}): the report names the steps done, with their results",
              all(n in table_ and table_[n][2] not in ("not reached",) and not table_[n][2].startswith("started")
                  for n in done[:3]), f"{done} {table_}")
        check(f"killed ({label}): the steps after the stop are 'not reached'",
              names and table_[names[-1]][2] == "not reached", f"{table_}")
        if sig == signal.SIGTERM:
                check("SIGTERM: the report says it was stopped, and in which step (tests.cli)",
                  "Stopped by SIGTERM" in report and "during tests.cli" in report
                  and table_.get("tests.cli", ("", "", ""))[2] == "stopped by SIGTERM"
                  and not any(r[2].startswith("started") for r in table_.values()), report[-1500:])
        for log in ("preflight.txt", "device_probe.txt", "cuda_tests.txt", "run.log"):
            check(f"killed ({label}): logs/{log} of a step done is there", os.path.exists(os.path.join(logs, log)))
        tests = open(os.path.join(logs, "cuda_tests.txt")).read() if os.path.exists(os.path.join(logs, "cuda_tests.txt")) else ""
        check(f"killed ({label}): the CUDA tests' log is complete (flushed)", "[==========]" in tests, tests[-500:])
        run_log = open(os.path.join(logs, "run.log")).read() if os.path.exists(os.path.join(logs, "run.log")) else ""
        check(f"killed ({label}): run.log names the steps done",
              all(re.search(rf"\] {re.escape(n)} \(limit \d+ s\)", run_log) for n in done[:3]), run_log[-1000:])


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
    build = os.path.abspath(a.build)
    usage_cases()
    plan_cases(build)
    dry_run(build)
    report_rows()
    gpu_machine_failures(build)
    killed_rehearsal(build, signal.SIGKILL)
    killed_rehearsal(build, signal.SIGTERM)
    rehearsal(build, quick=True)
    rehearsal(build)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
