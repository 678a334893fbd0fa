#!/usr/bin/python3
"""docker/compose.yaml's stack run by a real engine with no registry (issue 50's second part).

  test_stack.py --adjsh build/cli/adjsh [--keep-images] [--keep]

  * dockerd started by the test as test_images.py starts it (vfs, no iptables, a socket and data
    root of its own) and stopped at the end; the base image made by debootstrap.
  * The images built by docker-compose (BuildKit, through docker.io's CLI) from
    docker/compose.yaml with tests/deploy/compose.cpu.yaml: the coordinator and the CPU worker
    with the suite's binary (ADJSH_BINARY=prebuilt), Prometheus from Debian's package
    (deploy/prometheus/Dockerfile).
  * The stack up: the coordinator, 2 CPU workers (worker-0, worker-1 on the network) and
    Prometheus with deploy/prometheus/prometheus.yml, on compose's network: a user-defined
    bridge, where containers reach each other by name without iptables, and docker-proxy
    publishes the ports on 127.0.0.1 (free ports, ADJSH_COORDINATOR_PORT and
    ADJSH_PROMETHEUS_PORT). Compose's health checks ask the gRPC health service (`adjsh
    health`), and the workers start once the coordinator is healthy.
  * From the host, `adjsh submit` over TLS with the job token (the workers hold CA-signed client
    certificates: mutual TLS) trains a job to SUCCEEDED. While it runs, worker-0's adjsh (its
    container's PID 1) is killed with SIGKILL from the host: the restart policy starts it again
    (a `docker kill` would count as a manual stop, which unless-stopped does not restart), and
    it registers again and is healthy.
  * The job's final weights and optimizer state, copied out of the state volume, are bitwise
    those of `adjsh train` in-process with the same flags.
  * Prometheus reports both workers up and serves their memory and throughput series.
  * Everything removed at the end, also on failure: `docker-compose down -v` (containers,
    network, volumes), the images unless --keep-images, dockerd stopped, the temporary folder.
Prints the job's progress and the kill as they happen, the images' sizes and build times. Needs
root, dockerd, debootstrap, docker-compose and the docker client: where one is missing it exits
77 (skipped), except under CI=true, where that fails.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "metrics"))
# test_images puts tests/ on the path (harness).
from test_images import BASE, Engine, DOCKER, apt_mirror, free_port, missing_tools  # noqa: E402
from harness import (Results, final_files, guarded, run_adjsh, train_reference,  # noqa: E402
                     wait_for)
from test_prometheus_e2e import query  # noqa: E402
from certs import issue_leaf  # noqa: E402

PROJECT = "adjshstack"
FILES = [os.path.join(ROOT, "docker", "compose.yaml"), os.path.join(HERE, "compose.cpu.yaml")]
IMAGES = {"coordinator": "adjsh-coordinator:stack-test",  # by the service that builds it
          "cpu-worker-0": "adjsh-worker-cpu:stack-test",
          "prometheus": "adjsh-prometheus:stack-test"}
ADJSH = ["coordinator", "cpu-worker-0", "cpu-worker-1"]
UID = 10001  # the images' adjsh user: it reads the keys
# Long enough for a kill after the second step and the worker's restart and health before the
# last (0.6 s a step through 2 workers on 2 host cores; 15 s in-process); submit's defaults are
# train's, so the bits must agree.
JOB = ["--hidden-size", "32", "--layers", "3", "--state-size", "8", "--context", "65536",
       "--chunk", "512", "--steps", "60"]


def timed(cmd, env=None, timeout=300):
    """cmd to its end: a CompletedProcess (text) with .seconds; exit 124 on timeout."""
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        r = subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")
    r.seconds = time.time() - t0
    return r


def make_base(engine, tmp):
    """local/debian:12 as test_images.py makes it: debootstrap from apt's mirror, imported."""
    rootfs = os.path.join(tmp, "rootfs")
    r = timed(["sh", "-ec", f"debootstrap --variant=minbase bookworm {rootfs} {apt_mirror()} "
                            f">/dev/null; tar -C {rootfs} -c . | {DOCKER} import - {BASE}"],
              env=engine.env, timeout=900)
    shutil.rmtree(rootfs, ignore_errors=True)
    return r


def make_tls(tls):
    """make_test_certs.sh's CA, worker certificate and token; the coordinator's certificate made
    again with the names compose.yaml asks for: the service name (workers), and 127.0.0.1 (the
    host's clients through the published port, the health check inside the container)."""
    subprocess.run(["bash", os.path.join(ROOT, "tests", "security", "make_test_certs.sh"), tls],
                   check=True)
    issue_leaf(tls, "server", "coordinator",
               "subjectAltName=DNS:coordinator,DNS:localhost,IP:127.0.0.1\n"
               "extendedKeyUsage=serverAuth")
    for name in os.listdir(tls):
        os.chown(os.path.join(tls, name), UID, UID)


class Stack:
    """docker-compose on the test's engine, with the stack's environment."""

    def __init__(self, engine, tmp, record, args):
        self.engine, self.tmp, self.ids, self.record, self.args = engine, tmp, {}, record, args
        self.t0 = time.time()
        self.port = {"coordinator": free_port(), "prometheus": free_port()}
        self.env = dict(
            engine.env, COMPOSE_DOCKER_CLI_BUILD="1",  # BuildKit: compose runs `docker build`,
            PATH="/usr/bin:" + os.environ.get("PATH", ""),  # docker.io's (Engine.docker's)
            ADJSH_STACK_ROOT=ROOT, ADJSH_STACK_CONTEXT=os.path.join(tmp, "context"),
            ADJSH_STACK_BASE=BASE, ADJSH_TLS_DIR=os.path.join(tmp, "tls"),
            ADJSH_DATA_DIR=os.path.join(tmp, "data"),
            ADJSH_COORDINATOR_PORT=str(self.port["coordinator"]),
            ADJSH_PROMETHEUS_PORT=str(self.port["prometheus"]))

    def compose(self, *args, timeout=300):
        files = [a for f in FILES for a in ("-f", f)]
        return timed(["docker-compose", "-p", PROJECT, *files, *args], self.env, timeout)

    def cid(self, service):
        """The service's container (the same one across restarts)."""
        if not self.ids.get(service):
            self.ids[service] = self.compose("ps", "-q", service, timeout=60).stdout.strip()
        return self.ids[service]

    def inspect(self, service, fmt):
        cid = self.cid(service)
        r = self.engine.docker("inspect", "-f", fmt, cid, timeout=60) if cid else None
        return r.stdout.strip() if r and r.returncode == 0 else ""

    def state(self, service):
        return json.loads(self.inspect(service, "{{json .State}}") or "{}")

    def logs(self, service):
        r = self.compose("logs", "--no-color", service, timeout=60)
        return r.stdout

    def stop(self):
        """Removes what the test made (harness.guarded calls it): the stack's containers,
        network and volumes, the images unless kept; stops dockerd; removes the temporary folder
        unless kept. Returns what is left."""
        r = self.compose("down", "-v", "--remove-orphans", timeout=180)
        left = self.engine.docker("ps", "-aq").stdout.split() + \
            self.engine.docker("volume", "ls", "-q").stdout.split()
        self.record("docker-compose down -v: containers, network and volumes removed",
                    r.returncode == 0 and not left, (r.stderr[-2000:], left))
        if not self.args.keep_images:
            self.engine.docker("image", "rm", "-f", *IMAGES.values(), BASE)
            images = self.engine.docker("image", "ls", "-q").stdout.split()
            self.record("images removed (--keep-images keeps them)", not images, images)
        code = self.engine.stop()
        self.record(f"dockerd stopped (the whole test: {time.time() - self.t0:.0f} s)",
                    code is not None)
        if self.args.keep:
            print("kept", self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return left + ([] if code is not None else ["dockerd"])


def build_and_up(adjsh, tmp, engine, stack, record):
    r = make_base(engine, tmp)
    if not record(f"base image {BASE}: debootstrap --variant=minbase bookworm, imported "
                  f"({r.seconds:.0f} s)", r.returncode == 0, r.stderr[-2000:]):
        return False
    os.makedirs(os.path.join(tmp, "context", "prebuilt"))
    os.makedirs(os.path.join(tmp, "data"))
    shutil.copy2(adjsh, os.path.join(tmp, "context", "prebuilt", "adjsh"))
    make_tls(os.path.join(tmp, "tls"))
    for service, tag in IMAGES.items():
        r = stack.compose("build", service, timeout=900)
        size = engine.docker("image", "inspect", "-f", "{{.Size}}", tag).stdout.strip()
        if not record(f"{tag} built by docker-compose build {service} ({r.seconds:.0f} s, "
                      f"{int(size or 0) / 2**20:.0f} MiB)", r.returncode == 0 and size,
                      r.stdout[-2000:] + r.stderr[-2000:]):
            return False
    # --no-deps: neither Alertmanager nor Grafana (no image here); the coordinator is listed, so
    # compose still waits for it to be healthy before it starts the workers.
    r = stack.compose("up", "-d", "--no-deps", "--no-build", *ADJSH, "prometheus")
    if not record(f"stack up: {', '.join(ADJSH)}, prometheus ({r.seconds:.0f} s; the workers "
                  f"started once the coordinator was healthy)", r.returncode == 0, r.stderr):
        return False
    healthy = wait_for(lambda: all(stack.state(s).get("Health", {}).get("Status") == "healthy"
                                   for s in ADJSH), 120, interval=2)
    for s in ADJSH:
        test = json.loads(stack.inspect(s, "{{json .Config.Healthcheck.Test}}") or "[]")
        health = stack.state(s).get("Health", {})
        last = (health.get("Log") or [{}])[-1].get("Output", "").strip()
        record(f"{s}: compose health check `{' '.join(test[1:])}` -> {health.get('Status')} "
               f"({last})", healthy and test[1:3] == ["adjsh", "health"], health)
    return healthy


def kill_worker(stack, log, record):
    """SIGKILL to cpu-worker-0's adjsh from the host; the restart policy brings it back."""
    before, since = stack.state("cpu-worker-0"), int(time.time())
    restarts = int(stack.inspect("cpu-worker-0", "{{.RestartCount}}") or 0)
    os.kill(before["Pid"], signal.SIGKILL)
    log(f"kill -9 {before['Pid']}: cpu-worker-0's adjsh (worker-0, PID 1 of its container)")
    back = wait_for(lambda: (lambda s: s if s.get("Running") and not s.get("Restarting") and
                             s.get("Pid") not in (0, before["Pid"]) else None)(
        stack.state("cpu-worker-0")), 60, interval=0.5)
    count = int(stack.inspect("cpu-worker-0", "{{.RestartCount}}") or 0)
    # The engine's events: the old process's exit status (State has the new one's).
    events = stack.engine.docker(
        "events", "--since", str(since), "--until", str(int(time.time()) + 1), "--filter",
        f"container={stack.cid('cpu-worker-0')}", "--format",
        "{{.Action}} {{index .Actor.Attributes \"exitCode\"}}", timeout=30).stdout.split("\n")
    events = [e.strip() for e in events if e.split(" ")[0] in ("die", "start")]
    log(f"cpu-worker-0 restarted by its restart policy: events {events}, PID "
        f"{back and back['Pid']}, RestartCount {restarts} -> {count}")
    record("the killed worker is restarted by the restart policy (unless-stopped)",
           back and count == restarts + 1 and events == ["die 137", "start"], (back, events))
    healthy = wait_for(lambda: stack.state("cpu-worker-0").get("Health", {})
                       .get("Status") == "healthy", 60, interval=1)
    registered = [ln for ln in stack.logs("cpu-worker-0").splitlines() if "registered with" in ln]
    for line in registered:
        log(line.strip())
    log(f"cpu-worker-0 registered again, health {'healthy' if healthy else 'not healthy'}")
    record("the restarted worker registers again and is healthy",
           healthy and len(registered) == 2, stack.logs("cpu-worker-0")[-2000:])


def train_job(adjsh, tmp, stack, record):
    tls = stack.env["ADJSH_TLS_DIR"]
    client = ["--coordinator", f"127.0.0.1:{stack.port['coordinator']}", "--tls-ca",
              os.path.join(tls, "ca.pem")]
    r = run_adjsh(adjsh, ["status", *client], timeout=30)
    record("the job API without the token: UNAUTHENTICATED", r.returncode == 1 and
           "UNAUTHENTICATED" in r.stderr, (r.returncode, r.stderr))
    client += ["--auth-token-file", os.path.join(tls, "token")]
    r = run_adjsh(adjsh, ["status", *client, "--json"], timeout=30)
    connected = json.loads(r.stdout or "{}").get("workers_connected") if r.returncode == 0 else r
    record(f"the coordinator counts 2 workers (over mutual TLS): {connected}", connected == "2")
    r = run_adjsh(adjsh, ["submit", *client, *JOB], timeout=60)
    job = r.stdout.strip()
    if not record(f"{job or 'a job'} submitted from the host over TLS with the token",
                  r.returncode == 0 and job.startswith("job-"), r.stderr):
        return None
    t0 = time.time()

    def log(line):
        print(f"  [{time.time() - t0:5.1f} s] {line}", flush=True)

    def status():
        r = run_adjsh(adjsh, ["status", *client, "--job", job, "--json"], timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    # The job's log: adjsh watch's lines as they come, the kill's lines among them.
    watch = subprocess.Popen([adjsh, "watch", *client, "--job", job], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    reader = threading.Thread(target=lambda: [log("watch: " + ln.rstrip()) for ln in watch.stdout])
    reader.start()
    js = wait_for(lambda: (lambda j: j if int(j.get("step", 0)) >= 2 or watch.poll() is not None
                           else None)(status()), 300, interval=0.5) or {}
    steps = int(JOB[JOB.index("--steps") + 1])
    if record("the job runs (step 2)", js.get("state") == "RUNNING", js):
        log(f"at step {js['step']} of {steps}, {js.get('state')}")
        kill_worker(stack, log, record)
        at = status()
        record(f"the worker was back before the job ended (step {at.get('step')} of {steps})",
               at.get("state") == "RUNNING", at)
    try:
        watch.wait(timeout=600)
    except subprocess.TimeoutExpired:
        watch.kill()
        watch.wait()
    reader.join()
    js = status()
    record(f"the job trained to SUCCEEDED through the stack ({time.time() - t0:.0f} s, step "
           f"{js.get('step')}, loss {js.get('loss')})", watch.returncode == 0 and
           js.get("state") == "SUCCEEDED", (js, stack.logs("coordinator")[-3000:]))
    return js.get("last_checkpoint")


def check_weights(adjsh, tmp, stack, checkpoint, record):
    """The job's checkpoint folder, copied out of the state volume, against adjsh train's."""
    got = os.path.join(tmp, "job-checkpoints")
    r = stack.engine.docker("cp", f"{stack.cid('coordinator')}:{os.path.dirname(checkpoint)}", got)
    record(f"the job's checkpoints copied out of the state volume ({checkpoint})",
           r.returncode == 0, r.stderr)
    t0 = time.time()
    r, ref = train_reference(adjsh, os.path.join(tmp, "reference"), JOB)
    job = final_files(got)
    record(f"final model and optimizer state bitwise those of adjsh train in-process "
           f"({time.time() - t0:.0f} s)", ref is not None and job == ref,
           r.stderr[-2000:] if ref is None else "missing" if job is None else "differ")


def check_prometheus(stack, record):
    """Prometheus in the stack: both workers up, their memory and throughput series. Its
    scrapes are 15 s apart and its DNS lookups of the workers 30 s apart (prometheus.yml)."""
    prom = f"127.0.0.1:{stack.port['prometheus']}"
    want = {"worker-0:9101", "worker-1:9101"}

    def by_instance(expr):
        try:
            return {s["metric"].get("instance"): float(s["value"][1]) for s in query(prom, expr)}
        except (OSError, ValueError, RuntimeError):
            return {}

    up = wait_for(lambda: (lambda u: u if set(u) == want and all(u.values()) else None)(
        by_instance('up{job="adjsh-worker"}')), 120, interval=3)
    record(f"Prometheus: both workers up ({up or by_instance('up')})", up)
    for what, expr in (("memory", "adjsh_worker_resident_memory_bytes"),
                       ("throughput", "rate(adjsh_worker_tokens_processed_total[5m])")):
        got = wait_for(lambda: (lambda v: v if set(v) == want and any(v.values()) else None)(
            by_instance(expr)), 60, interval=3) or by_instance(expr)
        record(f"Prometheus serves both workers' {what}: {expr} = "
               f"{ {k: round(v, 1) for k, v in sorted(got.items())} }",
               set(got) == want and any(got.values()))


def body(adjsh, tmp, stack, record):
    engine = stack.engine
    ok = wait_for(engine.ready, 60, interval=0.5)
    record("dockerd started (vfs, no iptables, no default bridge)", ok,
           open(os.path.join(tmp, "dockerd.log")).read()[-2000:])
    if ok and build_and_up(adjsh, tmp, engine, stack, record):
        checkpoint = train_job(adjsh, tmp, stack, record)
        if checkpoint:
            check_weights(adjsh, tmp, stack, checkpoint, record)
        check_prometheus(stack, record)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adjsh", required=True, help="the suite's binary: the images run it")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary folder (certificates, the engine's log and data root)")
    ap.add_argument("--keep-images", action="store_true",
                    help="leave the images in the engine's data root (kept with --keep)")
    a = ap.parse_args()
    why = missing_tools() or (shutil.which("docker-compose") is None and
                              "docker-compose is not installed (scripts/install-deps.sh)")
    ci = os.environ.get("CI") == "true"
    if why:
        print(f"{'FAIL' if ci else 'SKIP'} container stack{' under CI=true' if ci else ''}: {why}")
        return 1 if ci else 77
    tmp = tempfile.mkdtemp(prefix="adjsh-stack-")
    res = Results()
    stack = Stack(Engine(tmp), tmp, res.record, a)
    # A bug of the test's own is a failed check; the stack and dockerd go whatever happened.
    guarded(stack, res, lambda: body(os.path.abspath(a.adjsh), tmp, stack, res.record))
    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
