#!/usr/bin/env python3
"""The Python client (clients/python/adjsh_client) end to end against a real coordinator and
worker on 127.0.0.1 (run with the project venv, which has grpcio):

  * the stubs are generated from proto/adjsh.proto;
  * submit a spec dict, watch it with a progress callback to SUCCEEDED, read its checkpoint
    (the model.safetensors of the step folder the job reports), list jobs, status;
  * a job cancelled while it runs: watch raises JobFailed with the CANCELLED state;
  * a bad spec and an unreachable coordinator raise grpc.RpcError with the coordinator's
    message / UNAVAILABLE;
  * the example clients/python/examples/train_tiny.py runs.

  .venv/bin/python tests/clients/test_python_client.py --adjsh build/cli/adjsh
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from harness import SMALL_SHAPE, read_f32_tensors, run_process_test  # noqa: E402

try:
    import grpc
    from adjsh_client import Client, JobFailed
except ImportError as e:  # pragma: no cover
    sys.exit(f"test_python_client: needs grpcio ({e}): run scripts/setup-venv.sh")


def body(adjsh, tmp, cluster, record):
    _, addr = cluster.coordinator(os.path.join(tmp, "state"))
    record("coordinator starts", addr is not None)
    if addr is None:
        return
    cluster.worker(addr, "w0")
    events = []
    with Client(addr) as c:
        ckpt = os.path.join(tmp, "ck")
        job = c.submit({"init": SMALL_SHAPE, "context_length": 512, "chunk": 64, "steps": 4,
                        "checkpoint_dir": ckpt})
        record(f"submit a spec dict: {job}", job.startswith("job-"))
        final = c.watch(job, on_event=events.append, timeout=300)
        steps = [e.get("step") for e in events if "step" in e]
        record(f"watch to SUCCEEDED with a progress callback (steps seen {steps})",
               final["state"] == "SUCCEEDED" and 4 in steps and final["step"] == 4 and
               all(e["job_id"] == job for e in events), events[-3:])
        step_dir = final.get("last_checkpoint", "")
        model = os.path.join(step_dir, "model.safetensors")
        tensors = read_f32_tensors(model) if os.path.exists(model) else {}
        record(f"its checkpoint {os.path.basename(step_dir)} holds the trained model "
               f"({len(tensors)} tensors)",
               "backbone.embeddings.weight" in tensors and step_dir.startswith(ckpt), step_dir)
        record("workers() counts the one connected",
               c.workers() == {"connected": 1, "taking_tasks": 1}, c.workers())
        listed = [j["job_id"] for j in c.jobs()]
        record("jobs() lists it; status() agrees", job in listed and
               c.status(job)["state"] == "SUCCEEDED" and
               c.jobs(states=["SUCCEEDED"])[0]["job_id"] == job, listed)

        long_job = c.submit({"init": SMALL_SHAPE, "context_length": 512, "chunk": 64,
                             "steps": 100000, "checkpoint_dir": os.path.join(tmp, "ck2")})
        seen = []

        def cancel_after_a_step(e):
            seen.append(e)
            if e.get("step", 0) >= 1 and len(seen) < 50:
                c.cancel(long_job)
        try:
            c.watch(long_job, on_event=cancel_after_a_step, timeout=300)
            record("a cancelled job raises JobFailed", False, "no exception")
        except JobFailed as e:
            record("a cancelled job: watch raises JobFailed (CANCELLED)",
                   e.job["state"] == "CANCELLED", e.job)
        try:
            c.submit({"init": SMALL_SHAPE, "context_length": 1, "steps": 1})
            record("a bad spec is refused", False, "accepted")
        except grpc.RpcError as e:
            record("a bad spec: RpcError INVALID_ARGUMENT naming the field",
                   e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                   "context_length" in e.details(), (e.code(), e.details()))
    try:
        Client("127.0.0.1:1", timeout=3).jobs()
        record("an unreachable coordinator raises", False, "no exception")
    except grpc.RpcError as e:
        record("an unreachable coordinator: RpcError UNAVAILABLE",
               e.code() == grpc.StatusCode.UNAVAILABLE, e.code())
    # TLS with the bearer token, and a certificate named for another host (server_name).
    certs = os.path.join(tmp, "certs")
    subprocess.run([os.path.join(ROOT, "tests", "security", "make_test_certs.sh"), certs],
                   check=True, capture_output=True)
    C = lambda name: os.path.join(certs, name)  # noqa: E731
    token = open(C("token")).read().strip()
    for cert, name in (("server", None), ("peer2", "adjsh-worker")):
        _, tls = cluster.coordinator(
            os.path.join(tmp, f"state-{cert}"), log=f"coordinator-{cert}",
            flags=("--tls-cert", C(f"{cert}.pem"), "--tls-key", C(f"{cert}.key"), "--tls-ca",
                   C("ca.pem"), "--auth-token-file", C("token")))
        with Client(tls, ca=C("ca.pem"), token=token, server_name=name) as c:
            record(f"TLS with the token{' and server_name ' + name if name else ''}: jobs() "
                   f"answers", c.jobs() == [])
        try:
            Client(tls, ca=C("ca.pem"), token="x" * 32, server_name=name).jobs()
            record("a wrong token is refused", False, "answered")
        except grpc.RpcError as e:
            record(f"a wrong token: UNAUTHENTICATED ({cert})",
                   e.code() == grpc.StatusCode.UNAUTHENTICATED, e.code())
    r = subprocess.run([sys.executable, os.path.join(ROOT, "clients", "python", "examples",
                                                     "train_tiny.py"), "--coordinator", addr,
                        "--steps", "2", "--checkpoint-dir", os.path.join(tmp, "ck3")],
                       capture_output=True, text=True, timeout=300)
    record("the example train_tiny.py runs to SUCCEEDED",
           r.returncode == 0 and "SUCCEEDED" in r.stdout, r.stdout[-800:] + r.stderr[-800:])


if __name__ == "__main__":
    run_process_test("adjsh-pyclient-", body)
