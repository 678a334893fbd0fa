#!/usr/bin/env python3
"""The job API end to end: `adjsh coordinator` + `adjsh worker` processes, driven by
`adjsh submit / status / watch / cancel` (proto/adjsh.proto JobService, coordinator/job_service.h).

  test_jobs.py --adjsh build/cli/adjsh

Checks, with a coordinator on 127.0.0.1 (port 0: it prints the port it got) and 2 workers:
  * a small job from a JSON spec (D=16, K=2, N=4, context 512, chunk 64, 4 steps, built-in
    corpus) is watched to success, `status` shows it SUCCEEDED at 4/4, and its final
    model.safetensors and optimizer.safetensors are bitwise those of `adjsh train` in-process
    with the same flags (the job's defaults are adjsh train's);
  * cancelling a queued job and a running job (state CANCELLED, `watch` exits 1), and a job
    run after the cancellations is still bitwise equal to in-process training;
  * a job whose corpus is too short ends FAILED with the reason (watch exits 1);
  * invalid specs are refused with a message naming the problem and exit 1 (steps 0, an unknown
    model dir, window 5, a bad optimizer value, an unknown JSON field); bad flags exit 2;
  * an unknown job id -> exit 1 with a message; an unreachable coordinator -> exit 1 quickly;
  * SIGTERM stops the coordinator with exit 0 after checkpointing the running job (its watch
    says it was interrupted and exits 1);
  * a coordinator SIGKILLed during its first job and started again on the same address: the
    same spec submitted again (as job-2: ids continue) resumes from its checkpoint dir and ends
    bitwise as an uninterrupted run (the workers, which outlive it, re-register by themselves,
    and nothing they cached for the old job-1 is used for the new one);
  * a job with no worker: its watch and the coordinator's log say it waits for workers (and a
    watch attached then too), and that they are back when a worker comes; it then succeeds.
Every process listens on or connects to 127.0.0.1 and is stopped at the end, also on failure.
Prints `N passed, N failed`; exit status 1 if any check failed.
"""
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import SMALL_SHAPE as SHAPE, SMALL_TRAIN_FLAGS as TRAIN_FLAGS  # noqa: E402
from harness import final_files, run_process_test, wait_for  # noqa: E402


def finish(p, timeout):
    """The output (stdout, stderr) of background process p once it ends, killed after timeout
    seconds."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()


def sigterm(p, timeout=20):
    """Sends p SIGTERM; its exit status, or None if it is still running after timeout seconds."""
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def body(adjsh, tmp, cluster, record):
    run, spec_file, status_json = cluster.run, cluster.spec_file, cluster.status

    # --- help and usage (no coordinator needed) ----------------------------------------------
    for cmd, flags in {"coordinator": ["--listen", "--state-dir", "--lease-ms"],
                       "submit": ["--coordinator", "--spec", "--model", "--hidden-size",
                                  "--tokens", "--text", "--context", "--steps", "--chunk",
                                  "--lr", "--checkpoint-dir"],
                       "status": ["--coordinator", "--job", "--json"],
                       "watch": ["--coordinator", "--job"],
                       "cancel": ["--coordinator", "--job"]}.items():
        r = run(cmd, "--help")
        ok = r.returncode == 0 and f"usage: adjsh {cmd}" in r.stdout and \
            all(f in r.stdout for f in flags) and r.stderr == ""
        record(f"{cmd} --help", ok, r.stdout + r.stderr)
    r = run("--help")
    record("top-level help lists the job commands", r.returncode == 0 and all(
        c in r.stdout for c in ("coordinator", "submit", "status", "watch", "cancel")), r.stdout)
    for a, what in [(["status", "--bogus"], "unknown flag"),
                    (["watch"], "missing --job"),
                    (["cancel", "--coordinator", "127.0.0.1:1"], "missing --job"),
                    (["status", "job-1"], "positional argument"),
                    (["submit", "--steps", "0"], "--steps 0 as a flag"),
                    (["submit", "--steps", "many"], "non-integer --steps"),
                    (["submit", "--spec", "x.json", "--steps", "3"], "--spec with job flags"),
                    (["submit", "--model", tmp, "--hidden-size", "8"], "--model with shape flags"),
                    (["coordinator", "--listen", "nowhere"], "--listen without a port"),
                    (["coordinator", "--insecure-local", "--state-dir", ""],
                     "an empty --state-dir"),
                    # Ports gRPC would have wrapped (99999 -> 34463) or cut short (5abc -> 5).
                    (["coordinator", "--insecure-local", "--listen", "127.0.0.1:65536"],
                     "--listen port 65536"),
                    (["status", "--coordinator", "127.0.0.1:99999"], "--coordinator port 99999"),
                    (["status", "--coordinator", "127.0.0.1:5abc"], "--coordinator port 5abc"),
                    (["worker", "--coordinator", "127.0.0.1:+5"], "worker --coordinator +5"),
                    (["worker", "--coordinator", "127.0.0.1:1", "--peer-listen",
                      "127.0.0.1:99999"], "--peer-listen port 99999"),
                    (["health", "--address", ""], "health --address ''")]:
        r = run(*a)
        record(f"bad usage ({what}) -> exit 2", r.returncode == 2 and r.stderr, r.stderr)

    # --- unreachable coordinator: exit 1 quickly ---------------------------------------------
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there now
    spec_small = {"init": SHAPE, "context_length": 512, "chunk": 64, "steps": 4,
                  "checkpoint_dir": os.path.join(tmp, "job_small")}
    small = spec_file("small", spec_small)
    for a in (["status"], ["status", "--job", "job-1"], ["watch", "--job", "job-1"],
              ["cancel", "--job", "job-1"], ["submit", "--spec", small]):
        r = run(*a, "--coordinator", dead, timeout=30)
        ok = r.returncode == 1 and "cannot reach the coordinator" in r.stderr and r.seconds < 8
        record(f"unreachable coordinator: {a[0]} exits 1 in {r.seconds:.1f} s", ok, r.stderr)

    # --- the reference: adjsh train in-process -----------------------------------------------
    ref_dir = os.path.join(tmp, "ref4")
    r = run("train", *TRAIN_FLAGS, "--steps", "4", "--checkpoint-dir", ref_dir)
    record("adjsh train in-process (reference, 4 steps)", r.returncode == 0, r.stderr)
    ref4 = final_files(ref_dir)
    ref12_dir = os.path.join(tmp, "ref12")
    r = run("train", *TRAIN_FLAGS, "--steps", "12", "--checkpoint-dir", ref12_dir)
    record("adjsh train in-process (reference, 12 steps)", r.returncode == 0, r.stderr)
    ref12 = final_files(ref12_dir)

    # --- a coordinator and two workers -------------------------------------------------------
    state = os.path.join(tmp, "state")
    coord, addr = cluster.coordinator(state)
    record("coordinator prints the address it listens on (port 0)", addr is not None,
           open(os.path.join(tmp, "coordinator.log")).read())
    if addr is None:
        return
    workers = [cluster.worker(addr, f"w{k}") for k in range(2)]
    # A second coordinator on its port, or on its state dir, is refused (gRPC's SO_REUSEPORT
    # let both serve one port, handing out the same job ids; nothing kept two from rewriting
    # one state dir's job records).
    other, other_addr = cluster.coordinator(os.path.join(tmp, "state_other"), listen=addr,
                                            timeout=10, log="coordinator-same-port")
    other.wait(timeout=30)
    log = open(cluster.log_path("coordinator-same-port")).read()
    record("a second coordinator on the same port exits 1",
           other.returncode == 1 and "cannot listen on " + addr in log, log[-500:])
    other, _ = cluster.coordinator(state, timeout=10, log="coordinator-same-state")
    other.wait(timeout=30)
    log = open(cluster.log_path("coordinator-same-state")).read()
    record("a second coordinator on the same --state-dir exits 1",
           other.returncode == 1 and "is in use by another coordinator" in log, log[-500:])

    r = run("status", "--coordinator", addr)
    record("status of an empty coordinator", r.returncode == 0 and "no jobs" in r.stdout, r.stderr)
    r = wait_for(lambda: (lambda r: r if "workers: 2 connected\n" in r.stdout else None)(
        run("status", "--coordinator", addr)), 60, interval=0.5)
    record("status says how many workers are connected", r is not None,
           run("status", "--coordinator", addr).stdout)

    # A small job from a JSON spec, watched to success, bitwise equal to in-process training.
    r = run("submit", "--coordinator", addr, "--spec", small)
    job = r.stdout.strip()
    record("submit a JSON spec prints a job id",
           r.returncode == 0 and re.fullmatch(r"job-\d+", job), r.stdout + r.stderr)
    r = run("watch", "--coordinator", addr, "--job", job, timeout=300)
    steps_seen = re.findall(rf"^{job} step (\d+)/4 .*loss [0-9.]+ \| .* tok/s \| ETA ", r.stdout,
                            re.M)
    # A job that ended before watch attached shows only its final line (a loaded machine).
    ended_first = not steps_seen and re.search(rf"^{job} SUCCEEDED: done: step 4,", r.stdout,
                                               re.M)
    record("watch: a progress line per step, exit 0 on SUCCEEDED",
           r.returncode == 0 and "SUCCEEDED" in r.stdout and
           ((steps_seen and steps_seen[-1] == "4") or ended_first),
           (r.returncode, r.stdout, r.stderr))
    r = run("status", "--coordinator", addr, "--job", job)
    row = re.search(rf"^{job}\s+SUCCEEDED\s+4/4\s+[0-9.]+", r.stdout, re.M)
    record("status shows SUCCEEDED at 4/4 with a loss", r.returncode == 0 and row,
           r.stdout + r.stderr)
    js = status_json(addr, job)
    record("status --json: state, steps, checkpoint",
           js and js["state"] == "SUCCEEDED" and int(js["step"]) == 4 and
           js["last_checkpoint"].endswith("step-00000004") and js["loss"] > 0, js)
    r = run("status", "--coordinator", addr)
    record("status lists the job",
           r.returncode == 0 and re.search(rf"^{job}\s+SUCCEEDED", r.stdout, re.M), r.stdout)
    got = final_files(spec_small["checkpoint_dir"])
    record("job's final model.safetensors and optimizer state bitwise equal to adjsh train",
           got is not None and ref4 is not None and got == ref4,
           "missing" if got is None else "differ")

    # Unknown jobs.
    for cmd in ("status", "watch", "cancel"):
        r = run(cmd, "--coordinator", addr, "--job", "job-999")
        record(f"{cmd} of an unknown job -> exit 1 with a message",
               r.returncode == 1 and "unknown job 'job-999'" in r.stderr, r.stderr)
    r = run("cancel", "--coordinator", addr, "--job", job)
    record("cancel of a finished job -> exit 1",
           r.returncode == 1 and "already finished" in r.stderr, r.stderr)

    # Invalid specs: refused by the coordinator with a message naming the problem, exit 1.
    invalid = [
        ("steps 0", {**spec_small, "steps": 0}, "steps"),
        ("unknown model dir", {"model_dir": os.path.join(tmp, "no_such_model"),
                               "context_length": 512, "steps": 2}, "no_such_model does not exist"),
        ("window 5", {**spec_small, "window": 5}, "window"),
        ("negative lr", {**spec_small, "optimizer": {"lr": -1}}, "optimizer.lr"),
        ("context 1", {**spec_small, "context_length": 1}, "context_length"),
        ("dtype bf16", {**spec_small, "dtype": "bf16"}, "dtype"),
        ("storage f16", {**spec_small, "storage": "f16"}, "storage"),
        ("no model", {"context_length": 512, "steps": 2}, "model"),
        ("missing text file",
         {**spec_small, "text_files": {"paths": [os.path.join(tmp, "nope.txt")]}},
         "nope.txt does not exist"),
        ("unknown JSON field", {**spec_small, "stepz": 3}, "stepz"),
        ("9 spans of 8 chunks", {**spec_small, "spans": 9},
         "spans 9: a span is a run of whole chunks"),
    ]
    for name, spec, want in invalid:
        r = run("submit", "--coordinator", addr, "--spec", spec_file("bad", spec))
        record(f"invalid spec ({name}) refused: exit 1, message names it",
               r.returncode == 1 and want in r.stderr and r.stdout == "", r.stderr)
    r = run("submit", "--coordinator", addr, "--spec", os.path.join(tmp, "missing.json"))
    record("missing spec file -> exit 1", r.returncode == 1 and "missing.json" in r.stderr,
           r.stderr)

    # A job that fails when it starts (its corpus is shorter than the context): FAILED with the
    # reason, watch exits 1.
    short = os.path.join(tmp, "short.txt")
    with open(short, "w") as f:
        f.write("too short for a context of 512 tokens\n")
    r = run("submit", "--coordinator", addr, "--spec",
            spec_file("short", {**spec_small, "text_files": {"paths": [short]}}))
    failing = r.stdout.strip()
    r = run("watch", "--coordinator", addr, "--job", failing, timeout=120)
    record("a job that fails: watch exits 1 with the reason",
           r.returncode == 1 and "FAILED" in r.stderr and "fewer than the context" in r.stderr,
           (r.returncode, r.stdout, r.stderr))
    js = status_json(addr, failing)
    record("status --json of the failed job: FAILED with the error",
           js and js["state"] == "FAILED" and "fewer than the context" in js["error"], js)
    r = run("status", "--coordinator", addr, "--job", failing)
    record("status of the failed job shows the error",
           r.returncode == 0 and "FAILED" in r.stdout and "error: " in r.stdout,
           r.stdout + r.stderr)

    # Cancelling: a running job and a queued one.
    long_spec = {"init": SHAPE, "context_length": 512, "chunk": 64, "steps": 100000}
    r1 = run("submit", "--coordinator", addr, "--spec", spec_file("long", long_spec))
    r2 = run("submit", "--coordinator", addr, "--spec", spec_file("long2", long_spec))
    running, queued = r1.stdout.strip(), r2.stdout.strip()
    record("submit two long jobs", r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr)
    js = wait_for(lambda: (lambda j: j if j and j["state"] == "RUNNING" and int(j["step"]) >= 1
                           else None)(status_json(addr, running)), 120)
    record("the first long job runs (step >= 1)", js is not None, status_json(addr, running))
    js = status_json(addr, queued)
    record("the second waits QUEUED", js and js["state"] == "QUEUED", js)
    watch_q = cluster.popen(["watch", "--coordinator", addr, "--job", queued])
    watch_r = cluster.popen(["watch", "--coordinator", addr, "--job", running])
    time.sleep(0.5)
    r = run("cancel", "--coordinator", addr, "--job", queued)
    record("cancel a queued job", r.returncode == 0 and f"{queued} CANCELLED" in r.stdout,
           r.stdout + r.stderr)
    r = run("cancel", "--coordinator", addr, "--job", running)
    record("cancel the running job", r.returncode == 0 and f"{running} CANCELLED" in r.stdout,
           r.stdout + r.stderr)
    for name, p in (("queued", watch_q), ("running", watch_r)):
        out, err = finish(p, 30)
        record(f"watch of the cancelled {name} job exits 1 with the reason",
               p.returncode == 1 and "CANCELLED" in err, (p.returncode, out[-500:], err))
        if name == "running":  # attached while it ran: at least its current progress line
            record("watch of a running job shows progress lines (step, loss, tok/s, ETA)",
                   re.search(rf"^{running} step \d+/100000 .*loss [0-9.]+ \| .* tok/s \| ETA ",
                             out, re.M), out[-1000:])
    for j in (running, queued):
        js = status_json(addr, j)
        record(f"status: {j} CANCELLED", js and js["state"] == "CANCELLED", js)
    r = run("cancel", "--coordinator", addr, "--job", running)
    record("cancelling a cancelled job again is fine",
           r.returncode == 0 and "CANCELLED" in r.stdout, r.stderr)

    # The service goes on after the cancellations: same result as in-process training.
    again = {**spec_small, "checkpoint_dir": os.path.join(tmp, "job_again")}
    r = run("submit", "--coordinator", addr, "--spec", spec_file("again", again))
    job2 = r.stdout.strip()
    r = run("watch", "--coordinator", addr, "--job", job2, timeout=300)
    got = final_files(again["checkpoint_dir"])
    record("a job after the cancellations: SUCCEEDED, bitwise equal to adjsh train",
           r.returncode == 0 and got is not None and got == ref4, r.stdout[-1000:] + r.stderr)

    # A job given by flags (defaults of adjsh train) gives the same weights too.
    flag_dir = os.path.join(tmp, "job_flags")
    r = run("submit", "--coordinator", addr, *TRAIN_FLAGS, "--steps", "4", "--checkpoint-dir",
            flag_dir)
    job3 = r.stdout.strip()
    r = run("watch", "--coordinator", addr, "--job", job3, timeout=300)
    got = final_files(flag_dir)
    record("a job submitted by flags: bitwise equal to adjsh train with the same flags",
           r.returncode == 0 and got is not None and got == ref4, r.stdout[-1000:] + r.stderr)

    # SIGTERM: the coordinator stops the running job after its last completed step,
    # checkpoints it (it would run on after a restart: tests/faults/test_restart.py) and exits 0.
    r = run("submit", "--coordinator", addr, "--spec", spec_file("long3", long_spec))
    job6 = r.stdout.strip()
    js = wait_for(lambda: (lambda j: j if j and int(j["step"]) >= 1 else None)(
        status_json(addr, job6)), 120)
    w6 = cluster.popen(["watch", "--coordinator", addr, "--job", job6])
    time.sleep(0.5)
    rc = sigterm(coord)
    record("SIGTERM: the coordinator exits 0", js is not None and rc == 0, (js, rc))
    out, err = finish(w6, 20)
    record("SIGTERM: the running job's watch exits 1 and says it was interrupted",
           w6.returncode == 1 and "interrupted by the coordinator's shutdown" in out + err,
           (w6.returncode, out[-500:], err[-500:]))
    for w in workers:
        w.terminate()

    # A fresh coordinator whose first job (job-1) is SIGKILLed after its first checkpoints and
    # started again on the same address; its workers live on and re-register. The same spec
    # submitted again gets a new id (job-2: ids continue after a restart, recorded in the state
    # dir), resumes from the checkpoint dir and ends bitwise as an uninterrupted run: nothing the
    # workers cached for the old job-1 may be taken for the new one.
    state2 = os.path.join(tmp, "state2")
    coord, addr = cluster.coordinator(state2)
    record("a second coordinator", addr is not None)
    if addr is None:
        return
    workers = [cluster.worker(addr, f"v{k}") for k in range(2)]
    resume = {"init": SHAPE, "context_length": 512, "chunk": 64, "steps": 12, "checkpoint_every": 1,
              "checkpoint_dir": os.path.join(tmp, "job_resume")}
    resume_file = spec_file("resume", resume)
    r = run("submit", "--coordinator", addr, "--spec", resume_file)
    latest = os.path.join(resume["checkpoint_dir"], "latest")
    seen = wait_for(lambda: os.path.exists(latest), 120)
    coord.kill()
    coord.wait()
    at = ""
    if seen:
        with open(latest) as f:
            at = f.read().strip()
    record("coordinator SIGKILLed after a checkpoint of its job-1",
           seen and r.returncode == 0 and r.stdout.strip() == "job-1", (at, r.stdout, r.stderr))
    coord, addr2 = cluster.coordinator(state2, listen=addr, timeout=30)
    if addr2 is None:  # the port could not be taken again: a fresh one, with fresh workers
        coord, addr2 = cluster.coordinator(state2)
        for w in workers:
            w.terminate()
        workers = [cluster.worker(addr2, f"v{k}b") for k in range(2)]
    record("coordinator started again", addr2 is not None)
    if addr2 is None:
        return
    addr = addr2
    r = run("submit", "--coordinator", addr, "--spec", resume_file)
    job5 = r.stdout.strip()
    record("the resubmitted job's id continues the numbering (job-2)", job5 == "job-2", job5)
    r = run("watch", "--coordinator", addr, "--job", job5, timeout=300)
    got = final_files(resume["checkpoint_dir"])
    resumed = at != "step-00000012"
    record(f"resubmitted after the restart (checkpoint {at}): "
           f"{'resumed, ' if resumed else ''}SUCCEEDED, bitwise equal to an uninterrupted run",
           r.returncode == 0 and got is not None and ref12 is not None and got == ref12 and
           (not resumed or "resumed from the checkpoint" in r.stdout),
           r.stdout[-1500:] + r.stderr)
    rc = sigterm(coord)
    record("SIGTERM of an idle coordinator: exit 0", rc == 0, rc)
    for w in workers:  # they would find a new coordinator that gets the same port
        w.terminate()
        w.wait(timeout=30)

    # A job with no worker waits, and now says so: two leases (2 s each) after it starts, its
    # watch and the coordinator's log say it waits for workers; a watch attached then gets the
    # note after its summary. A worker started then runs it to the end, bitwise as in-process,
    # and the watch says the workers are back.
    coord, addr = cluster.coordinator(os.path.join(tmp, "state3"), log="coordinator-idle")
    record("a third coordinator, with no worker", addr is not None)
    if addr is None:
        return
    idle = {**spec_small, "checkpoint_dir": os.path.join(tmp, "job_idle")}
    r = run("submit", "--coordinator", addr, "--spec", spec_file("idle", idle))
    job7 = r.stdout.strip()
    early = cluster.popen(["watch", "--coordinator", addr, "--job", job7])
    log_path = cluster.log_path("coordinator-idle")
    r = run("status", "--coordinator", addr)
    record("status of a coordinator with no worker: 0 connected",
           r.returncode == 0 and re.search(rf"^{job7}\s+(QUEUED|RUNNING)", r.stdout, re.M) and
           r.stdout.endswith("workers: 0 connected\n"), r.stdout + r.stderr)
    waited = wait_for(lambda: re.search(  # 4 s, or more on a loaded machine
        r"waiting for workers: none connected for \d+ s; start one with "
        rf"`adjsh worker --coordinator {re.escape(addr)}`", open(log_path).read()), 60)
    record("a job with no worker: the coordinator's log says it waits for workers (after 4 s)",
           r.returncode == 0 and waited, open(log_path).read()[-1000:])
    late = cluster.popen(["watch", "--coordinator", addr, "--job", job7])
    seen, deadline = "", time.time() + 30
    while "waiting for workers" not in seen and time.time() < deadline:
        ready, _, _ = select.select([late.stdout], [], [], 0.5)
        if ready:  # unbuffered: a readline would leave the next line in the file's buffer
            seen += os.read(late.stdout.fileno(), 4096).decode()
    record("a watch attached while the job waits is told so after its summary",
           re.search(rf"^{job7} RUNNING: .*\n{job7} waiting for workers: ", seen, re.M), seen)
    cluster.worker(addr, "late")
    outs = []
    for p in (early, late):
        out, err = finish(p, 300)
        outs.append((p.returncode, out, err))
    rc, out, err = outs[0]
    got = final_files(idle["checkpoint_dir"])
    record("its watch: waiting for workers, then they are back, then SUCCEEDED as in-process",
           rc == 0 and re.search(rf"^{job7} waiting for workers: .*^{job7} workers are back: 1 "
                                 rf"is taking tasks; the job goes on$.*^{job7} SUCCEEDED", out,
                                 re.M | re.S) and got is not None and got == ref4,
           (rc, out[-1500:], err[-500:]))
    record("the late watch ends SUCCEEDED too", outs[1][0] == 0, outs[1])
    js = json.loads(run("status", "--coordinator", addr, "--json").stdout or "{}")
    record("status --json counts the worker",  # int64 fields: decimal strings in proto JSON
           int(js.get("workers_connected", 0)) == 1 and
           int(js.get("workers_taking_tasks", 0)) == 1, js)
    rc = sigterm(coord)
    record("SIGTERM of the third coordinator: exit 0", rc == 0, rc)
    log = open(log_path).read()
    record("the coordinator's log says when the workers are back",
           f"{job7}: workers are back: 1 is taking tasks" in log, log[-1000:])

if __name__ == "__main__":
    run_process_test("adjsh_jobs_", body)
