#!/usr/bin/env python3
"""End-to-end checks of adjsh's command-line behaviour (docs/USAGE.md).

Usage:
  test_cli.py --adjsh build/cli/adjsh [--keep]

Standard library only (runs under /usr/bin/python3 or any other Python >= 3.6). Every adjsh call
runs under subprocess with a 60 s timeout, so a hang is a failure rather than a stuck test. For
each case we check:
  * the exit code: 0 for success and --help, 1 for a failure reported by adjsh, 2 for bad usage;
  * that the process was not killed by a signal (returncode >= 0) and did not crash
    (no "Segmentation fault" / "terminate called" / "Aborted" / sanitizer report on stderr);
  * that stderr names the problem (the tensor, the config key, the flag, the token position...);
  * that nothing was written to --out on failure (the output path does not exist afterwards).

Cases: --help of every command and usage errors; a valid tiny model (.u32 and .u16 tokens) whose
output holds every parameter and `loss`; broken model directories (missing pieces, truncated or
corrupt safetensors, wrong / missing / extra / NaN tensors, impossible config.json values); broken
token files; bad `adjsh init` / `adjsh tokenize` inputs; and gradients that must not depend on
--chunk / --threads (f64, 1e-12 relative).

Prints one PASS/FAIL line per case and `N passed, N failed` last; exits 1 if any case failed.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import children, wait_for  # noqa: E402

TIMEOUT_S = 60
# A flag with an invalid value (--chunk 0, --dtype f16, ...) is bad usage, like an unknown flag.
BAD_VALUE_RC = 2
CRASH_MARKERS = ("Segmentation fault", "terminate called", "Aborted", "core dumped",
                 "AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:",
                 "Check failed", "ADJSH_CHECK")

# The tiny model every case starts from: adjsh init --hidden-size 8 --layers 2 --vocab-size 11
# --state-size 4 (expand 2 -> Di 16, conv_kernel 4, dt rank auto = 1).
D, K, V, N = 8, 2, 11, 4
DI, W, R = 2 * D, 4, 1
INIT_ARGS = ["--hidden-size", str(D), "--layers", str(K), "--vocab-size", str(V),
             "--state-size", str(N)]
T_TOKENS = 23  # not a multiple of 3 or 5: the chunked runs have ragged last chunks


def expected_shapes():
    shapes = {"backbone.embeddings.weight": [V, D], "backbone.norm_f.weight": [D]}
    for k in range(K):
        p = "backbone.layers.%d." % k
        shapes[p + "norm.weight"] = [D]
        shapes[p + "mixer.in_proj.weight"] = [2 * DI, D]
        shapes[p + "mixer.conv1d.weight"] = [DI, 1, W]
        shapes[p + "mixer.conv1d.bias"] = [DI]
        shapes[p + "mixer.x_proj.weight"] = [R + 2 * N, DI]
        shapes[p + "mixer.dt_proj.weight"] = [DI, R]
        shapes[p + "mixer.dt_proj.bias"] = [DI]
        shapes[p + "mixer.A_log"] = [DI, N]
        shapes[p + "mixer.D"] = [DI]
        shapes[p + "mixer.out_proj.weight"] = [D, DI]
    return shapes


# ----------------------------------------------------------------------------------------------
# safetensors: u64 little-endian header length H, H bytes of JSON, then the data region.

DTYPE_FMT = {"F64": ("d", 8), "F32": ("f", 4)}


def st_read(path):
    """Returns (header dict without __metadata__, metadata or None, data bytes)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: %d bytes, no header length" % (path, len(blob)))
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        raise ValueError("%s: header length %d runs past the end" % (path, hlen))
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    return header, meta, blob[8 + hlen:]


def st_tensor_bytes(header, data):
    """{name: (dtype, shape, raw bytes)}."""
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], list(e["shape"]), data[b:end])
    return out


def st_values(dtype, shape, raw):
    fmt, size = DTYPE_FMT[dtype]
    n = 1
    for d in shape:
        n *= d
    if len(raw) != n * size:
        raise ValueError("tensor bytes %d != %d * %d" % (len(raw), n, size))
    return list(struct.unpack("<%d%s" % (n, fmt), raw))


def st_write(path, tensors, meta=None):
    """tensors: {name: (dtype, shape, raw bytes)}, written in name order."""
    header = {}
    if meta is not None:
        header["__metadata__"] = meta
    offset = 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name][2])


def write_tokens(path, ids):
    fmt = "H" if path.endswith(".u16") else "I"
    with open(path, "wb") as f:
        f.write(struct.pack("<%d%s" % (len(ids), fmt), *ids))


# ----------------------------------------------------------------------------------------------
# Running adjsh and recording results.

class Result(object):
    def __init__(self, rc, out, err, timed_out=False):
        self.rc, self.out, self.err, self.timed_out = rc, out, err, timed_out


class CaseFailed(Exception):
    pass


class Runner(object):
    def __init__(self, adjsh, work, verbose=False):
        self.adjsh, self.work, self.verbose = adjsh, work, verbose
        self.passed, self.failed = 0, 0
        self.failures = []

    def run(self, args):
        cmd = [self.adjsh] + list(args)
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=TIMEOUT_S, cwd=self.work)
        except subprocess.TimeoutExpired as e:
            return Result(None, _text(e.stdout), _text(e.stderr), timed_out=True)
        return Result(p.returncode, _text(p.stdout), _text(p.stderr))

    def case(self, name, fn):
        try:
            fn()
        except CaseFailed as e:
            self.failed += 1
            self.failures.append(name)
            print("FAIL %s: %s" % (name, e))
        except Exception:  # a bug in the test or an unreadable output: report, go on
            self.failed += 1
            self.failures.append(name)
            print("FAIL %s: exception in the test:\n%s" % (name, _indent(traceback.format_exc())))
        else:
            self.passed += 1
            print("PASS %s" % name)
        sys.stdout.flush()

    def expect(self, args, rc, err_has=(), out_has=(), out_path=None, rc_any=None, err_lacks=()):
        """Runs adjsh and checks the exit code, crash markers, stderr / stdout substrings (all
        case-sensitive; err_lacks: substrings stderr must not contain), that out_path does not
        exist when rc != 0, and that no temporary file (*.tmp.*) is left beside it. rc_any: a set
        of exit codes accepted instead of rc. Returns the Result."""
        if out_path is not None and rc != 0 and os.path.lexists(out_path):
            raise CaseFailed("test setup: %s exists before the run" % out_path)
        r = self.run(args)
        problems = []
        if r.timed_out:
            problems.append("timed out after %d s (hang)" % TIMEOUT_S)
        elif r.rc < 0:
            problems.append("killed by signal %d" % -r.rc)
        else:
            ok = (r.rc in rc_any) if rc_any else (r.rc == rc)
            if not ok:
                problems.append("exit code %s, expected %s" % (r.rc, sorted(rc_any) if rc_any else rc))
        for m in CRASH_MARKERS:
            if m in r.err:
                problems.append("stderr contains %r" % m)
        for s in err_has:
            if s not in r.err:
                problems.append("stderr lacks %r" % s)
        for s in err_lacks:
            if s in r.err:
                problems.append("stderr wrongly says %r" % s)
        for s in out_has:
            if s not in r.out:
                problems.append("stdout lacks %r" % s)
        if out_path is not None and rc != 0 and os.path.lexists(out_path):
            problems.append("%s was written although the command failed" % out_path)
        if out_path is not None:
            d = os.path.dirname(out_path) or "."
            base = os.path.basename(out_path)
            if os.path.isdir(d):
                left = [f for f in os.listdir(d) if f.startswith(base + ".tmp")]
                if left:
                    problems.append("temporary files left behind: %s" % ", ".join(sorted(left)))
        if problems:
            raise CaseFailed("; ".join(problems) + "\n    command: adjsh " + " ".join(args) +
                             "\n    stderr: " + _indent(_clip(r.err)).lstrip() +
                             ("\n    stdout: " + _indent(_clip(r.out)).lstrip() if r.out else ""))
        if self.verbose and rc != 0:
            print("    [exit %s] %s" % (r.rc, _clip(r.err, 300).splitlines()[0] if r.err else ""))
        return r


def _text(b):
    if b is None:
        return ""
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


def _clip(s, n=1500):
    s = s.rstrip("\n")
    return s if len(s) <= n else s[:n] + " ...[%d more chars]" % (len(s) - n)


def _indent(s):
    return "\n".join("      " + line for line in s.splitlines())


def check(cond, msg):
    if not cond:
        raise CaseFailed(msg)


# ----------------------------------------------------------------------------------------------
# The cases.

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adjsh", required=True, help="path to the adjsh binary")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="print the first stderr line of every expected failure")
    args = ap.parse_args()
    adjsh = os.path.abspath(args.adjsh)
    if not os.access(adjsh, os.X_OK):
        print("FAIL setup: %s is not an executable file" % adjsh)
        print("0 passed, 1 failed")
        return 1

    tmp = tempfile.TemporaryDirectory(prefix="adjsh_cli_")
    work = tmp.name
    try:
        r = Runner(adjsh, work, args.verbose)
        run_cases(r, work)
        print("%d passed, %d failed" % (r.passed, r.failed))
        return 1 if r.failed else 0
    finally:
        if args.keep:
            kept = os.path.join(tempfile.gettempdir(), "adjsh_cli_kept_%d" % os.getpid())
            shutil.copytree(work, kept, symlinks=True)
            print("work directory kept at %s" % kept)
        tmp.cleanup()


def run_cases(r, work):
    P = lambda *parts: os.path.join(work, *parts)  # noqa: E731
    counter = [0]

    def fresh_out(ext=".safetensors"):
        counter[0] += 1
        return P("out%03d%s" % (counter[0], ext))

    good_ids = [(7 * i + 3) % V for i in range(T_TOKENS)]
    tok32, tok16 = P("good.u32"), P("good.u16")
    write_tokens(tok32, good_ids)
    write_tokens(tok16, good_ids)
    model = P("model")

    # --- help and usage -----------------------------------------------------------------------
    def top_help():
        res = r.expect(["--help"], 0, out_has=["usage: adjsh", "grad", "init", "tokenize"])
        check(res.err == "", "--help wrote to stderr: %r" % res.err)
    r.case("help/top-level --help", top_help)
    r.case("help/top-level help", lambda: r.expect(["help"], 0, out_has=["usage: adjsh"]))

    help_flags = {
        "grad": ["--model", "--tokens", "--out", "--window", "--chunk", "--threads", "--dtype",
                 "--cotangent", "--quiet", "--help"],
        "init": ["--out", "--hidden-size", "--layers", "--vocab-size", "--state-size",
                 "--conv-kernel", "--expand", "--dt-rank", "--layer-norm-epsilon", "--seed",
                 "--dtype", "--help"],
        "tokenize": ["--text", "--out", "--length", "--help"],
        "eval": ["--model", "--tokens", "--context", "--max-tokens", "--chunk", "--help"],
        "generate": ["--model", "--prompt", "--tokenizer", "--prompt-tokens", "--max-new-tokens",
                     "--temperature", "--top-k", "--seed", "--help"],
        "health": ["--address", "--service", "--timeout", "--tls-ca", "--tls-cert", "--tls-key",
                   "--tls-server-name", "--help"],
        "train": ["--spec", "--data", "--batch-size", "--data-order", "--doc-boundaries",
                  "--val-data", "--eval-every", "--resume", "--log-jsonl", "--help"],
    }
    r.case("help/--version", lambda: r.expect(["--version"], 0,
                                              out_has=["adjsh ", "(revision "]))
    for cmd, flags in sorted(help_flags.items()):
        def sub_help(cmd=cmd, flags=flags):
            res = r.expect([cmd, "--help"], 0, out_has=["usage: adjsh %s" % cmd] + flags)
            check(res.err == "", "--help wrote to stderr: %r" % res.err)
        r.case("help/%s --help" % cmd, sub_help)
        # --help wins over missing required flags and is not blocked by other flags.
        r.case("help/%s -h with other flags" % cmd,
               lambda cmd=cmd, flag=flags[0]: r.expect([cmd, flag, P("never"), "-h"], 0,
                                                       out_has=["usage: adjsh %s" % cmd]))

    r.case("usage/no arguments", lambda: r.expect([], 2, err_has=["usage: adjsh"]))
    r.case("usage/unknown command",
           lambda: r.expect(["frobnicate"], 2, err_has=["frobnicate"]))
    for cmd, base in [("grad", ["--model", model, "--tokens", tok32]),
                      ("init", ["--out", P("m_unknown_flag")] + INIT_ARGS),
                      ("tokenize", ["--text", P("t.txt")])]:
        out = fresh_out(".u32" if cmd == "tokenize" else ".safetensors")
        if cmd != "init":
            base = base + ["--out", out]
        else:
            out = P("m_unknown_flag")
        r.case("usage/%s unknown flag" % cmd,
               lambda cmd=cmd, base=base, out=out:
               r.expect([cmd] + base + ["--no-such-flag", "1"], 2, err_has=["--no-such-flag"],
                        out_path=out))
    r.case("usage/grad missing --out",
           lambda: r.expect(["grad", "--model", model, "--tokens", tok32], 2, err_has=["--out"]))
    r.case("usage/grad missing --model",
           lambda o=fresh_out(): r.expect(["grad", "--tokens", tok32, "--out", o], 2,
                                          err_has=["--model"], out_path=o))
    r.case("usage/init missing --vocab-size",
           lambda: r.expect(["init", "--out", P("m_missing_v"), "--hidden-size", "8",
                             "--layers", "2"], 2, err_has=["--vocab-size"],
                            out_path=P("m_missing_v")))
    r.case("usage/tokenize missing --text",
           lambda o=fresh_out(".u32"): r.expect(["tokenize", "--out", o], 2, err_has=["--text"],
                                                out_path=o))
    r.case("usage/grad flag without value",
           lambda o=fresh_out(): r.expect(["grad", "--model", model, "--tokens", tok32,
                                           "--out", o, "--chunk"], 2, err_has=["--chunk"],
                                          out_path=o))
    r.case("usage/grad stray positional argument",
           lambda o=fresh_out(): r.expect(["grad", "--model", model, "--tokens", tok32,
                                           "--out", o, "extra"], 2, err_has=["extra"],
                                          out_path=o))

    # --- the valid model ------------------------------------------------------------------------
    def init_model():
        r.expect(["init", "--out", model] + INIT_ARGS + ["--seed", "3"], 0)
        check(os.path.isfile(P("model", "config.json")), "no config.json written")
        check(os.path.isfile(P("model", "model.safetensors")), "no model.safetensors written")
        header, meta, _ = st_read(P("model", "model.safetensors"))
        shapes = expected_shapes()
        check(sorted(header) == sorted(shapes),
              "model tensors %s != expected %s" % (sorted(header), sorted(shapes)))
        for name, shape in shapes.items():
            check(header[name]["shape"] == shape,
                  "%s has shape %s, expected %s" % (name, header[name]["shape"], shape))
    r.case("init/valid tiny model", init_model)
    if not os.path.isfile(P("model", "model.safetensors")):
        print("FAIL setup: adjsh init produced no model; the remaining cases need it")
        r.failed += 1
        return

    # Bad flag values for grad: bad usage (BAD_VALUE_RC) naming the flag; nothing written.
    grad_base = ["grad", "--model", model, "--tokens", tok32]
    bad_values = [
        ("non-integer --chunk", ["--chunk", "abc"], "--chunk"),
        ("--chunk 0", ["--chunk", "0"], "--chunk"),
        ("--chunk -3", ["--chunk", "-3"], "--chunk"),
        ("--window 0", ["--window", "0"], "--window"),
        ("non-integer --window", ["--window", "1.5"], "--window"),
        ("--threads -1", ["--threads", "-1"], "--threads"),
        ("--dtype f16", ["--dtype", "f16"], "--dtype"),
        ("--storage f16", ["--storage", "f16"], "--storage"),
        ("--kept-mib -1", ["--kept-mib", "-1"], "--kept-mib"),
        ("non-integer --kept-mib", ["--kept-mib", "1G"], "--kept-mib"),
        ("--quiet=maybe", ["--quiet=maybe"], "--quiet"),
        ("--cotangent top", ["--cotangent", "top"], "--cotangent"),
        ("--cotangent top-of-stack --workers 1", ["--cotangent", "top-of-stack", "--workers", "1"],
         "top-of-stack"),
    ]
    for label, extra, flag in bad_values:
        def bad_value(extra=extra, flag=flag):
            o = fresh_out()
            r.expect(grad_base + ["--out", o] + extra, BAD_VALUE_RC, err_has=[flag], out_path=o)
        r.case("usage/grad %s" % label, bad_value)

    # adjsh train's loss mask and cotangent: bad usage (2) or bad input (1), a clear message.
    mask_ok, mask_short = P("mask_ok.u8"), P("mask_short.u8")
    with open(mask_ok, "wb") as f:
        f.write(bytes([0, 1] * (T_TOKENS // 2) + [1] * (T_TOKENS % 2)))
    with open(mask_short, "wb") as f:
        f.write(bytes([1] * (T_TOKENS - 1)))
    train_base = ["train", "--model", model, "--tokens", tok32, "--context", "8", "--steps", "1",
                  "--checkpoint-dir", P("train_ck")]
    r.case("usage/train --loss-mask without --tokens",
           lambda: r.expect(["train", "--loss-mask", mask_ok, "--steps", "1"], BAD_VALUE_RC,
                            err_has=["--loss-mask needs --tokens"]))
    r.case("usage/train --cotangent bad",
           lambda: r.expect(train_base + ["--cotangent", "x"], BAD_VALUE_RC, err_has=["--cotangent"]))
    r.case("usage/train --schedule bad",
           lambda: r.expect(train_base + ["--schedule", "two-pass"], BAD_VALUE_RC,
                            err_has=["--schedule must be spans or wavefront"]))
    r.case("usage/train --schedule wavefront with --workers",
           lambda: r.expect(train_base + ["--schedule", "wavefront", "--workers", "1"],
                            BAD_VALUE_RC, err_has=["--schedule wavefront runs in-process"]))

    # The wavefront in-process: the same bytes on 1 and 2 threads (model and optimizer state).
    def wavefront_threads():
        files = []
        for threads in ("1", "2"):
            ck = P("wf_ck" + threads)
            r.expect(train_base[:-1] + [ck, "--steps", "3", "--context", "12", "--chunk", "4",
                                        "--schedule", "wavefront", "--threads", threads], 0,
                     err_has=["exact wavefront", "done: step 3"])
            step = os.path.join(ck, "step-00000003")
            files.append([open(os.path.join(step, f), "rb").read()
                          for f in ("model.safetensors", "optimizer.safetensors")])
        check(files[0] == files[1], "--schedule wavefront: 1 and 2 threads differ")
    r.case("train/--schedule wavefront: the same bytes on 1 and 2 threads", wavefront_threads)
    r.case("usage/train --cotangent top-of-stack with --workers",
           lambda: r.expect(train_base + ["--cotangent", "top-of-stack", "--workers", "1"],
                            BAD_VALUE_RC, err_has=["--cotangent top-of-stack"]))
    r.case("input/train --loss-mask missing file",
           lambda: r.expect(train_base + ["--loss-mask", P("no_such.u8")], 1,
                            err_has=["no_such.u8"]))
    r.case("input/train --loss-mask a directory: refused with the system's reason",
           lambda: r.expect(train_base + ["--loss-mask", work], 1,
                            err_has=["cannot read loss mask", "Is a directory"]))
    r.case("input/train --loss-mask of the wrong length",
           lambda: r.expect(train_base + ["--loss-mask", mask_short], 1, err_has=["loss mask"]))
    r.case("train/--loss-mask reports the accuracy",
           lambda: r.expect(train_base + ["--loss-mask", mask_ok, "--cotangent", "top-of-stack"],
                            0, err_has=["acc ", "top-of-stack"]))

    def interrupted():
        # Ctrl-C (SIGINT) mid-run: the step under way ends, it is saved, exit 1 naming it;
        # the checkpoint is that step, the last one printed, so no trained step is lost.
        ck = P("ck_int")
        p = subprocess.Popen([r.adjsh, "train", "--model", model, "--tokens", tok32, "--context",
                              "8", "--steps", "1000000", "--checkpoint-every", "0",
                              "--checkpoint-dir", ck], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        lines = []
        second = None
        try:
            for line in p.stderr:
                lines.append(line)
                if line.startswith("step 20/"):
                    # A second run on the same directory meanwhile: refused, nothing touched.
                    second = r.run(["train", "--model", model, "--tokens", tok32, "--context",
                                    "8", "--steps", "2", "--checkpoint-dir", ck])
                    p.send_signal(signal.SIGINT)
                    break
            rest = p.communicate(timeout=TIMEOUT_S)[1]
        finally:
            if p.poll() is None:
                p.kill()
        err = "".join(lines) + rest
        steps = re.findall(r"^step (\d+)/", err, re.M)
        stopped = re.search(r"stopped by a signal after step (\d+), saved in", err)
        latest = open(os.path.join(ck, "latest")).read().strip() if os.path.exists(
            os.path.join(ck, "latest")) else ""
        check(p.returncode == 1 and stopped and steps and stopped.group(1) == steps[-1] and
              latest == "step-%08d" % int(steps[-1]),
              "rc %s, last step %s, latest %r: %s" % (p.returncode, steps[-1:], latest,
                                                      _clip(err[-600:])))
        check(second is not None and second.rc == 1 and
              "in use by another training run" in _text(second.err),
              "second run: %r" % ((second.rc, _clip(second.err)) if second else None,))
    r.case("train/SIGINT ends the step under way, saves it and exits 1; a second run on its "
           "checkpoint directory meanwhile is refused", interrupted)

    # Windows of 8 in 23 tokens: 0-7 and 8-15, in that order with --data-order sequential.
    def mask_file(name, counted):
        path = P(name)
        with open(path, "wb") as f:
            f.write(bytes([1 if counted(t) else 0 for t in range(T_TOKENS)]))
        return path
    seq = ["--data-order", "sequential", "--checkpoint-every", "1"]

    def mask_window_without_targets():
        # A batch's window that counts no target is left out; the other one makes the step.
        m = mask_file("mask_w1.u8", lambda t: t >= 8)
        r.expect(train_base[:-1] + [P("ck_mask_b2"), "--loss-mask", m, "--batch-size", "2"] + seq,
                 0, err_has=["step 1/1", "acc "])
    r.case("train/--loss-mask: a batch's window counting no target is left out",
           mask_window_without_targets)

    def mask_step_without_targets():
        # Step 2's only window counts nothing: refused before step 1, nothing trained or saved.
        m = mask_file("mask_s2.u8", lambda t: t < 8 or t >= 16)
        ck = P("ck_mask_s2")
        args = train_base[:-1] + [ck, "--loss-mask", m] + seq
        args[args.index("--steps") + 1] = "2"
        r.expect(args, 1,
                 err_has=["counts no target in step 2", "tokens 8 to 15"], err_lacks=["step 1/2"])
        check(not os.path.exists(ck) or not os.listdir(ck), "a refused run left checkpoints")
    r.case("train/--loss-mask: a step counting no target refused before the run",
           mask_step_without_targets)

    # Held-out evaluation and the step log: --val-data, --eval-every, --eval-tokens, --log-jsonl.
    r.case("usage/train --eval-every without held-out data",
           lambda: r.expect(train_base + ["--eval-every", "2"], BAD_VALUE_RC,
                            err_has=["--eval-every needs held-out data"]))
    r.case("usage/train --eval-every -1",
           lambda: r.expect(train_base + ["--val-data", tok16, "--eval-every", "-1"],
                            BAD_VALUE_RC, err_has=["--eval-every"]))
    r.case("usage/train --data with --tokens",
           lambda: r.expect(train_base + ["--data", P("x.json")], BAD_VALUE_RC,
                            err_has=["give one of --data, --tokens and --text"]))
    bad_val = P("bad_val.u16")
    write_tokens(bad_val, [1, 2, V + 3])
    r.case("input/train --val-data with an id outside the vocabulary",
           lambda: r.expect(train_base + ["--val-data", bad_val], 1,
                            err_has=["validation data", "position 2"]))
    r.case("input/train --val-data missing",
           lambda: r.expect(train_base + ["--val-data", P("no_val.u16")], 1,
                            err_has=["no_val.u16"]))
    r.case("input/train --log-jsonl in a missing directory",
           lambda: r.expect(train_base[:-1] + [P("log_ck"), "--log-jsonl",
                                               P("no_dir", "log.jsonl")], 1,
                            err_has=["step log", "no_dir"]))

    def val_and_log():
        log = P("steps.jsonl")
        res = r.expect(train_base[:-1] + [P("val_ck"), "--steps", "3", "--val-data", tok16,
                                          "--eval-every", "2", "--log-jsonl", log], 0,
                       err_has=["val "])
        lines = [json.loads(x) for x in open(log).read().splitlines()]
        check([x["step"] for x in lines] == [1, 2, 3], "log steps: %r" % lines)
        check([("val_loss" in x) for x in lines] == [False, True, True],
              "val_loss on steps 2 and 3 (every 2 and the last): %r" % lines)
        for x in lines:
            check(all(math.isfinite(x[k]) for k in ("loss", "grad_norm", "lr", "tokens_per_s")),
                  "non-finite figure in %r" % x)
        check(abs(lines[1]["val_ppl"] - math.exp(lines[1]["val_loss"])) <= 1e-6 * lines[1]["val_ppl"],
              "val_ppl = exp(val_loss): %r" % lines[1])
        check(res.err.count(" val ") == 2, "two progress lines with val: %r" % res.err)
    r.case("train/--val-data --eval-every 2 --log-jsonl", val_and_log)

    # A local cluster's workers log to files: the terminal shows the cluster's lines and the
    # progress, not the workers' own ("[worker ...]"); '-' keeps them on the terminal.
    def worker_logs():
        ck = P("wl_ck")
        r.expect(train_base[:-1] + [ck, "--steps", "2", "--workers", "2"], 0,
                 err_has=["worker logs: %s/worker-logs/worker-{0..1}.log" % ck, "step 2/2"],
                 err_lacks=["[worker "])
        for w in (0, 1):
            text = open(os.path.join(ck, "worker-logs", "worker-%d.log" % w)).read()
            check("registered with" in text and "stopped:" in text,
                  "worker %d's log lacks its registration or its stop: %r" % (w, text[-500:]))
        r.expect(train_base[:-1] + [P("wl_ck2"), "--steps", "1", "--workers", "1",
                                    "--worker-log-dir", "-"], 0, err_has=["[worker "])
        r.expect(train_base + ["--worker-log-dir", P("x")], BAD_VALUE_RC,
                 err_has=["--worker-log-dir needs --workers"])
    r.case("train/--workers: worker logs in files", worker_logs)

    # A worker the local cluster started again is stopped at the end as the others are
    # (SIGTERM: its log says "stopped:"), not killed as the thread that started it ends
    # (PR_SET_PDEATHSIG follows the forking thread: coordinator/local_cluster.cc Supervise).
    def respawned_worker_stops():
        ck = P("rs_ck")
        log = os.path.join(ck, "worker-logs", "worker-0.log")
        err_path = P("rs_err")  # a file, not a pipe: the run prints a line per step
        with open(err_path, "w") as err_file:
            p = subprocess.Popen([r.adjsh] + train_base[:-1] + [ck, "--steps", "1000000",
                                 "--checkpoint-every", "0", "--workers", "2"],
                                 stdout=subprocess.DEVNULL, stderr=err_file)

        def read_log():
            return open(log).read() if os.path.exists(log) else ""

        def wait_running(cond, what):  # cond within 60 s, the run still going
            wait_for(lambda: p.poll() is not None or cond(), 60)
            check(p.poll() is None and cond(), "%s: never (run ended: %s)" % (what, p.poll()))

        def worker0():  # the train process's child started as worker local-0
            for kid in children(p.pid):
                try:
                    with open("/proc/%d/cmdline" % kid, "rb") as f:
                        if b"local-0" in f.read().split(b"\0"):
                            return kid
                except OSError:
                    continue
            return None

        try:
            wait_running(lambda: "registered with" in read_log(), "worker 0 registered")
            pid = worker0()
            check(pid is not None, "no worker local-0 among the train process's children")
            os.kill(pid, signal.SIGKILL)
            wait_running(lambda: read_log().count("registered with") == 2,
                         "worker 0 started again and registered")
            p.send_signal(signal.SIGINT)  # stop after the step under way: the cluster's teardown
            p.wait(timeout=TIMEOUT_S)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        err = open(err_path).read()
        text = read_log()
        again = text.split("registered with")[-1]  # the started-again worker's lines
        check(p.returncode == 1 and "starting it again" in err,
              "rc %s: %s" % (p.returncode, _clip(err[-600:])))
        check("stopped:" in again, "the started-again worker was not stopped by SIGTERM: %r"
              % _clip(text[-800:]))
    r.case("train/--workers: a worker started again stops by SIGTERM at the end",
           respawned_worker_stops)

    shapes = expected_shapes()
    model_header, _, _ = st_read(P("model", "model.safetensors"))

    def check_grad_file(path, dtype):
        header, _, data = st_read(path)
        want = dict(shapes)
        want["loss"] = []
        check(sorted(header) == sorted(want),
              "output tensors differ: missing %s, extra %s" %
              (sorted(set(want) - set(header)), sorted(set(header) - set(want))))
        values = {}
        for name, (dt, shape, raw) in st_tensor_bytes(header, data).items():
            check(dt == dtype, "%s has dtype %s, expected %s" % (name, dt, dtype))
            check(shape == want[name], "%s has shape %s, expected %s" % (name, shape, want[name]))
            v = st_values(dt, shape, raw)
            check(all(math.isfinite(x) for x in v), "%s has non-finite values" % name)
            values[name] = v
        loss = values["loss"][0]
        # Mean next-token cross-entropy of a freshly initialised model: near log(V).
        check(0.5 * math.log(V) < loss < 2.0 * math.log(V),
              "loss %r is implausible for a fresh model (log V = %.3f)" % (loss, math.log(V)))
        check(any(x != 0 for x in values["backbone.embeddings.weight"]),
              "embedding gradient is all zero")
        return values

    def grad_ok(tok, dtype, extra):
        o = fresh_out()
        args = ["grad", "--model", model, "--tokens", tok, "--out", o] + extra
        res = r.expect(args, 0)
        check(os.path.isfile(o), "no output file")
        check("loss" in res.err, "no loss summary on stderr")
        return check_grad_file(o, dtype)

    r.case("grad/valid .u32 tokens (f32 default)", lambda: grad_ok(tok32, "F32", []))
    r.case("grad/valid .u16 tokens (f32)", lambda: grad_ok(tok16, "F32", ["--chunk", "4"]))
    r.case("grad/valid --dtype=f64 --chunk=7 (= syntax)",
           lambda: grad_ok(tok32, "F64", ["--dtype=f64", "--chunk=7"]))

    def quiet():
        o = fresh_out()
        res = r.expect(grad_base + ["--out", o, "--quiet"], 0)
        check(res.err == "" and res.out == "", "--quiet printed: %r %r" % (res.out, res.err))
        check_grad_file(o, "F32")
    r.case("grad/--quiet prints nothing", quiet)

    def u16_equals_u32():
        a, b = fresh_out(), fresh_out()
        r.expect(["grad", "--model", model, "--tokens", tok32, "--out", a, "--dtype", "f64"], 0)
        r.expect(["grad", "--model", model, "--tokens", tok16, "--out", b, "--dtype", "f64"], 0)
        ha, _, da = st_read(a)
        hb, _, db = st_read(b)
        ta, tb = st_tensor_bytes(ha, da), st_tensor_bytes(hb, db)
        for name in ta:
            check(ta[name] == tb[name], "%s differs between .u32 and .u16 tokens" % name)
    r.case("grad/.u16 and .u32 of the same ids give identical output", u16_equals_u32)

    # Kept activations are a memo: the same bytes with none kept, a few, or all (f32, 3 spans).
    def kept_is_bitwise():
        outs = []
        for mib in ("0", "1", "256"):
            o = fresh_out()
            r.expect(grad_base + ["--out", o, "--chunk", "4", "--spans", "3", "--threads", "2",
                                  "--kept-mib", mib, "--quiet"], 0)
            h, _, d = st_read(o)
            outs.append(st_tensor_bytes(h, d))
        for name in outs[0]:
            check(outs[1][name] == outs[0][name] and outs[2][name] == outs[0][name],
                  "%s differs with --kept-mib" % name)
    r.case("grad/--kept-mib 0, 1 and 256 give identical output", kept_is_bitwise)

    # --- gradients must not depend on --chunk / --threads (f64) ---------------------------------
    def rel_diff(a, b):
        num = max(abs(x - y) for x, y in zip(a, b)) if a else 0.0
        den = max(max(abs(x) for x in a), max(abs(x) for x in b)) if a else 0.0
        return num / den if den > 0 else num

    def compare_runs(extra_a, extra_b, tol):
        outs = []
        for extra in (extra_a, extra_b):
            o = fresh_out()
            r.expect(grad_base + ["--out", o, "--dtype", "f64", "--quiet"] + extra, 0)
            outs.append(check_grad_file(o, "F64"))
        worst = []
        for name in sorted(outs[0]):
            d = rel_diff(outs[0][name], outs[1][name])
            if not d <= tol:
                worst.append("%s rel %.3g" % (name, d))
        check(not worst, "gradients differ beyond %g: %s" % (tol, "; ".join(worst)))

    r.case("grad/f64 --chunk 3 --threads 1 == --chunk 5 --threads 2 (1e-12 rel)",
           lambda: compare_runs(["--chunk", "3", "--threads", "1"],
                                ["--chunk", "5", "--threads", "2"], 1e-12))
    r.case("grad/f64 --chunk 1 --threads 2 == --chunk %d (whole sequence) (1e-12 rel)" % T_TOKENS,
           lambda: compare_runs(["--chunk", "1", "--threads", "2"],
                                ["--chunk", str(T_TOKENS), "--threads", "1"], 1e-12))
    r.case("grad/f64 --window >= T equals the exact gradient (1e-12 rel)",
           lambda: compare_runs(["--chunk", "4", "--window", str(T_TOKENS)],
                                ["--chunk", "4"], 1e-12))

    # --- broken model directories -------------------------------------------------------------
    with open(P("model", "config.json")) as f:
        good_config = json.load(f)
    with open(P("model", "model.safetensors"), "rb") as f:
        good_st = f.read()
    good_tensors = st_tensor_bytes(model_header, st_read(P("model", "model.safetensors"))[2])
    (good_hlen,) = struct.unpack("<Q", good_st[:8])

    def make_model(name, config=None, st_bytes=None, tensors=None, no_config=False, no_st=False):
        d = P(name)
        os.mkdir(d)
        if not no_config:
            with open(os.path.join(d, "config.json"), "w") as f:
                if isinstance(config, str):
                    f.write(config)
                else:
                    json.dump(good_config if config is None else config, f, indent=2)
        if not no_st:
            path = os.path.join(d, "model.safetensors")
            if tensors is not None:
                st_write(path, tensors, {"format": "pt"})
            else:
                with open(path, "wb") as f:
                    f.write(good_st if st_bytes is None else st_bytes)
        return d

    def bad_model(d, err_has, tokens=None):
        o = fresh_out()
        r.expect(["grad", "--model", d, "--tokens", tokens or tok32, "--out", o], 1,
                 err_has=err_has, out_path=o)

    r.case("model/directory missing",
           lambda: bad_model(P("no_such_model"), ["no_such_model", "does not exist"]))

    def model_is_a_file():
        with open(P("model_file"), "w") as f:
            f.write("{}")
        o = fresh_out()
        # It exists: saying "does not exist" would send the user looking in the wrong place.
        r.expect(["grad", "--model", P("model_file"), "--tokens", tok32, "--out", o], 1,
                 err_has=["model_file"], err_lacks=["does not exist"], out_path=o)
    r.case("model/--model is a regular file", model_is_a_file)
    r.case("model/config.json missing",
           lambda: bad_model(make_model("m_no_config", no_config=True), ["config.json"]))
    r.case("model/model.safetensors missing",
           lambda: bad_model(make_model("m_no_st", no_st=True), ["model.safetensors"]))

    def st_is_dir():
        d = make_model("m_st_dir", no_st=True)
        os.mkdir(os.path.join(d, "model.safetensors"))
        bad_model(d, ["model.safetensors"])
    r.case("model/model.safetensors is a directory", st_is_dir)

    data_start = 8 + good_hlen
    cuts = [("0 bytes", 0, ["model.safetensors"]),
            ("4 bytes", 4, ["model.safetensors"]),
            ("8 bytes (header length only)", 8, ["model.safetensors", "header length"]),
            ("half the header", 8 + good_hlen // 2, ["model.safetensors", "header length"]),
            ("end of header (no data)", data_start, None),
            ("inside the data", data_start + (len(good_st) - data_start) // 2, None),
            ("last byte missing", len(good_st) - 1, None)]
    for i, (label, cut, err_has) in enumerate(cuts):
        def truncated(i=i, cut=cut, err_has=err_has):
            if err_has is None:
                # The header is intact: the message must name a tensor whose data is cut off.
                cut_size = cut - data_start
                victims = [n for n, e in model_header.items() if e["data_offsets"][1] > cut_size]
                check(victims, "test setup: no tensor is cut")
                o = fresh_out()
                res = r.expect(["grad", "--model", make_model("m_cut%d" % i,
                                                              st_bytes=good_st[:cut]),
                                "--tokens", tok32, "--out", o], 1,
                               err_has=["model.safetensors"], out_path=o)
                check(any('"%s"' % n in res.err or n in res.err for n in victims),
                      "stderr names none of the cut tensors %s: %s" % (victims, res.err.strip()))
            else:
                bad_model(make_model("m_cut%d" % i, st_bytes=good_st[:cut]), err_has)
        r.case("model/model.safetensors truncated at %s" % label, truncated)

    def garbage_json():
        text = b"{this is not json!!"
        text += b" " * ((8 - len(text) % 8) % 8)
        blob = struct.pack("<Q", len(text)) + text + b"\0" * 16
        bad_model(make_model("m_garbage", st_bytes=blob), ["model.safetensors", "JSON"])
    r.case("model/safetensors header is garbage JSON", garbage_json)

    def header_not_object():
        text = b"[1, 2, 3]       "
        blob = struct.pack("<Q", len(text)) + text
        bad_model(make_model("m_header_array", st_bytes=blob), ["model.safetensors", "object"])
    r.case("model/safetensors header is a JSON array", header_not_object)

    def header_too_long():
        blob = struct.pack("<Q", len(good_st) * 4) + good_st[8:]
        bad_model(make_model("m_hlen", st_bytes=blob), ["model.safetensors", "header length"])
    r.case("model/safetensors header length larger than the file", header_too_long)

    def header_len_huge():
        blob = struct.pack("<Q", 0xFFFFFFFFFFFFFFF0) + good_st[8:]
        bad_model(make_model("m_hlen_huge", st_bytes=blob), ["model.safetensors", "header length"])
    r.case("model/safetensors header length near 2^64", header_len_huge)

    def random_bytes():
        blob = bytes((i * 131 + 17) % 256 for i in range(4096))
        bad_model(make_model("m_random", st_bytes=blob), ["model.safetensors"])
    r.case("model/model.safetensors is random bytes", random_bytes)

    target = "backbone.layers.1.mixer.D"

    def wrong_shape():
        t = dict(good_tensors)
        dt, shape, raw = t[target]
        t[target] = (dt, [shape[0] - 1], raw[:len(raw) - 4])
        bad_model(make_model("m_shape", tensors=t), [target, "shape"])
    r.case("model/tensor with wrong shape (%s [15])" % target, wrong_shape)

    def wrong_rank():
        name = "backbone.layers.0.mixer.conv1d.weight"
        t = dict(good_tensors)
        dt, shape, raw = t[name]
        t[name] = (dt, [shape[0], shape[2]], raw)  # (Di, W) instead of (Di, 1, W): same bytes
        bad_model(make_model("m_rank", tensors=t), [name, "shape"])
    r.case("model/tensor with wrong rank, same size (conv1d.weight 2-D)", wrong_rank)

    def shape_data_mismatch():
        t = dict(good_tensors)
        dt, shape, raw = t[target]
        t[target] = (dt, [shape[0] + 1], raw)  # header shape disagrees with its byte span
        bad_model(make_model("m_span", tensors=t), [target])
    r.case("model/tensor shape inconsistent with its data_offsets", shape_data_mismatch)

    def missing_tensor():
        name = "backbone.norm_f.weight"
        t = dict(good_tensors)
        del t[name]
        bad_model(make_model("m_missing", tensors=t), [name, "missing"])
    r.case("model/tensor missing (backbone.norm_f.weight)", missing_tensor)

    def missing_layer_tensor():
        name = "backbone.layers.1.mixer.A_log"
        t = dict(good_tensors)
        del t[name]
        bad_model(make_model("m_missing_a", tensors=t), [name])
    r.case("model/tensor missing (backbone.layers.1.mixer.A_log)", missing_layer_tensor)

    def extra_tensor():
        name = "backbone.layers.2.norm.weight"
        t = dict(good_tensors)
        t[name] = t["backbone.layers.1.norm.weight"]
        bad_model(make_model("m_extra", tensors=t), [name])
    r.case("model/unexpected extra tensor (%s)" % "backbone.layers.2.norm.weight", extra_tensor)

    def extra_odd_tensor():
        name = "some.random.thing"
        t = dict(good_tensors)
        t[name] = ("F32", [2], struct.pack("<2f", 1.0, 2.0))
        bad_model(make_model("m_extra2", tensors=t), [name])
    r.case("model/unexpected extra tensor (some.random.thing)", extra_odd_tensor)

    def bad_dtype():
        t = dict(good_tensors)
        dt, shape, raw = t[target]
        t[target] = ("Q7", shape, raw)
        bad_model(make_model("m_dtype", tensors=t), [target])
    r.case("model/tensor with an unknown dtype", bad_dtype)

    for label, value in [("NaN", float("nan")), ("+Inf", float("inf"))]:
        def nonfinite(value=value, label=label):
            name = "backbone.layers.0.mixer.A_log"
            t = dict(good_tensors)
            dt, shape, raw = t[name]
            vals = st_values(dt, shape, raw)
            vals[5] = value
            t[name] = (dt, shape, struct.pack("<%d%s" % (len(vals), DTYPE_FMT[dt][0]), *vals))
            bad_model(make_model("m_%s" % label.strip("+"), tensors=t), [name])
        r.case("model/tensor with a %s value (A_log)" % label, nonfinite)

    def rewritten_model_ok():
        # Control: our own safetensors writer must produce a model adjsh accepts, otherwise the
        # failures above would not isolate the single defect they inject.
        d = make_model("m_rewritten", tensors=dict(good_tensors))
        o = fresh_out()
        r.expect(["grad", "--model", d, "--tokens", tok32, "--out", o, "--quiet"], 0)
        check_grad_file(o, "F32")
    r.case("model/control: re-serialised good model is accepted", rewritten_model_ok)

    def cfg(**changes):
        c = dict(good_config)
        for k, v in changes.items():
            if v is DELETE:
                del c[k]
            else:
                c[k] = v
        return c

    config_cases = [
        ("hidden_size 0", cfg(hidden_size=0), ["hidden_size"]),
        ("hidden_size -8", cfg(hidden_size=-8), ["hidden_size"]),
        ("negative state_size", cfg(state_size=-4), ["state_size"]),
        ("conv_kernel 0", cfg(conv_kernel=0), ["conv_kernel"]),
        ("vocab_size missing", cfg(vocab_size=DELETE), ["vocab_size"]),
        ("num_hidden_layers missing", cfg(num_hidden_layers=DELETE), ["num_hidden_layers"]),
        ("hidden_size as a string", cfg(hidden_size="8"), ["hidden_size"]),
        ("hidden_size as a float", cfg(hidden_size=8.5), ["hidden_size"]),
        ("use_bias true", cfg(use_bias=True), ["use_bias"]),
        # An untied head is a parameter of its own: without lm_head.weight the model is refused.
        ("tie_word_embeddings false without lm_head.weight", cfg(tie_word_embeddings=False),
         ["lm_head.weight"]),
        ("layer_norm_epsilon -1", cfg(layer_norm_epsilon=-1), ["layer_norm_epsilon"]),
        ("layer_norm_epsilon as a string", cfg(layer_norm_epsilon="1e-5"),
         ["layer_norm_epsilon"]),
        ("vocab_size 2^40", cfg(vocab_size=2 ** 40), ["vocab_size"]),
        ("hidden_size 2^70", cfg(hidden_size=2 ** 70), ["hidden_size"]),
        ("time_step_rank as a word", cfg(time_step_rank="big"), ["time_step_rank"]),
        ("intermediate_size != expand*hidden", cfg(intermediate_size=10), ["intermediate_size"]),
        ("state_size 8 (tensors are for 4)", cfg(state_size=8),
         ["backbone.layers.0.", "shape"]),
        ("not JSON", "{\"hidden_size\": 8,,}", ["config.json", "JSON"]),
        ("a JSON array", "[8, 2, 11]", ["config.json", "object"]),
        ("empty file", "", ["config.json"]),
    ]
    for i, (label, config, err_has) in enumerate(config_cases):
        r.case("config/%s" % label,
               lambda i=i, config=config, err_has=err_has:
               bad_model(make_model("m_cfg%d" % i, config=config), err_has))

    # --- broken token files ---------------------------------------------------------------------
    def bad_tokens(path, err_has):
        o = fresh_out()
        r.expect(["grad", "--model", model, "--tokens", path, "--out", o], 1, err_has=err_has,
                 out_path=o)

    r.case("tokens/file missing",
           lambda: bad_tokens(P("no_such_tokens.u32"), ["no_such_tokens.u32"]))

    def tokens_dir():
        os.mkdir(P("tokdir.u32"))
        bad_tokens(P("tokdir.u32"), ["tokdir.u32"])
    r.case("tokens/path is a directory", tokens_dir)

    def tokens_device():
        # A device never ends: refused by name at once, not read until memory runs out.
        os.symlink("/dev/zero", P("zero.u32"))
        bad_tokens(P("zero.u32"), ["zero.u32", "device"])
    r.case("tokens/a device (/dev/zero) is refused", tokens_device)

    def unknown_ext():
        write_tokens(P("tokens.bin.u32"), good_ids)
        os.rename(P("tokens.bin.u32"), P("tokens.bin"))
        bad_tokens(P("tokens.bin"), ["tokens.bin", "extension"])
    r.case("tokens/unknown extension (.bin)", unknown_ext)

    def ragged_u32():
        with open(P("ragged.u32"), "wb") as f:
            f.write(struct.pack("<5I", 1, 2, 3, 4, 5) + b"\x01\x00")
        bad_tokens(P("ragged.u32"), ["ragged.u32", "multiple of 4"])
    r.case("tokens/.u32 size not a multiple of 4", ragged_u32)

    def ragged_u16():
        with open(P("ragged.u16"), "wb") as f:
            f.write(struct.pack("<5H", 1, 2, 3, 4, 5) + b"\x01")
        bad_tokens(P("ragged.u16"), ["ragged.u16", "multiple of 2"])
    r.case("tokens/.u16 size not a multiple of 2", ragged_u16)

    def out_of_vocab(ext, bad_id):
        def f():
            ids = list(good_ids)
            ids[5] = bad_id
            path = P("oov_%d%s" % (bad_id, ext))
            write_tokens(path, ids)
            bad_tokens(path, ["position 5", str(bad_id)])
        return f
    r.case("tokens/id == vocab_size at position 5 (.u32)", out_of_vocab(".u32", V))
    r.case("tokens/id 0xFFFFFFFF at position 5 (.u32)", out_of_vocab(".u32", 0xFFFFFFFF))
    r.case("tokens/id 65535 at position 5 (.u16)", out_of_vocab(".u16", 65535))

    def empty_tokens():
        open(P("empty.u32"), "wb").close()
        bad_tokens(P("empty.u32"), ["at least 2"])
    r.case("tokens/empty file", empty_tokens)

    def one_token():
        write_tokens(P("one.u32"), [3])
        bad_tokens(P("one.u32"), ["at least 2"])
    r.case("tokens/1-token file", one_token)

    def two_tokens():
        write_tokens(P("two.u16"), [3, 4])
        o = fresh_out()
        r.expect(["grad", "--model", model, "--tokens", P("two.u16"), "--out", o, "--quiet"], 0)
        check_grad_file(o, "F32")
    r.case("tokens/2-token file is accepted", two_tokens)

    # --- --out problems -------------------------------------------------------------------------
    def out_in_missing_dir():
        o = P("no_such_dir", "g.safetensors")
        # Refused before any computation, as bad usage.
        r.expect(grad_base + ["--out", o], BAD_VALUE_RC, err_has=["no_such_dir"], out_path=o)
    r.case("out/--out in a missing directory", out_in_missing_dir)

    def out_is_dir():
        os.mkdir(P("outdir.safetensors"))
        res = r.expect(grad_base + ["--out", P("outdir.safetensors")], BAD_VALUE_RC,
                       err_has=["outdir.safetensors"])
        check(os.path.isdir(P("outdir.safetensors")) and not os.listdir(P("outdir.safetensors")),
              "the directory given as --out was modified")
        return res
    r.case("out/--out is a directory", out_is_dir)

    def out_empty():
        r.expect(grad_base + ["--out", ""], None, rc_any={1, 2}, err_has=["--out"])
        left = [f for f in os.listdir(work) if f.startswith(".tmp")]
        check(not left, "temporary files left behind: %s" % left)
    r.case("out/--out '' refused naming --out", out_empty)

    def out_is_tokens():
        shutil.copy(tok32, P("own.u32"))
        before = open(P("own.u32"), "rb").read()
        r.expect(["grad", "--model", model, "--tokens", P("own.u32"), "--out",
                  os.path.join(work, ".", "own.u32")], BAD_VALUE_RC, err_has=["--tokens"])
        check(open(P("own.u32"), "rb").read() == before, "the token file was overwritten")
    r.case("out/--out naming the --tokens file refused", out_is_tokens)

    def out_is_model_weights():
        shutil.copytree(model, P("mcopy"))
        w = os.path.join(P("mcopy"), "model.safetensors")
        before = open(w, "rb").read()
        r.expect(["grad", "--model", P("mcopy"), "--tokens", tok32, "--out", w], BAD_VALUE_RC,
                 err_has=["the model's folder"])
        check(open(w, "rb").read() == before, "the model's weights were overwritten")
        shard = os.path.join(P("mcopy"), "model-00001-of-00002.safetensors")
        r.expect(["grad", "--model", P("mcopy"), "--tokens", tok32, "--out", shard],
                 BAD_VALUE_RC, err_has=["the model's folder"], out_path=shard)
        r.expect(["grad", "--model", P("mcopy"), "--tokens", tok32, "--out",
                  os.path.join(P("mcopy"), "config.json")], BAD_VALUE_RC,
                 err_has=["the model's config"])
    r.case("out/--out naming the model's weights refused", out_is_model_weights)

    # A directory where no file can be created, even by root: refused before the gradient.
    r.case("out/--out where no file can be created refused before any work",
           lambda: r.expect(grad_base + ["--out", "/proc/adjsh-grad.safetensors"], BAD_VALUE_RC,
                            err_has=["cannot create a file in /proc"]))

    def doc_starts_one_token():
        write_tokens(P("one_ds.u32"), [3])
        with open(P("ds0.bin"), "wb") as f:
            f.write(struct.pack("<Q", 0))
        r.expect(["grad", "--model", model, "--tokens", P("one_ds.u32"), "--doc-starts",
                  P("ds0.bin"), "--out", fresh_out()], 1, err_has=["at least 2"])
    r.case("tokens/1-token file with --doc-starts refused by name", doc_starts_one_token)

    r.case("train/--workers 100000 refused (at most 1024 local workers)",
           lambda: r.expect(["train", "--hidden-size", "8", "--layers", "1", "--vocab-size",
                             str(V), "--context", "16", "--chunk", "8", "--steps", "1",
                             "--tokens", tok32, "--workers", "100000", "--checkpoint-dir",
                             P("ck_many")], BAD_VALUE_RC, err_has=["--workers"],
                            out_path=P("ck_many")))

    def reduce_in_process():
        o = fresh_out()
        r.expect(grad_base + ["--out", o, "--reduce", "star"], BAD_VALUE_RC,
                 err_has=["--reduce", "--workers"], out_path=o)
    r.case("out/--reduce without --workers refused", reduce_in_process)

    def failure_keeps_old_out():
        o = fresh_out()
        with open(o, "wb") as f:
            f.write(b"previous contents")
        r.expect(["grad", "--model", P("no_such_model"), "--tokens", tok32, "--out", o], 1)
        with open(o, "rb") as f:
            check(f.read() == b"previous contents", "a failed run modified an existing --out")
    r.case("out/failed grad leaves an existing --out untouched", failure_keeps_old_out)

    def data_tool_help():
        # The data tools' --help needs no venv: ADJSH_PYTHON may name a python on PATH (and
        # without the venv the system's python3 runs them), whose standard library prints it.
        env = dict(os.environ, ADJSH_PYTHON="python3")
        for args in (["prepare", "--help"], ["tokenizer", "encode", "--help"],
                     ["tokenizer", "decode", "--help"]):
            p = subprocess.run([r.adjsh] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=TIMEOUT_S, env=env)
            check(p.returncode == 0 and b"usage:" in p.stdout,
                  "%s: rc %s, %s" % (args, p.returncode, _clip(_text(p.stderr))))
    r.case("help/prepare and tokenizer --help with ADJSH_PYTHON=python3", data_tool_help)

    # --- adjsh generate: refused before any token is generated -----------------------------
    def generate_bad_out_ext():
        o = P("gen_out.bin")
        res = r.expect(["generate", "--model", model, "--prompt-tokens", tok32,
                        "--max-new-tokens", "3", "--out", o], BAD_VALUE_RC,
                       err_has=["gen_out.bin", "extension"], out_path=o)
        check(res.out.strip() == "", "ids printed before the refusal: %r" % res.out)
    r.case("generate/--out with an unknown extension refused before generating",
           generate_bad_out_ext)

    def generate_u16_big_vocab():
        # 16-bit ids cannot hold a vocabulary of 70000: refused once the model is loaded,
        # before any id is generated or printed, nothing written.
        big = P("big_vocab")
        r.expect(["init", "--out", big, "--hidden-size", "8", "--layers", "1", "--vocab-size",
                  "70000"], 0)
        o = P("gen_big.u16")
        res = r.expect(["generate", "--model", big, "--prompt-tokens", tok32,
                        "--max-new-tokens", "3", "--out", o], 1,
                       err_has=["70000 ids", ".u32"], out_path=o)
        check(res.out.strip() == "", "ids printed before the refusal: %r" % res.out)
    r.case("generate/a .u16 --out for a vocabulary over 65536 refused before generating",
           generate_u16_big_vocab)

    def generate_out_is_prompt():
        shutil.copy(tok32, P("prompt_own.u32"))
        before = open(P("prompt_own.u32"), "rb").read()
        r.expect(["generate", "--model", model, "--prompt-tokens", P("prompt_own.u32"),
                  "--max-new-tokens", "3", "--out", P("prompt_own.u32")], BAD_VALUE_RC,
                 err_has=["--prompt-tokens"])
        check(open(P("prompt_own.u32"), "rb").read() == before, "the prompt was overwritten")
    r.case("generate/--out naming the --prompt-tokens file refused", generate_out_is_prompt)

    r.case("generate/--tokenizer with --prompt-tokens refused (it would be ignored)",
           lambda: r.expect(["generate", "--model", model, "--prompt-tokens", tok32,
                             "--tokenizer", P("no_such_tokenizer.json")], BAD_VALUE_RC,
                            err_has=["--tokenizer", "--prompt-tokens"]))

    # --- adjsh init with impossible configs ------------------------------------------------------
    init_cases = [
        ("--hidden-size 0", ["--hidden-size", "0", "--layers", "2", "--vocab-size", "11"],
         ["hidden-size"]),
        ("--hidden-size -8", ["--hidden-size", "-8", "--layers", "2", "--vocab-size", "11"],
         ["hidden-size"]),
        ("--layers 0", ["--hidden-size", "8", "--layers", "0", "--vocab-size", "11"], ["layers"]),
        ("--vocab-size abc", ["--hidden-size", "8", "--layers", "2", "--vocab-size", "abc"],
         ["vocab-size"]),
        ("--dt-rank x", INIT_ARGS + ["--dt-rank", "x"], ["dt-rank"]),
        ("--conv-kernel 0", INIT_ARGS + ["--conv-kernel", "0"], ["conv-kernel"]),
        ("--state-size 5000", INIT_ARGS[:6] + ["--state-size", "5000"], ["state"]),
        ("--layer-norm-epsilon -1", INIT_ARGS + ["--layer-norm-epsilon", "-1"],
         ["epsilon"]),
        ("--layer-norm-epsilon nan", INIT_ARGS + ["--layer-norm-epsilon", "nan"],
         ["epsilon"]),
        ("--seed -1", INIT_ARGS + ["--seed", "-1"], ["seed"]),
        ("--dtype f16", INIT_ARGS + ["--dtype", "f16"], ["dtype"]),
    ]
    for i, (label, flags, err_has) in enumerate(init_cases):
        r.case("init/%s refused" % label,
               lambda i=i, flags=flags, err_has=err_has:
               r.expect(["init", "--out", P("init_bad%d" % i)] + flags, None, rc_any={1, 2},
                        err_has=err_has, out_path=P("init_bad%d" % i)))

    def init_out_is_file():
        with open(P("init_file"), "w") as f:
            f.write("x")
        r.expect(["init", "--out", P("init_file")] + INIT_ARGS, 1, err_has=["init_file"])
    r.case("init/--out is an existing regular file", init_out_is_file)

    def init_failure_keeps_model():
        # A failed init over an existing model (here its weights' path is a directory, so they
        # cannot be replaced) leaves its config.json as it was, and no pending file beside it.
        d = P("init_keep")
        r.expect(["init", "--out", d] + INIT_ARGS, 0)
        before = open(os.path.join(d, "config.json"), "rb").read()
        os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, "weights.bak"))
        os.mkdir(os.path.join(d, "model.safetensors"))
        r.expect(["init", "--out", d, "--hidden-size", "16", "--layers", "1", "--vocab-size",
                  str(V)], 1, err_has=["model.safetensors"])
        check(open(os.path.join(d, "config.json"), "rb").read() == before,
              "a failed init rewrote config.json")
        check(sorted(os.listdir(d)) == ["config.json", "model.safetensors", "weights.bak"],
              "a failed init left %s" % sorted(os.listdir(d)))
    r.case("init/a failed init leaves an existing model's config.json", init_failure_keeps_model)

    def init_deterministic():
        for name in ("init_s1", "init_s2"):
            r.expect(["init", "--out", P(name)] + INIT_ARGS + ["--seed", "11"], 0)
        for f in ("config.json", "model.safetensors"):
            with open(P("init_s1", f), "rb") as a, open(P("init_s2", f), "rb") as b:
                check(a.read() == b.read(), "%s differs between two runs with one seed" % f)
    r.case("init/deterministic for a seed", init_deterministic)

    def init_untied_and_train():
        # --untied-head: lm_head.weight of its own, tie_word_embeddings false; adjsh train
        # --untied-head trains one from scratch and its checkpoint keeps the head untied.
        r.expect(["init", "--out", P("untied")] + INIT_ARGS + ["--untied-head"], 0)
        conf = json.load(open(P("untied", "config.json")))
        header, _, _ = st_read(P("untied", "model.safetensors"))
        shapes = expected_shapes()
        check(conf.get("tie_word_embeddings") is False and
              header.get("lm_head.weight", {}).get("shape") ==
              shapes["backbone.embeddings.weight"] and len(header) == len(shapes) + 1,
              "untied init: config %s, tensors %s" % (conf.get("tie_word_embeddings"),
                                                      sorted(header)))
        ck = P("untied_train")
        r.expect(["train", "--untied-head", "--hidden-size", "8", "--layers", "1",
                  "--vocab-size", str(V), "--state-size", "2", "--context", "16", "--chunk", "8",
                  "--steps", "2", "--tokens", tok32, "--checkpoint-dir", ck], 0)
        step = os.path.join(ck, open(os.path.join(ck, "latest")).read().strip())
        header, _, _ = st_read(os.path.join(step, "model.safetensors"))
        check("lm_head.weight" in header, "adjsh train --untied-head: checkpoint tensors %s"
              % sorted(header))
        r.expect(["train", "--model", P("untied"), "--untied-head", "--tokens", tok32, "--steps",
                  "1", "--checkpoint-dir", P("untied_x")], BAD_VALUE_RC,
                 err_has=["--model and --untied-head"])
    r.case("init/--untied-head, and adjsh train --untied-head", init_untied_and_train)

    # --- adjsh tokenize ---------------------------------------------------------------------------
    r.case("tokenize/missing text file",
           lambda o=fresh_out(".u32"):
           r.expect(["tokenize", "--text", P("no_such.txt"), "--out", o], 1,
                    err_has=["no_such.txt"], out_path=o))

    def tokenize_second_missing():
        with open(P("hello.txt"), "wb") as f:
            f.write(b"hello")
        o = fresh_out(".u32")
        r.expect(["tokenize", "--text", P("hello.txt") + "," + P("missing2.txt"), "--out", o], 1,
                 err_has=["missing2.txt"], out_path=o)
    r.case("tokenize/second of two text files missing", tokenize_second_missing)

    def tokenize_empty():
        open(P("empty.txt"), "wb").close()
        o = fresh_out(".u32")
        r.expect(["tokenize", "--text", P("empty.txt"), "--out", o], 1, err_has=["empty"],
                 out_path=o)
    r.case("tokenize/empty input", tokenize_empty)

    def tokenize_bad_ext():
        with open(P("hi.txt"), "wb") as f:
            f.write(b"hi there")
        o = fresh_out(".bin")
        r.expect(["tokenize", "--text", P("hi.txt"), "--out", o], 1, err_has=["extension"],
                 out_path=o)
    r.case("tokenize/--out with unknown extension", tokenize_bad_ext)

    def tokenize_bad_length():
        with open(P("hi2.txt"), "wb") as f:
            f.write(b"hi there")
        o = fresh_out(".u32")
        r.expect(["tokenize", "--text", P("hi2.txt"), "--out", o, "--length", "-5"], None,
                 rc_any={1, 2}, err_has=["--length"], out_path=o)
    r.case("tokenize/--length -5 refused", tokenize_bad_length)

    def tokenize_ok():
        text = b"Hello, \xc3\xa9t\xc3\xa9!\n"
        with open(P("text.txt"), "wb") as f:
            f.write(text)
        for ext, fmt, size in ((".u32", "I", 4), (".u16", "H", 2)):
            o = fresh_out(ext)
            r.expect(["tokenize", "--text", P("text.txt"), "--out", o], 0)
            with open(o, "rb") as f:
                blob = f.read()
            check(len(blob) == size * len(text), "%s: %d bytes for %d characters" %
                  (ext, len(blob), len(text)))
            ids = list(struct.unpack("<%d%s" % (len(text), fmt), blob))
            check(ids == list(bytearray(text)), "%s: ids %s != bytes of the text" % (ext, ids))
        o = fresh_out(".u16")
        r.expect(["tokenize", "--text", P("text.txt"), "--out", o, "--length", "40"], 0)
        with open(o, "rb") as f:
            ids = list(struct.unpack("<40H", f.read()))
        check(ids == [bytearray(text)[i % len(text)] for i in range(40)],
              "--length 40 did not repeat the text")
    r.case("tokenize/valid text -> .u32 / .u16 / --length", tokenize_ok)


class _Delete(object):
    pass


DELETE = _Delete()

if __name__ == "__main__":
    sys.exit(main())
