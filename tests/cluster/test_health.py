#!/usr/bin/env python3
"""The health endpoints (proto/health.h, `--health-listen`) and `adjsh health`, on 127.0.0.1:

  * a worker whose coordinator is unreachable answers NOT_SERVING (exit 1), and SERVING once it
    has registered with a live coordinator; a coordinator answers SERVING once it serves;
  * an unknown service is an error (exit 1); a dead address is an error (exit 1, quickly);
  * a bad --health-listen is bad usage (exit 2); a taken port fails (exit 1).

  test_health.py --adjsh build/cli/adjsh
Prints PASS/FAIL per check and `N passed, N failed`; exits 1 on any failure.
"""
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import run_process_test, wait_for  # noqa: E402


def health_address(log_path):
    """The 'health on HOST:PORT' address a process logged, or None."""
    try:
        m = re.search(r"^health on (\S+)$", open(log_path).read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def body(adjsh, tmp, cluster, record):
    def health(addr, *extra):
        return subprocess.run([adjsh, "health", "--address", addr, *extra], capture_output=True,
                              text=True, timeout=30)

    # A worker with nowhere to register: NOT_SERVING.
    cluster.worker("127.0.0.1:1", "lonely", log="--quiet", flags=["--health-listen",
                                                                   "127.0.0.1:0"])
    lonely = wait_for(lambda: health_address(cluster.log_path("worker-lonely")), 10)
    r = health(lonely) if lonely else None
    record("a worker not registered: NOT_SERVING, exit 1",
           r is not None and r.returncode == 1 and r.stdout.strip() == "NOT_SERVING",
           r.stdout + r.stderr if r else "no health address logged")

    # A coordinator and a worker that registers with it: SERVING.
    _, addr = cluster.coordinator(os.path.join(tmp, "state"),
                                  flags=("--insecure-local", "--health-listen", "127.0.0.1:0"))
    coord = wait_for(lambda: health_address(cluster.log_path("coordinator")), 10)
    r = health(coord) if coord else None
    record("the coordinator: SERVING, exit 0",
           r is not None and r.returncode == 0 and r.stdout.strip() == "SERVING",
           (r.stdout + r.stderr) if r else "no health address logged")
    cluster.worker(addr, "w0", log="", flags=["--health-listen", "127.0.0.1:0"])
    w0 = wait_for(lambda: health_address(cluster.log_path("worker-w0")), 10)
    serving = wait_for(lambda: health(w0).returncode == 0, 20, interval=0.2) if w0 else False
    record("a worker registered with it: SERVING", serving,
           open(cluster.log_path("worker-w0")).read()[-800:])
    r = health(coord, "--service", "grpc.other")
    record("an unknown service: exit 1 naming the error",
           r.returncode == 1 and "unknown service" in r.stderr, r.stderr)

    t0 = time.time()
    r = health("127.0.0.1:1", "--timeout", "2")
    record(f"a dead address: exit 1 with the reason in {time.time() - t0:.1f} s",
           r.returncode == 1 and "no answer from 127.0.0.1:1" in r.stderr and
           time.time() - t0 < 10, r.stderr)
    r = subprocess.run([adjsh, "worker", "--coordinator", "127.0.0.1:1", "--health-listen",
                        "nowhere"], capture_output=True, text=True, timeout=30)
    record("--health-listen nowhere: bad usage", r.returncode == 2 and "--health-listen" in r.stderr,
           r.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([adjsh, "worker", "--coordinator", "127.0.0.1:1", "--health-listen",
                            f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
        record("a taken health port: exit 1 with the reason",
               r.returncode == 1 and "cannot serve health checks" in r.stderr, r.stderr)


if __name__ == "__main__":
    run_process_test("adjsh-health-", body)
