#!/usr/bin/env python3
"""Security and limits end to end: `adjsh coordinator`, `adjsh worker` and the job clients with
mutual TLS, bearer tokens and per-job limits (docs/SECURITY.md).

  test_security.py --adjsh build/cli/adjsh

Certificates are made fresh in a temporary directory by make_test_certs.sh (openssl): a CA, a
coordinator certificate for 127.0.0.1 / localhost, a worker client certificate, another CA
with a client and a server certificate of its own, two tokens. Checks:
  * coordinator flags: neither TLS nor --insecure-local, --insecure-local on a non-loopback
    address or with TLS flags, TLS without a token -> exit 2; an unreadable certificate, a file
    that is not PEM, a key of another certificate, a too short token -> exit 1 naming the file;
  * a TLS coordinator with one mTLS worker runs a job submitted with the token (file, then
    environment) to success, and its final weights are bitwise those of in-process training;
  * the job API without a token or with the wrong one -> UNAUTHENTICATED; with a worker's
    certificate and no token -> PERMISSION_DENIED; a client trusting another CA, or plaintext
    to the TLS port -> cannot connect (exit 1); a worker with another CA's certificate never
    registers; a worker with --tls-ca but no certificate, plaintext to a non-loopback address,
    a token without --tls-ca -> exit 2;
  * limits of an --insecure-local coordinator: a spec over --max-context, --max-layers,
    --max-hidden or --max-tensor-bytes -> INVALID_ARGUMENT naming the limit; a request over
    --max-message-bytes -> RESOURCE_EXHAUSTED; a spec within the limits is accepted;
  * `adjsh train --workers 1` serves its workers on a Unix socket in a 0700 directory under
    $TMPDIR, and removes it at the end;
  * deadlines and keepalive: against a coordinator stopped with SIGSTOP, `status --timeout 1`
    gives up within seconds, and a running `watch` stream (no deadline) ends with exit 1 once
    keepalive pings go unanswered, instead of hanging.
Every process listens on or connects to 127.0.0.1 and is stopped at the end, also on failure.
Prints `N passed, N failed`; exit status 1 if any check failed.
"""
import os
import re
import signal
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
from harness import SMALL_SHAPE as SHAPE, SMALL_TRAIN_FLAGS as TRAIN_FLAGS  # noqa: E402
from harness import final_files, run_process_test, wait_for  # noqa: E402

def body(adjsh, tmp, procs, record):
    certs = os.path.join(tmp, "certs")
    subprocess.run([os.path.join(HERE, "make_test_certs.sh"), certs], check=True)
    C = lambda name: os.path.join(certs, name)
    env = {k: v for k, v in os.environ.items() if k != "ADJSH_AUTH_TOKEN"}
    spec_file = procs.spec_file

    def run(*a, timeout=120, token_env=None):
        e = dict(env)
        if token_env is not None:
            e["ADJSH_AUTH_TOKEN"] = token_env
        return procs.run(*a, timeout=timeout, env=e)

    def final_model(ckpt):
        return (final_files(ckpt) or {}).get("model.safetensors")

    server_tls = ["--tls-cert", C("server.pem"), "--tls-key", C("server.key"), "--tls-ca",
                  C("ca.pem")]
    worker_tls = ["--tls-ca", C("ca.pem"), "--tls-cert", C("worker.pem"), "--tls-key",
                  C("worker.key")]
    with open(C("short-token"), "w") as f:
        f.write("short\n")
    with open(C("not-pem.pem"), "w") as f:
        f.write("this is not a certificate\n")

    # --- coordinator flags ---------------------------------------------------------------------
    base = ["coordinator", "--listen", "127.0.0.1:0", "--state-dir", os.path.join(tmp, "x")]
    for flags, code, want, what in [
            ([], 2, "--insecure-local", "neither TLS nor --insecure-local"),
            (["--insecure-local", "--listen", "0.0.0.0:0"], 2, "loopback",
             "--insecure-local on 0.0.0.0"),
            (["--insecure-local", "--tls-ca", C("ca.pem")], 2, "excludes",
             "--insecure-local with TLS"),
            (server_tls, 2, "ADJSH_AUTH_TOKEN", "TLS without a token"),
            (server_tls[:4], 2, "--tls-ca", "TLS without --tls-ca"),
            (["--tls-cert", C("nope.pem"), *server_tls[2:], "--auth-token-file", C("token")], 1,
             "nope.pem", "unreadable certificate"),
            (["--tls-cert", C("not-pem.pem"), *server_tls[2:], "--auth-token-file", C("token")],
             1, "not a PEM file", "certificate not PEM"),
            (["--tls-cert", C("server.pem"), "--tls-key", C("worker.key"), "--tls-ca",
              C("ca.pem"), "--auth-token-file", C("token")], 1, "does not match",
             "key of another certificate"),
            (["--tls-cert", C("server.pem"), "--tls-key", C("server.key"), "--tls-ca",
              C("server.key"), "--auth-token-file", C("token")], 1, "no PEM certificate",
             "CA file without a certificate"),
            ([*server_tls, "--auth-token-file", C("short-token")], 1, "16 to 4096",
             "token too short"),
            (["--insecure-local", "--max-message-bytes", "1000"], 2, "--max-message-bytes",
             "--max-message-bytes below 2 MiB")]:
        r = run(*base, *flags, timeout=20)
        record(f"coordinator: {what} -> exit {code}",
               r.returncode == code and want in r.stderr, (r.returncode, r.stderr))

    # --- a TLS coordinator with an mTLS worker --------------------------------------------------
    coord, addr = procs.coordinator(os.path.join(tmp, "tls"), flags=[*server_tls, "--auth-token-file", C("token")],
                                   log="tls")
    record("TLS coordinator starts", addr is not None)
    if addr is None:
        return
    # grpc.health.v1 on the main port, under its TLS, without a certificate or token.
    r = run("health", "--address", addr, "--tls-ca", C("ca.pem"), timeout=20)
    record("health on the coordinator's main port over TLS -> SERVING, exit 0",
           r.returncode == 0 and r.stdout.strip() == "SERVING", (r.stdout, r.stderr))
    r = run("health", "--address", addr, "--timeout", "2", timeout=20)
    record("plaintext health check of the TLS main port -> no answer, exit 1",
           r.returncode == 1 and "no answer" in r.stderr, (r.stdout, r.stderr))
    r = run("health", "--address", addr, "--tls-cert", C("worker.pem"), "--tls-key",
            C("worker.key"), timeout=20)
    record("health --tls-cert without --tls-ca -> exit 2",
           r.returncode == 2 and "--tls-ca" in r.stderr, (r.stdout, r.stderr))
    procs.worker(addr, "w1", log="", flags=worker_tls)
    client = ["--coordinator", addr, "--tls-ca", C("ca.pem")]
    with_token = [*client, "--auth-token-file", C("token")]

    ckpt = os.path.join(tmp, "job_tls")
    spec = spec_file("small", {"init": SHAPE, "context_length": 512, "chunk": 64, "steps": 2,
                               "checkpoint_dir": ckpt})
    r = run("submit", *with_token, "--spec", spec, timeout=30)
    job = r.stdout.strip()
    record("submit over TLS with --auth-token-file", r.returncode == 0 and job, r.stderr)
    w = run("watch", *client, "--job", job, timeout=300, token_env=open(C("token")).read())

    def tail(name):
        with open(os.path.join(tmp, name), errors="replace") as f:
            return f.read()[-1500:]
    record("watch over TLS with ADJSH_AUTH_TOKEN -> SUCCEEDED", w.returncode == 0,
           (w.stdout[-1500:], w.stderr, run("status", *with_token, timeout=20).stdout,
            tail("tls.log"), tail("worker-w1.log")))
    ref = os.path.join(tmp, "ref")
    t = run("train", *TRAIN_FLAGS, "--steps", "2", "--checkpoint-dir", ref, timeout=300)
    got, want = final_model(ckpt), final_model(ref)
    record("TLS job weights bitwise those of in-process training",
           t.returncode == 0 and got is not None and got == want, t.stderr)

    # --- refused callers -----------------------------------------------------------------------
    r = run("status", *client, timeout=20)
    record("job API without a token -> UNAUTHENTICATED, exit 1",
           r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr)
    r = run("status", *client, "--auth-token-file", C("token-wrong"), timeout=20)
    record("job API with a wrong token -> UNAUTHENTICATED, exit 1",
           r.returncode == 1 and "UNAUTHENTICATED" in r.stderr and "refused the bearer token"
           in r.stderr, r.stderr)
    r = run("status", *worker_tls, "--coordinator", addr, timeout=20)
    record("job API with a worker certificate, no token -> PERMISSION_DENIED, exit 1",
           r.returncode == 1 and "PERMISSION_DENIED" in r.stderr, r.stderr)
    r = run("status", *with_token, "--tls-cert", C("worker.pem"), "--tls-key", C("worker.key"),
            timeout=20)
    record("job API with the token (and a worker certificate) -> exit 0",
           r.returncode == 0 and job in r.stdout, r.stderr)
    r = run("status", "--coordinator", addr, "--tls-ca", C("other-ca.pem"), "--auth-token-file",
            C("token"), timeout=20)
    record("client trusting another CA -> cannot connect, exit 1",
           r.returncode == 1 and "cannot reach" in r.stderr, r.stderr)
    r = run("status", "--coordinator", addr, timeout=20)
    record("plaintext client to the TLS port -> exit 1", r.returncode == 1, r.stderr)

    rogue = procs.worker(addr, "rogue", log="", flags=["--tls-ca", C("ca.pem"), "--tls-cert",
                                                        C("rogue.pem"), "--tls-key", C("rogue.key")])
    time.sleep(3)
    with open(os.path.join(tmp, "worker-rogue.log"), errors="replace") as f:
        log = f.read()
    record("worker with another CA's certificate never registers",
           rogue.poll() is None and "RegisterWorker failed" in log and "registered" not in log, log)
    # gRPC says no more than "Socket closed", as for a coordinator that went away; the log
    # names the likely cause.
    record("its log says the coordinator most likely refused its certificate",
           "most often the coordinator refusing this worker's certificate" in log, log)
    rogue.send_signal(signal.SIGTERM)
    rogue.wait(timeout=10)
    doubter = procs.worker(addr, "doubter", log="", flags=[
        "--tls-ca", C("other-ca.pem"), "--tls-cert", C("worker.pem"), "--tls-key", C("worker.key")])
    time.sleep(3)
    with open(os.path.join(tmp, "worker-doubter.log"), errors="replace") as f:
        log = f.read()
    record("worker trusting another CA never registers, and its log says it does not trust "
           "the coordinator's certificate",
           doubter.poll() is None and "registered" not in log and
           "does not trust the coordinator's certificate" in log, log)
    doubter.send_signal(signal.SIGTERM)
    doubter.wait(timeout=10)

    for a, want, what in [
            (["worker", "--coordinator", addr, "--tls-ca", C("ca.pem")], "--tls-cert",
             "worker with --tls-ca but no certificate"),
            (["worker", "--coordinator", "10.0.0.1:50051"], "not a loopback",
             "plaintext worker to a non-loopback address"),
            (["status", "--coordinator", addr, "--auth-token-file", C("token")], "need --tls-ca",
             "token without --tls-ca"),
            (["status", "--coordinator", "192.0.2.1:1"], "not a loopback",
             "plaintext client to a non-loopback address")]:
        r = run(*a, timeout=20)
        record(f"{what} -> exit 2", r.returncode == 2 and want in r.stderr, r.stderr)
    coord.send_signal(signal.SIGTERM)
    coord.wait(timeout=20)

    # --- the worker tree over mutual TLS: peer endpoints with the workers' certificates ------
    coord, addr = procs.coordinator(os.path.join(tmp, "tls_tree"),
                                    flags=[*server_tls, "--auth-token-file", C("token")],
                                    log="tls_tree")
    record("TLS coordinator for the worker tree starts", addr is not None)
    if addr is None:
        return
    for i, cert in enumerate(["peer", "peer2"]):
        procs.worker(addr, f"peer{i}", log="", flags=[
            "--tls-ca", C("ca.pem"), "--tls-cert", C(cert + ".pem"), "--tls-key", C(cert + ".key"),
            "--peer-listen", "127.0.0.1:0", "--peer-tls-name", "adjsh-worker"])
    time.sleep(2)  # both registered before the first step deals its spans
    ckpt_tree = os.path.join(tmp, "job_tls_tree")
    spec = spec_file("tree", {"init": SHAPE, "context_length": 512, "chunk": 64, "steps": 2,
                              "checkpoint_dir": ckpt_tree})
    tree_client = ["--coordinator", addr, "--tls-ca", C("ca.pem"), "--auth-token-file",
                   C("token")]
    r = run("submit", *tree_client, "--spec", spec, timeout=30)
    w = run("watch", *tree_client, "--job", r.stdout.strip(), timeout=300)
    record("worker tree over mutual TLS: SUCCEEDED, a tree of 2 workers",
           r.returncode == 0 and w.returncode == 0 and "tree of 2" in w.stdout,
           (w.stdout[-1500:], w.stderr, tail("tls_tree.log"), tail("worker-peer0.log"),
            tail("worker-peer1.log")))
    record("worker tree over mutual TLS: weights bitwise those of in-process training",
           final_model(ckpt_tree) is not None and final_model(ckpt_tree) == final_model(ref))
    # A worker's main port (its peer endpoint) answers grpc.health.v1 under its TLS too.
    peer = re.search(r"peer endpoint on (\S+)", tail("worker-peer0.log"))
    r = run("health", "--address", peer.group(1) if peer else "127.0.0.1:1", "--tls-ca",
            C("ca.pem"), "--tls-server-name", "adjsh-worker", timeout=20)
    record("health on a worker's peer endpoint over TLS -> SERVING, exit 0",
           peer is not None and r.returncode == 0 and r.stdout.strip() == "SERVING",
           (r.stdout, r.stderr, tail("worker-peer0.log")))
    coord.send_signal(signal.SIGTERM)
    coord.wait(timeout=20)
    for a, want_err, what in [
            (["--peer-listen", "0.0.0.0:0"], "not a loopback", "plaintext peer endpoint on 0.0.0.0"),
            (["--peer-listen", "127.0.0.1:0", "--peer-tls-name", "x"], "needs --tls-ca",
             "--peer-tls-name without TLS"),
            (["--peer-advertise", "127.0.0.1:1"], "needs --peer-listen",
             "--peer-advertise without --peer-listen"),
            (["--peer-listen", "nonsense"], "HOST:PORT", "a malformed --peer-listen")]:
        r = run("worker", "--coordinator", "127.0.0.1:1", *a, timeout=20)
        record(f"worker: {what} -> exit 2", r.returncode == 2 and want_err in r.stderr, r.stderr)

    # --- limits ----------------------------------------------------------------------------------
    coord, addr = procs.coordinator(os.path.join(tmp, "limits"), log="limits", flags=[
        "--insecure-local", "--max-context", "1024", "--max-layers", "2", "--max-hidden", "32",
        "--max-tensor-bytes", "40000", "--max-message-bytes", str(2 << 20)])
    record("--insecure-local coordinator with limits starts", addr is not None)
    if addr is None:
        return
    for shape, ctx, limit in [(SHAPE, 2048, "--max-context"),
                              (dict(SHAPE, layers=3), 512, "--max-layers"),
                              (dict(SHAPE, hidden_size=64), 512, "--max-hidden"),
                              (dict(SHAPE, vocab_size=1000), 512, "--max-tensor-bytes")]:
        r = run("submit", "--coordinator", addr, "--spec",
                spec_file("over", {"init": shape, "context_length": ctx, "steps": 1}), timeout=30)
        record(f"spec over {limit} -> INVALID_ARGUMENT naming it, exit 1",
               r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr and limit in r.stderr,
               r.stderr)
    big = {"init": SHAPE, "context_length": 512, "steps": 1,
           "text_files": {"paths": ["/usr/share/common-licenses/GPL-3"] * 100000}}
    r = run("submit", "--coordinator", addr, "--spec", spec_file("big", big), timeout=60)
    record("request over --max-message-bytes -> RESOURCE_EXHAUSTED, exit 1",
           r.returncode == 1 and "RESOURCE_EXHAUSTED" in r.stderr, r.stderr)
    long_spec = {"init": SHAPE, "context_length": 1024, "chunk": 64, "steps": 100000,
                 "checkpoint_dir": os.path.join(tmp, "job_long")}
    r = run("submit", "--coordinator", addr, "--spec", spec_file("long", long_spec), timeout=30)
    long_job = r.stdout.strip()
    record("spec within the limits is accepted", r.returncode == 0 and long_job, r.stderr)

    # --- local clusters: a Unix socket in a private directory, removed at the end -------------
    sock_tmp = os.path.join(tmp, "sock_tmp")
    os.makedirs(sock_tmp)
    e = dict(env, TMPDIR=sock_tmp)
    train = subprocess.Popen([adjsh, "train", *TRAIN_FLAGS, "--steps", "3", "--workers", "1",
                              "--checkpoint-dir", os.path.join(tmp, "local_ckpt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=e)
    procs.procs.append(train)
    seen = None
    deadline = time.time() + 60
    while seen is None and time.time() < deadline and train.poll() is None:
        for name in os.listdir(sock_tmp):
            d = os.path.join(sock_tmp, name)
            if name.startswith("adjsh-cluster-") and os.path.exists(os.path.join(d, "coordinator")):
                seen = (os.stat(d).st_mode & 0o777, stat.S_ISSOCK(
                    os.stat(os.path.join(d, "coordinator")).st_mode))
        time.sleep(0.05)
    err = train.communicate(timeout=300)[1]
    record("local cluster: a socket in a 0700 directory, no TCP",
           seen == (0o700, True) and "unix:" in err, (seen, err[-2000:]))
    record("local cluster: trains, and removes its socket directory",
           train.returncode == 0 and os.listdir(sock_tmp) == [], (train.returncode,
                                                                  os.listdir(sock_tmp)))

    # --- deadlines and keepalive against a stopped coordinator ---------------------------------
    procs.worker(addr, "w2", log="")
    watch = procs.popen(["watch", "--coordinator", addr, "--job", long_job], env=env,
                        stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and "RUNNING" not in run("status", "--coordinator", addr,
                                                          "--job", long_job, timeout=20).stdout:
        time.sleep(0.2)
    time.sleep(1)
    coord.send_signal(signal.SIGSTOP)
    r = run("status", "--coordinator", addr, "--timeout", "1", timeout=30)
    record("status --timeout 1 against a stopped coordinator -> exit 1 within seconds",
           r.returncode == 1 and "no answer" in r.stderr and r.seconds < 10, (r.seconds, r.stderr))
    try:
        watch.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pass
    t_end = watch.returncode
    err = watch.stderr.read() if t_end is not None else ""
    record("watch stream to a stopped coordinator ends (keepalive), exit 1",
           t_end == 1 and "ended before the job did" in err, (t_end, err))
    coord.send_signal(signal.SIGCONT)

    # --- --tls-server-name: a coordinator whose certificate names only adjsh-worker (as a pod's
    # service name), dialled at 127.0.0.1 (as through kubectl port-forward) -------------------
    named_tls = ["--tls-cert", C("peer2.pem"), "--tls-key", C("peer2.key"), "--tls-ca",
                 C("ca.pem"), "--auth-token-file", C("token")]
    _, named = procs.coordinator(os.path.join(tmp, "named"), flags=named_tls, log="named")
    record("TLS coordinator with a certificate for adjsh-worker only starts", named is not None)
    if named is None:
        return
    r = run("status", "--coordinator", named, "--tls-ca", C("ca.pem"), "--auth-token-file",
            C("token"), timeout=30)
    record("status to 127.0.0.1 without --tls-server-name: refused (the name does not match)",
           r.returncode == 1, (r.returncode, r.stderr))
    r = run("status", "--coordinator", named, "--tls-ca", C("ca.pem"), "--auth-token-file",
            C("token"), "--tls-server-name", "adjsh-worker", timeout=30)
    record("status with --tls-server-name adjsh-worker: answered", r.returncode == 0,
           (r.returncode, r.stderr))
    procs.worker(named, "named-w", log="", flags=[*worker_tls, "--tls-server-name",
                                                   "adjsh-worker"])
    registered = wait_for(lambda: "registered with" in tail("worker-named-w.log"), 20)
    record("a worker with --tls-server-name adjsh-worker registers", registered,
           tail("worker-named-w.log")[-600:])
    r = run("status", "--coordinator", "127.0.0.1:1", "--tls-server-name", "x", timeout=30)
    record("--tls-server-name without --tls-ca: bad usage",
           r.returncode == 2 and "--tls-server-name" in r.stderr, r.stderr)


if __name__ == "__main__":
    run_process_test("adjsh_security_", body)
