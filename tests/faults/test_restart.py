#!/usr/bin/env python3
"""A coordinator that survives its own restart: SIGTERM and SIGKILL mid-job, then a plain restart.

  test_restart.py --adjsh build/cli/adjsh [--keep]

A coordinator with a state dir and two workers runs job-1 (D=16, K=2, N=4, context 2048, chunk
64, 10 steps, a checkpoint every 3) with job-2 queued behind it. Twice, mid-job:
  * SIGTERM: the coordinator exits 0 within 20 s, having checkpointed job-1 at its last
    completed step (a step that is no multiple of 3, so the checkpoint is the shutdown's own);
  * SIGKILL: nothing runs; the job record on disk still says RUNNING.
Each time it is started again with the same state dir and no resubmission. It must, by itself:
list job-1 and job-2 with their specs; run job-1 on from its latest checkpoint (its status says
it resumed) and then job-2; follow job-1 with `adjsh watch --job job-1` to SUCCEEDED. The final
model and optimizer state of both jobs are bitwise those of `adjsh train` run undisturbed with
the same settings; a new submission gets the next id (job-3), never an old one.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import final_files, latest_step, run_process_test, train_reference  # noqa: E402

SHAPE = {"hidden_size": 16, "layers": 2, "state_size": 4, "vocab_size": 256}
FLAGS = ["--hidden-size", "16", "--layers", "2", "--state-size", "4", "--context", "2048",
         "--chunk", "64", "--steps", "10", "--checkpoint-every", "3"]


def spec(ckpt):
    return {"init": SHAPE, "context_length": 2048, "chunk": 64, "steps": 10,
            "checkpoint_every": 3, "checkpoint_dir": ckpt}


def one_case(adjsh, tmp, cluster, record, how, reference):
    run = cluster.run
    state = os.path.join(tmp, f"state-{how}")
    ck1, ck2 = os.path.join(tmp, f"ck1-{how}"), os.path.join(tmp, f"ck2-{how}")
    coord, addr = cluster.coordinator(state, log=f"coordinator-{how}")
    if not record(f"{how}: coordinator started", addr is not None):
        return
    workers = [cluster.worker(addr, f"{how}-w{k}") for k in range(2)]
    job1, r1 = cluster.submit(addr, spec(ck1))
    job2, r2 = cluster.submit(addr, spec(ck2))
    if not record(f"{how}: job-1 and job-2 submitted", (job1, job2) == ("job-1", "job-2"),
                  r1.stderr + r2.stderr):
        return
    # Mid-job: after the first checkpoint (step 3) and a further step, before the end.
    deadline = time.time() + 120
    step = 0
    while time.time() < deadline:
        st = cluster.status(addr, "job-1") or {}
        step = int(st.get("step", 0))
        if step >= 4 and latest_step(ck1) >= 3:
            break
        time.sleep(0.02)
    if how == "SIGTERM":
        coord.send_signal(signal.SIGTERM)
        try:
            rc = coord.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = None
        at = latest_step(ck1)
        record(f"SIGTERM at step {step}: exit 0, job-1 checkpointed at its last completed "
               f"step ({at})", rc == 0 and at >= step and 4 <= at < 10, (rc, step, at))
    else:
        coord.kill()
        coord.wait()
        with open(os.path.join(state, "jobs", "job-1.json")) as f:
            text = f.read()
        record(f"SIGKILL at step {step}: job-1's record on disk says RUNNING",
               4 <= step < 10 and '"RUNNING"' in text, (step, text[:300]))
    # The same address, so that the workers (which outlive it) come back by themselves.
    coord, addr2 = cluster.coordinator(state, listen=addr, log=f"coordinator-{how}-2")
    if addr2 is None:  # the port was taken meanwhile: a fresh one, and fresh workers
        coord, addr2 = cluster.coordinator(state, log=f"coordinator-{how}-3")
        for w in workers:
            w.terminate()
        workers = [cluster.worker(addr2, f"{how}-v{k}") for k in range(2)]
    if not record(f"{how}: restarted with the same state dir", addr2 is not None):
        return
    r = run("status", "--coordinator", addr2, timeout=30)
    record(f"{how}: after the restart, status lists job-1 and job-2",
           r.returncode == 0 and "job-1" in r.stdout and "job-2" in r.stdout, r.stdout + r.stderr)
    w = cluster.watch(addr2, "job-1", timeout=300)
    record(f"{how}: `adjsh watch --job job-1` follows it to SUCCEEDED", w.returncode == 0,
           w.stdout[-600:] + w.stderr[-600:])
    st1 = cluster.status(addr2, "job-1") or {}
    w2 = cluster.watch(addr2, "job-2", timeout=300)
    got1, got2 = final_files(ck1), final_files(ck2)
    log = ""
    for name in (f"coordinator-{how}-2", f"coordinator-{how}-3"):
        if os.path.exists(cluster.log_path(name)):
            with open(cluster.log_path(name)) as f:
                log += f.read()
    resumed = "job-1: running; resumed from the checkpoint at step" in log
    record(f"{how}: job-1 resumed from its checkpoint and ends bitwise as an undisturbed run",
           resumed and got1 is not None and got1 == reference, (str(st1)[:300], log[-600:]))
    record(f"{how}: job-2 (queued at the stop) ran after it, bitwise as an undisturbed run",
           w2.returncode == 0 and got2 is not None and got2 == reference, w2.stderr[-400:])
    job3, r = cluster.submit(addr2, spec(os.path.join(tmp, f"ck3-{how}")))
    record(f"{how}: a new job after the restart gets a new id (job-3)", job3 == "job-3",
           (job3, r.stderr))
    coord.send_signal(signal.SIGTERM)
    coord.wait(timeout=30)
    for w in workers:
        w.terminate()


def body(adjsh, tmp, cluster, record):
    r, reference = train_reference(adjsh, os.path.join(tmp, "reference"), FLAGS)
    if not record("undisturbed in-process reference run", reference is not None, r.stderr):
        return
    for how in ("SIGTERM", "SIGKILL"):
        one_case(adjsh, tmp, cluster, record, how, reference)


if __name__ == "__main__":
    run_process_test("adjsh_restart_", body)
