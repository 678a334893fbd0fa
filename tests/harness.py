"""Shared pieces of the cluster, job, fault-injection and load tests (python3 standard library
only).

  Cluster    starts `adjsh coordinator` / `adjsh worker` processes on 127.0.0.1 and stops every
             one of them at the end, also on failure; submits, watches and polls jobs.
  CutProxy   a TCP proxy on 127.0.0.1 that forwards to an address and cuts each connection
             (both directions, with a reset) after a random number of bytes.
  StallProxy the same, but the first M connections stall after a random number of bytes (a
             black hole: nothing is forwarded, both sockets stay open); later ones forward.
  Results    PASS/FAIL lines and the `N passed, N failed` summary.
  run_process_test  the main() of a test that starts processes (--adjsh, --keep, a temporary
             directory), through guarded: every process stopped at the end, a check of its own.
  final_files, read_scalar, rss_bytes, train_reference: what the checks compare.
  proc_stat, children: a process's /proc state, its live children.
"""
import argparse
import json
import os
import random
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

SKIP = 77  # CTest SKIP_RETURN_CODE of these tests
# A model small enough for many jobs in one test: as an adjsh spec's "init", and as train flags.
SMALL_SHAPE = {"hidden_size": 16, "layers": 2, "state_size": 4, "vocab_size": 256}
SMALL_TRAIN_FLAGS = ["--hidden-size", "16", "--layers", "2", "--state-size", "4", "--context",
                     "512", "--chunk", "64"]


class Results:
    def __init__(self):
        self.oks = []

    def record(self, name, ok, detail=""):
        self.oks.append(bool(ok))
        why = ": " + str(detail)[-3000:] if detail and not ok else ""
        print(f"{'PASS' if ok else 'FAIL'} {name}{why}", flush=True)
        return bool(ok)

    def summary(self):
        n = sum(self.oks)
        print(f"{n} passed, {len(self.oks) - n} failed", flush=True)
        return 0 if n == len(self.oks) and self.oks else 1


def run_process_test(prefix, body):
    """main(): parses --adjsh and --keep, makes a temporary directory, and calls
    body(adjsh, tmp, cluster, record). Whatever body does or raises, every process the Cluster
    started is stopped afterwards (a check of its own) and the directory removed (unless --keep);
    exits with the summary's status."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    adjsh = os.path.abspath(args.adjsh)
    tmp = tempfile.mkdtemp(prefix=prefix)
    cluster, res = Cluster(adjsh, tmp), Results()
    guarded(cluster, res, lambda: body(adjsh, tmp, cluster, res.record))
    if args.keep:
        print("kept", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(res.summary())


def guarded(cluster, res, body):
    """Runs body(). An exception from it (a bug in the test itself) is a failed check, with its
    traceback; then, whatever happened, every process the cluster started is stopped, and that
    they all stopped is a check of its own."""
    try:
        body()
    except Exception as e:
        traceback.print_exc()
        res.record("test harness", False, repr(e))
    finally:
        leftover = cluster.stop()
        res.record("every started process stopped", not leftover, leftover)


def run_adjsh(adjsh, args, timeout=120, env=None):
    """`adjsh ARGS` to its end: a CompletedProcess (text) with .seconds; exit 124 on timeout."""
    t0 = time.time()
    try:
        r = subprocess.run([adjsh, *args], capture_output=True, text=True, timeout=timeout,
                           env=env)
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(e.cmd, 124, "", f"timed out after {timeout} s")
    r.seconds = time.time() - t0
    return r


def final_files(ckpt):
    """{file name: bytes} of the model and optimizer state `ckpt/latest` points to, or None."""
    try:
        with open(os.path.join(ckpt, "latest")) as f:
            d = os.path.join(ckpt, f.read().strip())
        out = {}
        for name in ("model.safetensors", "optimizer.safetensors"):
            with open(os.path.join(d, name), "rb") as f:
                out[name] = f.read()
        return out
    except OSError:
        return None


def read_f32_tensors(path):
    """{name: tuple of floats} of the F32 tensors of a safetensors file (standard library)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] == "F32":
            start, end = t["data_offsets"]
            out[name] = struct.unpack(f"<{(end - start) // 4}f", data[start:end])
    return out


def read_scalar(path, name="loss"):
    """The scalar tensor `name` (F64 or F32) of a safetensors file, e.g. adjsh grad's loss."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        info = header[name]
        lo, hi = info["data_offsets"]
        f.seek(8 + n + lo)
        raw = f.read(hi - lo)
    return struct.unpack("<d" if info["dtype"] == "F64" else "<f", raw)[0]


def latest_step(ckpt):
    """The step of the checkpoint `ckpt/latest` points to, or 0."""
    try:
        with open(os.path.join(ckpt, "latest")) as f:
            return int(f.read().strip().split("-")[1])
    except (OSError, ValueError, IndexError):
        return 0


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name: state first ("Z": a zombie, dead
    but not yet reaped), then ppid, pgrp, session, ...; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def children(pid):
    """Live child processes of pid, whichever of its threads started them (a zombie is dead,
    not yet reaped: killing it again would count a kill that did nothing)."""
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    live = []
    for kid in kids:
        fields = proc_stat(kid)
        if fields and fields[0] != "Z":  # neither gone nor a zombie
            live.append(kid)
    return live


def rss_bytes(pid):
    """Resident set size of a process (VmRSS), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def train_reference(adjsh, ckpt, flags, timeout=600):
    """`adjsh train` in-process with the job's flags: the undisturbed run every fault is held to
    (a job's defaults are adjsh train's, so the two end with bitwise the same state)."""
    r = subprocess.run([adjsh, "train", *flags, "--checkpoint-dir", ckpt], capture_output=True,
                       text=True, timeout=timeout)
    return r, (final_files(ckpt) if r.returncode == 0 else None)


class Cluster:
    """The processes a test started; stop() ends every one of them."""

    def __init__(self, adjsh, tmp):
        self.adjsh, self.tmp = adjsh, tmp
        self.procs = []
        self.logs = []

    def log_path(self, name):
        return os.path.join(self.tmp, name + ".log")

    def _log(self, name):
        f = open(self.log_path(name), "ab")
        self.logs.append(f)
        return f

    def coordinator(self, state_dir, listen="127.0.0.1:0", lease_ms=2000, timeout=30,
                    flags=("--insecure-local",), env=None, log="coordinator", data_root=None):
        """Starts a coordinator; returns (process, address) or (process, None). flags: its
        transport (--insecure-local, or TLS and token flags) and any others; log: the name of
        its stderr log in tmp; data_root: where jobs may read and write (default: tmp)."""
        # The test's directory is the jobs' data root: their models, data and checkpoints.
        p = subprocess.Popen([self.adjsh, "coordinator", "--listen", listen, "--state-dir",
                              state_dir, "--lease-ms", str(lease_ms), "--threads", "1",
                              "--data-root", data_root or self.tmp, *flags],
                             stdout=subprocess.PIPE, stderr=self._log(log), env=env)
        self.procs.append(p)
        deadline = time.time() + timeout
        line = b""
        while time.time() < deadline and p.poll() is None:
            r, _, _ = select.select([p.stdout], [], [], 0.2)
            if r:
                line = p.stdout.readline()
                break
        m = re.match(rb"listening on (127\.0\.0\.1:\d+)$", line.strip())
        return p, (m.group(1).decode() if m else None)

    def worker(self, address, name, log="--quiet", flags=()):
        """log: --quiet, --verbose (every task and retry), or "" (registration, progress, the
        `stopped:` counts); flags: any others (TLS)."""
        cmd = [self.adjsh, "worker", "--coordinator", address, "--name", name, *flags]
        if log:
            cmd.append(log)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log(f"worker-{name}"))
        self.procs.append(p)
        return p

    def popen(self, args, env=None, stdout=subprocess.PIPE):
        """`adjsh ARGS` in the background (stdout and stderr as text pipes unless stdout is
        given), stopped with the rest."""
        p = subprocess.Popen([self.adjsh, *args], stdout=stdout, stderr=subprocess.PIPE,
                             text=True, env=env)
        self.procs.append(p)
        return p

    def run(self, *args, timeout=120, env=None):
        return run_adjsh(self.adjsh, args, timeout=timeout, env=env)

    def spec_file(self, name, spec):
        """Writes a job spec (a dict) to tmp/NAME.json; returns its path."""
        path = os.path.join(self.tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def submit(self, address, spec):
        path = self.spec_file(f"spec-{len(self.procs)}-{time.time():.6f}", spec)
        r = self.run("submit", "--coordinator", address, "--spec", path, timeout=60)
        return r.stdout.strip() if r.returncode == 0 else None, r

    def status(self, address, job):
        r = self.run("status", "--coordinator", address, "--job", job, "--json", timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def watch(self, address, job, timeout=600):
        return self.run("watch", "--coordinator", address, "--job", job, timeout=timeout)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, 18)  # SIGCONT: a stopped process cannot act on SIGTERM
                except OSError:
                    pass
                p.terminate()
        deadline = time.time() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self.logs:
            f.close()
        return [p.pid for p in self.procs if p.poll() is None]


def wait_for(pred, timeout, interval=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return None


class CutProxy:
    """Forwards 127.0.0.1:<port> to `target`; every connection is cut after a byte budget drawn
    uniformly from [min_bytes, max_bytes] (bytes in both directions together): both sockets are
    closed with a reset (SO_LINGER 0), so gRPC sees the connection fail mid-stream, wherever the
    budget ends (inside a tensor's bytes, a header, a heartbeat)."""

    def __init__(self, target, min_bytes, max_bytes, seed=1):
        self.target = target
        self.min_bytes, self.max_bytes = min_bytes, max_bytes
        self.rng = random.Random(seed)
        self.cuts = 0
        self.cut_offsets = []
        self.connections = 0
        self.bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        host, port = self.target.rsplit(":", 1)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                pump, budget = self._plan(self.connections)
            t = threading.Thread(target=pump, args=(client, upstream, budget), daemon=True)
            t.start()
            self._threads.append(t)

    def _plan(self, n):
        """(pump, byte budget) of the n-th connection (from 1); called under the lock."""
        return self._pump, self.rng.randint(self.min_bytes, self.max_bytes)

    @staticmethod
    def _reset(sock):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        sock.close()

    def _forward(self, a, b, budget):
        """Forwards both ways until `budget` bytes (both directions together) have passed, a side
        closes or fails, or the proxy stops. Returns (bytes passed, whether the budget ran out);
        both sockets are left non-blocking."""
        passed = 0
        try:
            for s in (a, b):
                s.setblocking(False)
            while not self._stop.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for src in ready:
                    dst = b if src is a else a
                    data = src.recv(65536)
                    if not data:
                        return passed, False
                    if passed + len(data) >= budget:
                        data = data[:budget - passed]
                    dst.setblocking(True)
                    dst.sendall(data)
                    dst.setblocking(False)
                    passed += len(data)
                    if passed >= budget:
                        return passed, True
        except OSError:
            pass
        return passed, False

    def _pump(self, a, b, budget):
        passed, cut = 0, False
        try:
            passed, cut = self._forward(a, b, budget)
        finally:
            with self._lock:
                self.bytes += passed
                if cut:
                    self.cuts += 1
                    self.cut_offsets.append(passed)
            self._reset(a)
            self._reset(b)

    def stop(self):
        self._stop.set()
        self._listener.close()
        for t in self._threads:
            t.join(timeout=2)


class StallProxy(CutProxy):
    """Forwards 127.0.0.1:<port> to `target`; each of the first `stall_first` connections stalls
    after a byte budget drawn uniformly from [min_bytes, max_bytes] (both directions together):
    from then on the proxy forwards nothing in either direction but keeps both sockets open, as a
    link that drops every packet would. Bytes that arrive after the stall are read and dropped
    (so that the proxy sees a side close its socket); a connection ends only when the client
    gives it up (or the proxy stops): then both sockets are closed. Later connections forward
    everything.

    stalls: connections stalled; abandoned: stalled connections the client closed;
    abandon_after_s: seconds from each stall to the client's close; reconnects: connections
    opened after a client abandoned a stalled one."""

    def __init__(self, target, min_bytes, max_bytes, stall_first, seed=1):
        self.stall_first = stall_first
        self.stalls = 0
        self.abandoned = 0
        self.abandon_after_s = []
        self.reconnects = 0
        super().__init__(target, min_bytes, max_bytes, seed)

    def _plan(self, n):
        if self.abandoned:
            self.reconnects += 1
        if n <= self.stall_first:
            return self._stall, self.rng.randint(self.min_bytes, self.max_bytes)
        return self._pump, float("inf")

    def _stall(self, a, b, budget):
        passed = 0
        try:
            passed, stalled = self._forward(a, b, budget)
            if not stalled:
                return  # closed before its budget ran out (or the proxy stopped): not a stall
            stalled_at = time.time()
            with self._lock:
                self.stalls += 1
            # The black hole: read and drop. The coordinator's side may give up first; the
            # client's socket stays open until the client closes it.
            watched = [a, b]
            while not self._stop.is_set():
                ready, _, _ = select.select(watched, [], [], 0.2)
                for src in ready:
                    try:
                        data = src.recv(65536)
                    except OSError:
                        data = b""
                    if data:
                        continue
                    if src is a:
                        with self._lock:
                            self.abandoned += 1
                            self.abandon_after_s.append(time.time() - stalled_at)
                        return
                    watched = [a]
        except OSError:
            pass
        finally:
            with self._lock:
                self.bytes += passed
            self._reset(a)
            self._reset(b)
