#!/usr/bin/env python3
"""Fault injection: a training job survives each fault and ends with bitwise the weights and
optimizer state of an undisturbed run (`adjsh train` in-process with the same settings).

  test_faults.py --adjsh build/cli/adjsh --case CASE

Cases (each a CTest test; the job: D=16, K=2, N=4, context 2048, chunk 64, the default 8
spans, so 60 span tasks per step, 6 steps, a checkpoint every 2 steps):
  worker_kills      3 workers, SIGKILLed at random moments (8 to 16 kills) and started again
                    (the job runs 80 steps); the spans a killed worker owned are claimed by
                    others, which rebuild them (their logs say so, in the forward and in the
                    backward);
  worker_kills_tree the same kills with the worker tree (every worker serves --peer-listen on
                    127.0.0.1): a lost tree worker takes the sums it held with it, so the
                    coordinator begins the step again (its log says so, >= 1 time), and the
                    job's progress lines say "tree of";
  peer_unreachable  2 tree workers advertising a peer address nobody listens on: the sums
                    pushed between them never arrive, so when the step's tasks are done and its
                    roots are still missing 4 leases later (and the few ms this small model's
                    sums take at RootsDeadline's slow rate) the coordinator begins it again
                    through the coordinator (its log says so, once: the later steps of the same
                    workers use the star at once), and the job ends bitwise;
  worker_stop       a worker SIGSTOPped just after it leased a task, for 2.5 leases (the task is
                    handed to the other worker), then SIGCONTed: its late work is refused (the
                    worker logs the refusal); a heavier job (D=64, N=16, context 4096, chunk
                    512: 16 tasks of ~20 ms per step; 24 steps);
  coordinator_kill  the coordinator SIGKILLed twice in the middle of a step (5 or more of the
                    step's 60 results accepted, not all; in step 2 before the first checkpoint,
                    in step 4 after it), started again on the same address with the same
                    state dir, no resubmission (the job table is on disk);
  proxy_cuts        workers reach the coordinator through a proxy that cuts every connection
                    after a random 8..512 KiB, inside fetch and result streams (>= 10 cuts, >= 5
                    of them breaking a fetch or result stream, per the workers' logs);
  proxy_stall       workers reach the coordinator through a proxy whose first 2 connections stall
                    (a black hole: nothing forwarded, both sockets kept open) after a random
                    16..128 KiB; gRPC keepalive (proto/transport.h: a ping after 20 s, dropped
                    after 10 s unanswered) must make each worker abandon its stalled connection
                    and open a new one (>= 1 stall, every stalled connection closed by its
                    worker, >= 1 connection opened after that);
  mamba2_worker_kills, mamba2_worker_kills_tree, mamba2_coordinator_kill
                    worker_kills, worker_kills_tree and coordinator_kill for a Mamba-2 model
                    (adjsh init --model-type mamba2: D=16, K=2, N=8, head_dim 4, G=2) as the
                    job's model_dir: the same faults and the same bitwise end;
  disk_full         (root only; skipped otherwise) `adjsh train` checkpointing to a tmpfs that
                    fills up at the third checkpoint: exit 1 naming ENOSPC, the previous
                    checkpoint intact and still `latest`, no partial folder left; with space
                    again the run resumes from it and ends bitwise equal; the same for a job
                    of `adjsh coordinator` (FAILED with the reason, then resubmitted).
Every process listens on or connects to 127.0.0.1 and is stopped at the end, also on failure.
Prints `N passed, N failed`; exit 1 if any check failed, 77 when skipped.
"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import (SKIP, Cluster, CutProxy, Results, StallProxy, final_files,  # noqa: E402
                     guarded, latest_step, train_reference, wait_for)

STEPS = 6


class Job:
    """A job spec and the `adjsh train` flags of the same run (the job's defaults are train's):
    a new Mamba-1 model of the given shape, or the model folder model_dir."""

    def __init__(self, hidden, layers, state, context, chunk, steps=STEPS, model_dir=None):
        self.shape = {"hidden_size": hidden, "layers": layers, "state_size": state,
                      "vocab_size": 256}
        self.context, self.chunk, self.steps = context, chunk, steps
        self.model_dir = model_dir
        model = (["--model", model_dir] if model_dir else
                 ["--hidden-size", str(hidden), "--layers", str(layers), "--state-size",
                  str(state)])
        self.flags = model + ["--context", str(context), "--chunk", str(chunk), "--steps",
                              str(steps), "--checkpoint-every", "2"]

    def spec(self, ckpt):
        model = {"model_dir": self.model_dir} if self.model_dir else {"init": self.shape}
        return {**model, "context_length": self.context, "chunk": self.chunk,
                "steps": self.steps, "checkpoint_every": 2, "checkpoint_dir": ckpt}


# 64 tasks of ~1 ms per step; for SIGSTOP, 16 larger tasks per step, so that a worker stopped
# right after it leased a task still holds that lease, and 60 steps, so that the job outlasts
# several stops of 2.5 leases each while the other worker goes on (with 24 steps of tasks that
# now take ~2 ms, the job once ended after a single stop on a loaded machine).
SMALL = Job(16, 2, 4, 2048, 64)
HEAVY = Job(64, 2, 16, 4096, 512, steps=60)
LONGER = Job(16, 2, 4, 2048, 64, steps=80)  # room for the kills until both rebuilds are seen


def spec(ckpt):
    return SMALL.spec(ckpt)


def terminal(js):
    return js is not None and js["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


def count_in_logs(cluster, pattern, logs="worker-*.log"):
    n = 0
    for path in glob.glob(os.path.join(cluster.tmp, logs)):
        with open(path, errors="replace") as f:
            n += f.read().count(pattern)
    return n


def record_job_end(res, watch, ckpt, ref):
    """The job's `adjsh watch` ended in SUCCEEDED, with the undisturbed run's final state."""
    res.record("job SUCCEEDED", watch.returncode == 0, watch.stdout[-1500:] + watch.stderr)
    res.record("final weights and optimizer state bitwise equal to the undisturbed run",
               ref is not None and final_files(ckpt) == ref)


def kill_workers(cluster, addr, workers, rng, last, pause, seen, flags=()):
    """SIGKILLs a random worker every `pause` (a range of seconds) and starts it again under a
    new name, at least 8 times and on (up to 120) until seen() or the job's last checkpoint
    `last` exists. Returns the number of kills."""
    kills = 0
    while kills < 8 or (kills < 120 and not seen()):
        time.sleep(rng.uniform(*pause))
        if os.path.exists(last):  # a file check, not an `adjsh status` process per kill
            break
        name = rng.choice(sorted(workers))
        os.kill(workers[name].pid, signal.SIGKILL)
        workers[name].wait()
        kills += 1
        workers[name] = cluster.worker(addr, f"{name}-{kills}", log="", flags=flags)
    return kills


def case_worker_kills(adjsh, tmp, cluster, res, ref, job_def=LONGER):  # ref: of job_def
    coord, addr = cluster.coordinator(os.path.join(tmp, "state"), lease_ms=500)
    if not res.record("coordinator started", addr):
        return
    # Logs at the default level: a worker says when it rebuilds a span.
    workers = {f"w{k}": cluster.worker(addr, f"w{k}", log="") for k in range(3)}
    ckpt = os.path.join(tmp, "job")
    job, r = cluster.submit(addr, job_def.spec(ckpt))
    if not res.record("job submitted", job, r.stderr):
        return
    rng = random.Random(11)
    last = os.path.join(ckpt, "step-%08d" % job_def.steps)  # the job's final checkpoint

    def rebuilt():  # spans rebuilt by new owners so far, in the forward and in the backward
        return (count_in_logs(cluster, " rebuilt up to fwd"),
                count_in_logs(cluster, " rebuilt up to bwd"))

    # At least 8 kills, and on until the new owners have rebuilt spans in both directions.
    kills = kill_workers(cluster, addr, workers, rng, last, (0.02, 0.2),
                         lambda: min(rebuilt()) > 0)
    r = cluster.watch(addr, job)
    res.record(f"workers SIGKILLed {kills} times during the job (>= 8)", kills >= 8)
    fwd, bwd = rebuilt()
    res.record(f"lost spans rebuilt by their new owners: {fwd} in the forward, {bwd} in the "
               f"backward (>= 1 each)", fwd >= 1 and bwd >= 1)
    record_job_end(res, r, ckpt, ref)


def case_worker_kills_tree(adjsh, tmp, cluster, res, ref, job_def=LONGER):  # ref: of job_def
    coord, addr = cluster.coordinator(os.path.join(tmp, "state"), lease_ms=500)
    if not res.record("coordinator started", addr):
        return
    peer = ["--peer-listen", "127.0.0.1:0"]
    workers = {f"w{k}": cluster.worker(addr, f"w{k}", log="", flags=peer) for k in range(3)}
    ckpt = os.path.join(tmp, "job")
    job, r = cluster.submit(addr, job_def.spec(ckpt))
    if not res.record("job submitted", job, r.stderr):
        return
    rng = random.Random(12)
    last = os.path.join(ckpt, "step-%08d" % job_def.steps)

    def restarts():
        return count_in_logs(cluster, "the step begins again", "coordinator*.log")

    kills = kill_workers(cluster, addr, workers, rng, last, (0.05, 0.4), lambda: restarts() > 0,
                         flags=peer)
    r = cluster.watch(addr, job)
    res.record(f"workers SIGKILLed {kills} times during the job (>= 8)", kills >= 8)
    n = restarts()
    res.record(f"steps begun again after losing a tree worker: {n} (>= 1)", n >= 1)
    res.record("the progress lines say the steps reduced in a worker tree",
               "tree of" in r.stdout, r.stdout[-800:])
    record_job_end(res, r, ckpt, ref)


def case_peer_unreachable(adjsh, tmp, cluster, res, ref):  # ref: of SMALL
    coord, addr = cluster.coordinator(os.path.join(tmp, "state"), lease_ms=500)
    if not res.record("coordinator started", addr):
        return
    for name in ("a", "b"):  # whichever owns span 0, the sums pushed to it cannot arrive
        cluster.worker(addr, name, log="", flags=["--peer-listen", "127.0.0.1:0",
                                                  "--peer-advertise", "127.0.0.1:1"])
    time.sleep(1.5)  # both registered before the first step deals its spans
    ckpt = os.path.join(tmp, "job")
    job, r = cluster.submit(addr, SMALL.spec(ckpt))
    if not res.record("job submitted", job, r.stderr):
        return
    r = cluster.watch(addr, job)
    n = count_in_logs(cluster, "did not come within", "coordinator*.log")
    res.record(f"steps begun again through the coordinator when roots did not come: {n} (1: "
               "later steps of the same workers use the star at once)", n == 1)
    record_job_end(res, r, ckpt, ref)


def case_worker_stop(adjsh, tmp, cluster, res, ref):  # ref: of HEAVY
    lease_ms = 1000
    coord, addr = cluster.coordinator(os.path.join(tmp, "state"), lease_ms=lease_ms)
    if not res.record("coordinator started", addr):
        return
    stopped = cluster.worker(addr, "stopped", log="--verbose")
    cluster.worker(addr, "other", log="--verbose")
    ckpt = os.path.join(tmp, "job")
    job, r = cluster.submit(addr, HEAVY.spec(ckpt))
    if not res.record("job submitted", job, r.stderr):
        return
    log = cluster.log_path("worker-stopped")
    # Evidence that work done under an expired lease was refused, whichever way the timing
    # goes: the coordinator refused the late result, answered the resumed worker's heartbeat
    # that the task is no longer its, or refused its fetch; or the worker saw by itself that
    # its lease had run out (its last renewal is older than the lease) and did not push.
    refusals = ("result not accepted", "cancelled by the coordinator", "lease lost",
                "its lease has expired")

    def text():
        with open(log, errors="replace") as f:
            return f.read()

    def holds_lease(t):
        """Whether the last task the worker leased has not ended yet in log text t."""
        leases = list(re.finditer(r"task (\S+) leased: ", t))
        if not leases:
            return False
        tid = re.escape(leases[-1].group(1))
        return re.search(rf"task {tid}[ :]", t[leases[-1].end():]) is None

    stops = held = refused = 0
    how = set()
    while stops < 8 and refused < 2:
        if terminal(cluster.status(addr, job)):
            break
        # Right after it leased a task (logged before the fetch; the task then takes tens of
        # ms): stopped now, it holds that lease. Checked on the log once it is stopped.
        n = text().count(" leased: ")
        if not wait_for(lambda: text().count(" leased: ") > n, 30, 0.001):
            break
        stopped.send_signal(signal.SIGSTOP)
        stops += 1
        time.sleep(0.05)  # let a line being written land
        before = text()
        holding = holds_lease(before)
        held += holding
        time.sleep(2.5 * lease_ms / 1000)  # past the lease: the task is handed out again
        stopped.send_signal(signal.SIGCONT)
        time.sleep(1.0)
        seen = [s for s in refusals if s in text()[len(before):]]
        if seen and holding:
            refused += 1
            how.update(seen)
    r = cluster.watch(addr, job)
    res.record(f"worker SIGSTOPped {stops} times for 2.5 leases, {held} of them holding a lease; "
               f"its late work refused {refused} times (>= 1; {', '.join(sorted(how))})",
               refused >= 1,
               open(log, errors="replace").read()[-3000:])
    res.record("job SUCCEEDED", r.returncode == 0, r.stdout[-1500:] + r.stderr)
    res.record("final weights and optimizer state bitwise equal to the undisturbed run "
               "(no task lost or counted twice)", ref is not None and final_files(ckpt) == ref)


def case_coordinator_kill(adjsh, tmp, cluster, res, ref, job_def=SMALL):  # ref: of job_def
    state = os.path.join(tmp, "state")
    coord, addr = cluster.coordinator(state, lease_ms=1000)
    if not res.record("coordinator started", addr):
        return
    for k in range(2):
        cluster.worker(addr, f"w{k}", log="--verbose")
    ckpt = os.path.join(tmp, "job")
    job, r = cluster.submit(addr, job_def.spec(ckpt))
    if not res.record("job submitted", job, r.stderr):
        return
    # Kill in the middle of step 2 (no checkpoint yet) and of step 4 (the checkpoint of step 2
    # exists), once >= 5 of the step's results have been accepted: its work is lost and redone.
    # A step's tasks are named "<version>:<task>", the version counting the steps this
    # coordinator process ran (the first runs resume from step 0, so version = step), and a
    # worker logs "task V:N done:" only for a result the coordinator accepted. Counted after the
    # kill, 5 <= accepted < 64 tasks of that version proves the kill was mid-step.
    since = {}  # log offsets at the start of this coordinator process

    def accepted(version):
        n = 0
        for path in glob.glob(os.path.join(tmp, "worker-*.log")):
            with open(path, errors="replace") as f:
                f.seek(since.get(path, 0))
                n += len(re.findall(rf" task {version}:\d+ done: ", f.read()))
        return n

    for step in (2, 4):
        got = wait_for(lambda: accepted(step) >= 5, 120, 0.005)
        coord.kill()
        coord.wait()
        n, at = accepted(step), latest_step(ckpt)
        res.record(f"coordinator SIGKILLed in step {step} with {n} of its 60 results accepted, "
                   f"checkpoint at step {at}",
                   got and 5 <= n < 60 and at == step - 2, (n, at))
        since = {p: os.path.getsize(p) for p in glob.glob(os.path.join(tmp, "worker-*.log"))}
        coord, addr2 = cluster.coordinator(state, listen=addr)
        if not res.record("coordinator started again on the same address", addr2 == addr):
            return
        # No resubmission: the job is in the state dir's job table and runs on by itself.
    r = cluster.watch(addr, job)
    res.record("job SUCCEEDED after resuming from the checkpoint",
               r.returncode == 0 and "resumed from the checkpoint at step 2" in r.stdout,
               r.stdout[-1500:] + r.stderr)
    res.record("final weights and optimizer state bitwise equal to the undisturbed run",
               ref is not None and final_files(ckpt) == ref)


def case_proxy_cuts(adjsh, tmp, cluster, res, ref):
    coord, addr = cluster.coordinator(os.path.join(tmp, "state"), lease_ms=1000)
    if not res.record("coordinator started", addr):
        return
    proxy = CutProxy(addr, 8 << 10, 512 << 10, seed=3)
    try:
        for k in range(2):
            cluster.worker(proxy.address, f"w{k}", log="--verbose")
        ckpt = os.path.join(tmp, "job")
        job, r = cluster.submit(addr, spec(ckpt))
        if not res.record("job submitted", job, r.stderr):
            return
        r = cluster.watch(addr, job)
    finally:
        proxy.stop()
    offs = sorted(proxy.cut_offsets)
    res.record(f"{proxy.cuts} connections cut mid-stream (>= 10) of {proxy.connections}, "
               f"{proxy.bytes / 1048576:.1f} MiB through the proxy, cut at bytes "
               f"{offs[:1]}..{offs[-1:]}", proxy.cuts >= 10)
    # The workers' own account of the cuts: streams that broke and were retried.
    fetch = count_in_logs(cluster, "FetchInputs failed")
    push = count_in_logs(cluster, "PushResult failed")
    res.record(f"cuts broke {fetch} input streams and {push} result streams, each retried "
               "(>= 5 together)", fetch + push >= 5)
    record_job_end(res, r, ckpt, ref)


def case_proxy_stall(adjsh, tmp, cluster, res, ref):
    coord, addr = cluster.coordinator(os.path.join(tmp, "state"), lease_ms=1000)
    if not res.record("coordinator started", addr):
        return
    proxy = StallProxy(addr, 16 << 10, 128 << 10, stall_first=2, seed=7)
    try:
        for k in range(2):
            cluster.worker(proxy.address, f"w{k}", log="--verbose")
        ckpt = os.path.join(tmp, "job")
        start = time.time()
        job, r = cluster.submit(addr, spec(ckpt))
        if not res.record("job submitted", job, r.stderr):
            return
        # Undisturbed, the job takes seconds; each stall costs about 30 s. Without keepalive
        # it would never end: give up well before CTest's timeout.
        r = cluster.watch(addr, job, timeout=180)
        took = time.time() - start
        # A stalled connection whose worker had nothing more to do may still be waiting for its
        # keepalive ping to go unanswered (at most 20 s + 10 s after the stall).
        wait_for(lambda: proxy.abandoned >= proxy.stalls, 45, 0.2)
    finally:
        proxy.stop()
    after = ", ".join(f"{s:.1f}" for s in proxy.abandon_after_s)
    # gRPC's own words for a ping that went unanswered (informational: the proxy's count is
    # the check).
    watchdog = count_in_logs(cluster, "keepalive watchdog timeout")
    res.record(f"{proxy.stalls} connections stalled (>= 1) of {proxy.connections}, "
               f"{proxy.bytes / 1048576:.1f} MiB through the proxy", proxy.stalls >= 1)
    res.record(f"{proxy.abandoned} of them closed by their worker, {after} s after the stall "
               "(all of them, each within 20 s ping + 10 s timeout and some slack; "
               f"{watchdog} calls failed with `keepalive watchdog timeout`)",
               proxy.stalls >= 1 and proxy.abandoned == proxy.stalls and
               all(s < 45 for s in proxy.abandon_after_s), proxy.abandon_after_s)
    res.record(f"{proxy.reconnects} connections opened after a stalled one was abandoned (>= 1)",
               proxy.reconnects >= 1)
    res.record(f"job SUCCEEDED ({took:.1f} s)", r.returncode == 0, r.stdout[-1500:] + r.stderr)
    res.record("final weights and optimizer state bitwise equal to the undisturbed run",
               ref is not None and final_files(ckpt) == ref)


def dir_bytes(path):
    """Bytes a folder's files take on tmpfs (whole pages)."""
    total = 0
    for name in os.listdir(path):
        total += (os.path.getsize(os.path.join(path, name)) + 4095) // 4096 * 4096
    return total


def case_disk_full(adjsh, tmp, cluster, res, ref, ref_dir):
    mnt = os.path.join(tmp, "small_disk")
    os.mkdir(mnt)
    # What one checkpoint takes, from the reference run; room for two and a half of them, so the
    # third checkpoint (step 6) runs out of space while steps 2 and 4 are kept (keep = 2).
    with open(os.path.join(ref_dir, "latest")) as f:
        one = dir_bytes(os.path.join(ref_dir, f.read().strip()))
    size = 2 * one + one // 2 + 2 * 4096
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIP disk_full: cannot mount a tmpfs ({r.stderr.strip()})", flush=True)
        return SKIP
    try:
        ckpt = os.path.join(mnt, "ckpt")
        cmd = [adjsh, "train", *SMALL.flags, "--checkpoint-dir", ckpt]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        res.record(f"disk full at the third checkpoint ({size} B tmpfs, {one} B a checkpoint): "
                   "exit 1 with a message naming the checkpoint and ENOSPC",
                   r.returncode == 1 and "No space left on device" in r.stderr and
                   "step-00000006" in r.stderr, (r.returncode, r.stderr[-2000:]))
        res.record("the previous checkpoint (step 4) is intact and still `latest`",
                   latest_step(ckpt) == 4 and final_files(ckpt) is not None,
                   os.listdir(ckpt))
        left = sorted(n for n in os.listdir(ckpt) if n not in ("latest", "step-00000002",
                                                                "step-00000004"))
        res.record("no partial checkpoint or temporary file left behind", not left, left)
        subprocess.run(["mount", "-o", "remount,size=64m", mnt], check=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        res.record("with space again: resumed at step 4, finished",
                   r.returncode == 0 and "resumed at step 4" in r.stderr, r.stderr[-2000:])
        res.record("final weights and optimizer state bitwise equal to the undisturbed run",
                   ref is not None and final_files(ckpt) == ref)

        # The same through the job API: the job ends FAILED with the reason; submitted again
        # with space, it resumes from the kept checkpoint.
        subprocess.run(["umount", mnt], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt], check=True)
        coord, addr = cluster.coordinator(os.path.join(tmp, "state"))
        if not res.record("coordinator started", addr):
            return None
        for k in range(2):
            cluster.worker(addr, f"w{k}")
        job, r = cluster.submit(addr, SMALL.spec(ckpt))
        r = cluster.watch(addr, job)
        js = cluster.status(addr, job)
        res.record("job on a full disk: FAILED, the error names the checkpoint and ENOSPC",
                   r.returncode == 1 and js and js["state"] == "FAILED" and
                   "No space left on device" in js.get("error", "") and
                   "step 6" in js.get("error", ""), (r.stderr[-1500:], js))
        res.record("the job's previous checkpoint (step 4) intact, nothing partial left",
                   latest_step(ckpt) == 4 and sorted(os.listdir(ckpt)) ==
                   ["latest", "step-00000002", "step-00000004"], os.listdir(ckpt))
        subprocess.run(["mount", "-o", "remount,size=64m", mnt], check=True)
        job, r = cluster.submit(addr, SMALL.spec(ckpt))
        r = cluster.watch(addr, job)
        # The resume shows in watch's output, or (a job that ended before watch attached) in
        # the coordinator's log.
        with open(cluster.log_path("coordinator"), errors="replace") as f:
            logged = f"{job}: running; resumed from the checkpoint at step 4" in f.read()
        resumed = "resumed from the checkpoint at step 4" in r.stdout or logged
        res.record("submitted again with space: resumed at step 4, SUCCEEDED, bitwise equal",
                   r.returncode == 0 and resumed and
                   ref is not None and final_files(ckpt) == ref, r.stdout[-1500:] + r.stderr)
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    return None


def mamba2_job(adjsh, tmp, steps):
    """A run of LONGER's shape with `steps` steps for a new Mamba-2 model folder in tmp (None
    when init fails)."""
    model = os.path.join(tmp, "mamba2-model")
    r = subprocess.run([adjsh, "init", "--model-type", "mamba2", "--out", model, "--seed", "5",
                        "--hidden-size", "16", "--layers", "2", "--state-size", "8",
                        "--head-dim", "4", "--groups", "2", "--vocab-size", "256"],
                       capture_output=True, text=True, timeout=60)
    return Job(16, 2, 8, 2048, 64, steps=steps, model_dir=model) if r.returncode == 0 else None


CASES = {"worker_kills": case_worker_kills, "worker_kills_tree": case_worker_kills_tree,
         "mamba2_worker_kills": case_worker_kills,
         "mamba2_worker_kills_tree": case_worker_kills_tree,
         "mamba2_coordinator_kill": case_coordinator_kill,
         "peer_unreachable": case_peer_unreachable, "worker_stop": case_worker_stop,
         "coordinator_kill": case_coordinator_kill, "proxy_cuts": case_proxy_cuts,
         "proxy_stall": case_proxy_stall, "disk_full": case_disk_full}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    adjsh = os.path.abspath(args.adjsh)

    if args.case == "disk_full" and os.environ.get("ADJSH_FAULTS_NS") != "1":
        # Mounting needs root; a private mount namespace removes the mount with the test,
        # however it ends.
        if os.geteuid() != 0:
            print("SKIP disk_full: needs root to mount a small tmpfs", flush=True)
            return SKIP
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                               capture_output=True)
        if probe.returncode != 0:
            print("SKIP disk_full: cannot make a private mount namespace (unshare)", flush=True)
            return SKIP
        env = dict(os.environ, ADJSH_FAULTS_NS="1")
        return subprocess.run(["unshare", "--mount", "--propagation", "private",
                               sys.executable, *sys.argv], env=env).returncode

    tmp = tempfile.mkdtemp(prefix=f"adjsh_faults_{args.case}_")
    res = Results()
    cluster = Cluster(adjsh, tmp)
    code = None

    def run_case():
        nonlocal code
        ref_dir = os.path.join(tmp, "reference")
        mamba2 = args.case.startswith("mamba2_")
        job = mamba2_job(adjsh, tmp, STEPS if "coordinator" in args.case else LONGER.steps) \
            if mamba2 else \
            {"worker_stop": HEAVY, "worker_kills": LONGER,
             "worker_kills_tree": LONGER}.get(args.case, SMALL)
        if not res.record("the job's model", job is not None):
            return
        r, ref = train_reference(adjsh, ref_dir, job.flags)
        res.record("undisturbed run (adjsh train in-process)", ref is not None, r.stderr)
        if args.case == "disk_full":
            code = case_disk_full(adjsh, tmp, cluster, res, ref, ref_dir)
        elif mamba2:
            CASES[args.case](adjsh, tmp, cluster, res, ref, job)
        else:
            CASES[args.case](adjsh, tmp, cluster, res, ref)

    guarded(cluster, res, run_case)
    if args.keep or (res.summary() != 0 and code is None):
        print("files kept in", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if code == SKIP:
        return SKIP
    return 0 if all(res.oks) else 1


if __name__ == "__main__":
    sys.exit(main())
