"""Shared helpers of the claims benchmarks (bench/claims_*.py): running a command while tracking
the peak resident memory of every process it starts, a results file that keeps partial results,
a safetensors reader, and the markers of docs/BENCHMARKS.md.
"""
import fcntl
import json
import os
import random
import re
import struct
import subprocess
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "claims")   # measured results (JSON) and figures (PNG)
TORCH_PY = "/usr/bin/python3"


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _status(pid):
    """(VmHWM bytes, first argument after the executable) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            hwm = next((int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:")), 0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        return hwm, (argv[1].decode() if len(argv) > 1 else "")
    except (OSError, StopIteration):
        return None


def run_tracked(cmd, poll_s=0.2, **kw):
    """Runs cmd to completion. Returns (stdout, stderr, seconds, peaks) where peaks maps each
    process of the tree (the command itself as 'main', the others by pid and first argument,
    e.g. 'worker:1234') to its peak RSS in bytes. The command's own peak is exact (wait4); the
    others are the last VmHWM read before they exited (sampled every poll_s seconds)."""
    start = time.time()
    out_path, err_path = f"/tmp/claims.{os.getpid()}.out", f"/tmp/claims.{os.getpid()}.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, **kw)
        peaks = {}
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                break
            stack = list(_children(p.pid))
            while stack:
                c = stack.pop()
                s = _status(c)
                if s:
                    peaks[f"{s[1]}:{c}"] = max(peaks.get(f"{s[1]}:{c}", 0), s[0])
                stack.extend(_children(c))
            time.sleep(poll_s)
    p.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.time() - start
    stdout, stderr = open(out_path).read(), open(err_path).read()
    os.unlink(out_path), os.unlink(err_path)
    if p.returncode != 0:
        raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}\n{stderr[-2000:]}")
    peaks["main"] = ru.ru_maxrss * 1024  # includes reaped children: see 'coordinator' rows
    return stdout, stderr, seconds, peaks


class Results:
    """A JSON list of result records on disk, rewritten after every record."""

    def __init__(self, path):
        self.path = path
        self.rows = json.load(open(path)) if os.path.exists(path) else []

    def has(self, **key):
        return any(all(r.get(k) == v for k, v in key.items()) for r in self.rows)

    def add(self, row):
        """Appends row to the file as it is now (another process may have added rows)."""
        row["measured_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.rows = json.load(open(self.path)) if os.path.exists(self.path) else []
            self.rows.append(row)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.rows, f, indent=1)
            os.replace(tmp, self.path)


def read_safetensors(path):
    """{name: float64 numpy array} of a safetensors file (F32/F64 tensors)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": np.float32, "F64": np.float64}[h["dtype"]]
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dt).astype(np.float64).reshape(h["shape"])
    return out


def param_group(name):
    """The parameter group of an HF parameter name: 'embeddings', 'norms', or the mixer
    parameter ('in_proj', 'A_log', ...) over all layers."""
    if "embeddings" in name:
        return "embeddings"
    if "norm" in name:
        return "norms"
    m = re.search(r"mixer\.(\w+?)(\.weight|\.bias)?$", name)
    return m.group(1) + ("" if not m.group(2) or m.group(2) == ".weight" else "_bias")


def grad_error(exact, approx):
    """Relative L2 error and cosine of approx against exact, overall and per parameter group."""
    def err(names):
        e = np.concatenate([exact[n].ravel() for n in names])
        a = np.concatenate([approx[n].ravel() for n in names])
        ne, na = np.linalg.norm(e), np.linalg.norm(a)
        return {"rel_l2": float(np.linalg.norm(a - e) / ne) if ne > 0 else 0.0,
                "cosine": float(e @ a / (ne * na)) if ne > 0 and na > 0 else 0.0}
    names = sorted(n for n in exact if n != "loss")
    groups = {}
    for n in names:
        groups.setdefault(param_group(n), []).append(n)
    return {"overall": err(names), "groups": {g: err(ns) for g, ns in sorted(groups.items())}}


def replace_section(name, title, command, body):
    """Writes body into docs/BENCHMARKS.md between the `name` markers (before the notes)."""
    path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    text = open(path).read()
    block = (f"<!-- {name}:begin -->\n## {title}\n\nCommand: `{command}`\n\n{body.rstrip()}\n"
             f"<!-- {name}:end -->")
    if f"<!-- {name}:begin -->" in text:
        text = re.sub(rf"<!-- {name}:begin -->.*<!-- {name}:end -->", lambda _: block, text,
                      flags=re.S)
    else:
        text = text.replace("## Notes on the measurements",
                            block + "\n\n## Notes on the measurements")
    with open(path, "w") as f:
        f.write(text)


def save_figure(fig, axes, path, legend_size=8, grid="major"):
    """A claim's figure as docs/claims/ has them: grid and legend on each axis, tight, 110 dpi."""
    for ax in axes:
        ax.grid(True, which=grid, alpha=0.3)
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_random_tokens(path, n, vocab, seed=5):
    """n token ids uniform over [0, vocab), .u16 (little-endian), the same for a seed."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(b"".join(rng.randrange(vocab).to_bytes(2, "little") for _ in range(n)))


def measured_span(rows):
    """'Measured FIRST to LAST UTC' over rows' measured_utc stamps."""
    when = sorted(r["measured_utc"] for r in rows)
    return f"Measured {when[0]} to {when[-1]} UTC"


def linear_fit(points):
    """(intercept, slope) of the least-squares line through (x, y) points."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    if len(points) == 1:
        return 0.0, y[0] / x[0]
    s, i = np.polyfit(x, y, 1)
    return float(i), float(s)


STEP_LINE = re.compile(r"^step (\d+)/\d+ \[[^\]]*\] loss ([\d.]+) \| ([\d.]+)K tok/s(.*)$")
ACC = re.compile(r"acc (\d+)/(\d+)")


def train_curve(build, args, work):
    """Runs `nice adjsh train ARGS` with a fresh checkpoint directory; returns (the per-step
    records [{step, loss, tokens_per_s[, correct, counted]}], the checkpoint directory)."""
    ck = tempfile.mkdtemp(dir=work)
    _, err, _, _ = run_tracked(["nice", f"{build}/cli/adjsh", "train", "--checkpoint-dir", ck,
                                "--checkpoint-every", "0", *args])
    steps = []
    for line in err.splitlines():
        m = STEP_LINE.match(line)
        if not m:
            continue
        r = {"step": int(m.group(1)), "loss": float(m.group(2)),
             "tokens_per_s": float(m.group(3)) * 1000}
        acc = ACC.search(m.group(4))
        if acc:
            r["correct"], r["counted"] = int(acc.group(1)), int(acc.group(2))
        steps.append(r)
    with open(os.path.join(ck, "latest")) as f:  # names the last step's folder
        return steps, os.path.join(ck, f.read().strip())


def grad_file(build, model, tokens, out, *extra):
    """`adjsh grad` of one sequence; returns {name: array} of the written gradient."""
    run_tracked(["nice", f"{build}/cli/adjsh", "grad", "--model", model, "--tokens", tokens,
                 "--out", out, "--quiet", *extra])
    return read_safetensors(out)


def measure_report_cli(doc, measure, report, extra=None):
    """The command line every claims script shares: `measure` (append results) or `report`
    (redraw the figure, rewrite the section), --build and --work; extra(parser) adds more."""
    import argparse
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["measure", "report"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=None, help="scratch directory (default: $TMPDIR)")
    if extra:
        extra(ap)
    a = ap.parse_args()
    measure(a) if a.what == "measure" else report(a)
