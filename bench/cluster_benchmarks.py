#!/usr/bin/python3
"""Local-cluster overhead: step time of `adjsh train` with worker processes against in-process
training, and the bytes sent per token per step.

  /usr/bin/python3 bench/cluster_benchmarks.py [--build build]

Model D=128, K=4, N=16, V=256, context 16,384 tokens, 6 steps (the first is not timed), the
built-in corpus. Writes the table into docs/BENCHMARKS.md between the `cluster` markers.
"""
import argparse
import os
import re
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = re.compile(r"^step (\d+)/\d+ .*\| ([\d.]+)K tok/s")
WIRE = re.compile(r"per token per step (\d+) B out, (\d+) B back")


def train(build, workers, chunk, work):
    ck = tempfile.mkdtemp(dir=work)
    cmd = [f"{build}/cli/adjsh", "train", "--steps", "6", "--chunk", str(chunk),
           "--workers", str(workers), "--checkpoint-dir", ck, "--checkpoint-every", "0"]
    start = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    total = time.time() - start
    rates = [float(m.group(2)) * 1000 for line in r.stderr.splitlines()
             if (m := STEP.match(line)) and int(m.group(1)) > 1]
    step_s = sum(16384 / x for x in rates) / len(rates)
    wire = WIRE.search(r.stderr)
    return {"step_s": step_s, "total_s": total,
            "out": int(wire.group(1)) if wire else 0, "back": int(wire.group(2)) if wire else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for chunk in (256, 1024):
            base = train(build, 0, chunk, work)
            rows.append((chunk, 0, base, 1.0))
            for w in (1, 2):
                r = train(build, w, chunk, work)
                rows.append((chunk, w, r, r["step_s"] / base["step_s"]))
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on this machine (2 cores): `adjsh train` "
             "D=128, K=4, N=16, V=256, context 16,384, steps 2-6 timed. The workers are processes "
             "on the same 2 cores as the coordinator, so this measures the protocol's overhead, "
             "not a speed-up.", "",
             "| chunk | workers | step time | vs in-process | bytes/token/step to workers | bytes/token/step back |",
             "|---|---|---|---|---|---|"]
    for chunk, w, r, ratio in rows:
        lines.append(f"| {chunk} | {w or 'in-process'} | {r['step_s']:.2f} s | {ratio:.2f}x | "
                     f"{r['out'] if w else '-'} | {r['back'] if w else '-'} |")
    lines += ["", "Back: each task returns its layer's whole partial gradient (3 Di D + ... "
              "numbers) plus dL/du for its rows, so larger chunks send less per token; out: the "
              "layer-input and dL/du rows of the chunk, its state and incoming adjoint, and each "
              "layer's parameters once per step per worker."]
    section = "\n".join(lines)
    print(section)
    path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    text = open(path).read()
    block = ("<!-- cluster:begin -->\n## Distributed: local cluster overhead\n\n"
             "Command: `/usr/bin/python3 bench/cluster_benchmarks.py`\n\n" + section +
             "\n<!-- cluster:end -->")
    if "<!-- cluster:begin -->" in text:
        text = re.sub(r"<!-- cluster:begin -->.*<!-- cluster:end -->", lambda _: block, text, flags=re.S)
    else:
        text = text.replace("## Notes on the measurements", block + "\n\n## Notes on the measurements")
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
