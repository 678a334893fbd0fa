#!/usr/bin/env python3
"""End-to-end checks of `adjsh eval` (engine/evaluate.h).

Usage:
  test_eval.py --adjsh build/cli/adjsh

Standard library only. The result line `loss L ppl P tokens N` on stdout; in f64 its loss equals
`adjsh grad`'s loss of the same file (< 1e-12 relative); --context and --max-tokens; peak
resident memory the same for 16K and 512K tokens (nothing per token is kept, the token file is
mapped); bad input is a message, exit 1 or 2, never a crash. Prints one PASS/FAIL line per case
and `N passed, N failed` last; exits 1 if any case failed.
"""
import argparse
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import Results, read_scalar  # noqa: E402

CRASH_MARKERS = ("Segmentation fault", "terminate called", "Aborted", "core dumped",
                 "check failed", "ADJSH_CHECK")
RESULT = re.compile(r"^loss (\S+) ppl (\S+) tokens (\d+)$")


def run(adjsh, args, timeout=300):
    p = subprocess.run([adjsh] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, text=True)
    return p.returncode, p.stdout, p.stderr


def write_tokens(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    res = Results()
    check = res.record

    def no_crash(err):
        return not any(m in err for m in CRASH_MARKERS)

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m")
        rc, _, err = run(a.adjsh, ["init", "--hidden-size", "16", "--layers", "2",
                                   "--vocab-size", "50", "--state-size", "4", "--out", model])
        check("init", rc == 0, err)
        tokens = os.path.join(tmp, "t.u16")
        write_tokens(tokens, [(i * 7919 + i // 3) % 50 for i in range(3001)])

        rc, out, err = run(a.adjsh, ["eval", "--help"])
        check("eval --help", rc == 0 and "--context" in out and "--max-tokens" in out, out)

        rc, out, err = run(a.adjsh, ["eval", "--model", model, "--tokens", tokens, "--dtype",
                                     "f64", "--chunk", "64", "--quiet"])
        m = RESULT.match(out.strip())
        check("eval prints 'loss L ppl P tokens N'", rc == 0 and m is not None, out + err)
        g = os.path.join(tmp, "g.safetensors")
        rc2, _, err2 = run(a.adjsh, ["grad", "--model", model, "--tokens", tokens, "--dtype",
                                     "f64", "--chunk", "64", "--out", g, "--quiet"])
        if m and rc2 == 0:
            loss, ppl, n = float(m.group(1)), float(m.group(2)), int(m.group(3))
            want = read_scalar(g)
            check(f"eval loss = grad loss in f64 ({loss!r} vs {want!r})",
                  abs(loss - want) <= 1e-12 * abs(want), f"{loss} {want}")
            check("ppl = exp(loss), tokens = the file's", abs(ppl - math.exp(loss)) <= 1e-5 * ppl
                  and n == 3001, out)
        else:
            check("grad f64", False, err2)

        # An untied head (its own lm_head.weight): the same agreement, and another loss than
        # the tied model's (so eval reads lm_head, not the embedding).
        untied = os.path.join(tmp, "mu")
        run(a.adjsh, ["init", "--hidden-size", "16", "--layers", "2", "--vocab-size", "50",
                      "--state-size", "4", "--untied-head", "--out", untied])
        rc, out, err = run(a.adjsh, ["eval", "--model", untied, "--tokens", tokens, "--dtype",
                                     "f64", "--chunk", "64", "--quiet"])
        mu = RESULT.match(out.strip())
        gu = os.path.join(tmp, "gu.safetensors")
        rc2, _, err2 = run(a.adjsh, ["grad", "--model", untied, "--tokens", tokens, "--dtype",
                                     "f64", "--chunk", "64", "--out", gu, "--quiet"])
        ok = rc == 0 and mu is not None and rc2 == 0 and m is not None
        lu = float(mu.group(1)) if ok else float("nan")
        want = read_scalar(gu) if ok else float("nan")
        check(f"untied head: eval loss = grad loss in f64 ({lu!r} vs {want!r}), not the tied "
              f"model's", ok and abs(lu - want) <= 1e-12 * abs(want) and
              lu != float(m.group(1)), err + err2)

        rc, out, err = run(a.adjsh, ["eval", "--model", model, "--tokens", tokens, "--context",
                                     "1000", "--max-tokens", "2500", "--quiet"])
        m = RESULT.match(out.strip())
        check("--context 1000 --max-tokens 2500: 2500 tokens", rc == 0 and m is not None and
              int(m.group(3)) == 2500, out + err)

        # Memory bounded by the chunk: peak RSS for 16K and 512K tokens within a few MiB.
        peaks = {}
        for n in (16384, 524288):
            path = os.path.join(tmp, f"n{n}.u16")
            write_tokens(path, [(i * 31 + i // 7) % 50 for i in range(n)])
            rc, out, err = run(a.adjsh, ["eval", "--model", model, "--tokens", path, "--chunk",
                                         "256"])
            mm = re.search(r"peak RSS ([\d.]+) MiB", err)
            peaks[n] = float(mm.group(1)) if rc == 0 and mm else float("inf")
        check(f"peak RSS flat in T ({peaks[16384]:.1f} MiB at 16K, {peaks[524288]:.1f} MiB at "
              f"512K; at most 4 MiB more)", peaks[524288] <= peaks[16384] + 4, str(peaks))

        # Bad input: a message naming it, exit 1 (bad data) or 2 (bad usage), no crash.
        big = os.path.join(tmp, "big.u16")
        write_tokens(big, [1, 2, 60, 3])
        odd = os.path.join(tmp, "odd.u16")
        with open(odd, "wb") as f:
            f.write(b"abc")
        one = os.path.join(tmp, "one.u16")
        write_tokens(one, [1])
        cases = [
            (["--tokens", big], 1, "position 2"),
            (["--tokens", odd], 1, "odd.u16"),
            (["--tokens", one], 1, "at least 2 tokens"),
            (["--tokens", os.path.join(tmp, "missing.u16")], 1, "missing.u16"),
            (["--tokens", tokens, "--context", "1"], 2, "--context"),
            (["--tokens", tokens, "--chunk", "0"], 2, "chunk"),
            (["--tokens", tokens, "--dtype", "f16"], 2, "--dtype"),
            (["--tokens", tokens, "--device", "cuda:1023"], 1, "cuda:1023"),
        ]
        for flags, code, what in cases:
            rc, out, err = run(a.adjsh, ["eval", "--model", model] + flags)
            check(f"eval {' '.join(os.path.basename(f) for f in flags)}: exit {code}, names "
                  f"'{what}'", rc == code and what in err and no_crash(err) and out == "",
                  f"rc={rc} out={out!r} err={err!r}")
        rc, out, err = run(a.adjsh, ["eval", "--tokens", tokens])
        check("eval without --model: bad usage", rc == 2 and "--model" in err, err)

    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
