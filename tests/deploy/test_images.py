#!/usr/bin/python3
"""The container images built and run by a real engine, with no registry (issue 50's first part).

  test_images.py --adjsh build/cli/adjsh [--keep-images] [--full-build]

  * dockerd (Debian's docker.io) started by the test on a socket and data root of its own: vfs
    storage, no iptables, no bridge (containers use the host's network or none); stopped at the
    end, its data removed.
  * The base image made from Debian's packages: `debootstrap --variant=minbase bookworm` from the
    mirror apt uses, imported as local/debian:12 (BASE and RUNTIME_BASE of the Dockerfiles).
  * The coordinator image and a CPU worker image (WORKER_RUNTIME=cpu-runtime: nothing fetched
    from NVIDIA) built by BuildKit from docker/Dockerfile.*, with ADJSH_BINARY=prebuilt: the
    context holds this build's binary, so adjsh is compiled once (by the suite's build). With
    a binary that has the CUDA backend, also the CUDA worker image with cuBLAS from NVIDIA's
    wheels on PyPI (WORKER_RUNTIME=cuda-runtime-pypi, the cuBLAS version of the toolkit that
    built it), its libraries where the worker loads them.
  * Each image runs as its non-root user with a read-only root filesystem (as deploy/k8s runs
    them): `--version`; then a coordinator container and a worker container on the host's
    network train a small job submitted from the host to SUCCEEDED, the coordinator's health
    port SERVING.
Prints the images' sizes and build times. Needs root, dockerd, debootstrap and the docker client:
where one is missing it exits 77 (skipped), except under CI=true, where that fails.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import Results, run_adjsh, wait_for  # noqa: E402

DOCKER = "/usr/bin/docker"  # docker.io's client: BuildKit with the daemon's own builder
BASE = "local/debian:12"
CA_BUNDLE = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def apt_mirror():
    """The Debian mirror apt uses here (deb822 or one-line sources), else deb.debian.org."""
    for path in ["/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"]:
        try:
            text = open(path).read()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or \
            re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian)\s+bookworm\b", text, re.M)
        if m:
            return m.group(1)
    return "http://deb.debian.org/debian"


class Engine:
    """dockerd on a socket and data root of its own, and its client."""

    def __init__(self, tmp):
        self.dir = tmp
        self.sock = os.path.join(tmp, "docker.sock")
        self.env = dict(os.environ, DOCKER_HOST="unix://" + self.sock, DOCKER_BUILDKIT="1")
        self.log = open(os.path.join(tmp, "dockerd.log"), "w")
        self.proc = subprocess.Popen(
            ["dockerd", "--storage-driver=vfs", "--iptables=false", "--ip6tables=false",
             "--bridge=none", "--data-root", os.path.join(tmp, "root"),
             "--exec-root", os.path.join(tmp, "exec"), "--pidfile", os.path.join(tmp, "pid"),
             "-H", "unix://" + self.sock], stdout=self.log, stderr=subprocess.STDOUT)

    def docker(self, *args, timeout=300, stdin=None):
        t0 = time.time()
        try:
            r = subprocess.run([DOCKER, *args], capture_output=True, text=stdin is None,
                               env=self.env, timeout=timeout, stdin=stdin)
        except subprocess.TimeoutExpired:
            r = subprocess.CompletedProcess(args, 124, "", f"timed out after {timeout} s")
        r.seconds = time.time() - t0
        return r

    def ready(self):
        return self.proc.poll() is None and self.docker("info", timeout=10).returncode == 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def cublas_version(adjsh):
    """(major, minor) of the cuBLAS the binary's CUDA backend was built against (the toolkit at
    $CUDA_HOME or /usr/local/cuda), or None for a binary without the CUDA backend."""
    r = subprocess.run([adjsh, "--version"], capture_output=True, text=True, timeout=30)
    if "CUDA backend built" not in r.stdout:
        return None
    header = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include",
                          "cublas_api.h")
    try:
        text = open(header).read()
    except OSError:
        return None
    v = [re.search(rf"#define CUBLAS_VER_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR")]
    return (int(v[0].group(1)), int(v[1].group(1))) if all(v) else None


def missing_tools():
    if os.geteuid() != 0:
        return "not root (dockerd and debootstrap need it)"
    for tool in ["dockerd", "debootstrap", DOCKER]:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-deps.sh installs docker.io, debootstrap)"
    return None


def body(adjsh, tmp, engine, record, keep_images, full_build):
    ok = wait_for(engine.ready, 60, interval=0.5)
    record("dockerd started (vfs, no iptables, no bridge)", ok,
           open(os.path.join(tmp, "dockerd.log")).read()[-2000:])
    if not ok:
        return
    rootfs = os.path.join(tmp, "rootfs")
    t0 = time.time()
    r = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", rootfs, apt_mirror()],
                       capture_output=True, text=True, timeout=600)
    record(f"debootstrap --variant=minbase bookworm ({time.time() - t0:.0f} s)", r.returncode == 0,
           r.stderr[-2000:])
    if r.returncode != 0:
        return
    tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
    r = engine.docker("import", "-", BASE, stdin=tar.stdout)
    tar.wait()
    record(f"base image {BASE} imported ({r.seconds:.0f} s)", r.returncode == 0, r.stderr)
    shutil.rmtree(rootfs, ignore_errors=True)
    if r.returncode != 0:
        return

    # A build context of its own: the Dockerfiles' prebuilt/adjsh is this build's binary.
    ctx = os.path.join(tmp, "context")
    os.makedirs(os.path.join(ctx, "prebuilt"))
    shutil.copy2(adjsh, os.path.join(ctx, "prebuilt", "adjsh"))
    images = {"coordinator": ("adjsh-coordinator:test", "Dockerfile.coordinator", []),
              "worker (CPU)": ("adjsh-worker-cpu:test", "Dockerfile.worker",
                               ["--build-arg", "WORKER_RUNTIME=cpu-runtime"])}
    cuda = cublas_version(adjsh)
    if cuda:  # the CUDA worker, cuBLAS from NVIDIA's wheels on PyPI (no NVIDIA apt repository)
        images["worker (CUDA, cuBLAS from PyPI)"] = (
            "adjsh-worker-cuda:test", "Dockerfile.worker",
            ["--build-arg", "WORKER_RUNTIME=cuda-runtime-pypi", "--build-arg",
             f"CUDA_MAJOR={cuda[0]}", "--build-arg", f"CUDA_MINOR={cuda[1]}",
             # this host's CA bundle: PyPI may be reached through a proxy that re-signs TLS
             "--secret", f"id=ca_bundle,src={CA_BUNDLE}"])
    else:
        print("note: the binary has no CUDA backend: no CUDA worker image", flush=True)
    if full_build:  # the multi-stage build as users run it: adjsh compiled in the builder
        images["coordinator (compiled in its builder)"] = (
            "adjsh-coordinator-full:test", "Dockerfile.coordinator",
            ["--build-arg", "ADJSH_BINARY=build"])
    for what, (tag, dockerfile, extra) in images.items():
        r = engine.docker("build", "--network", "host", "-f",
                          os.path.join(ROOT, "docker", dockerfile), "--build-arg", f"BASE={BASE}",
                          "--build-arg", f"RUNTIME_BASE={BASE}", "--build-arg",
                          "ADJSH_BINARY=prebuilt", *extra, "-t", tag,
                          ROOT if "ADJSH_BINARY=build" in extra else ctx, timeout=2400)
        size = engine.docker("image", "inspect", "-f", "{{.Size}}", tag).stdout.strip()
        record(f"{what} image built ({r.seconds:.0f} s, "
               f"{int(size) / 2**20 if size.isdigit() else 0:.0f} MiB)",
               r.returncode == 0, (r.stdout or "")[-2000:] + (r.stderr or "")[-2000:])
        if r.returncode != 0:
            return
        user = engine.docker("image", "inspect", "-f", "{{.Config.User}}", tag).stdout.strip()
        record(f"{what} image runs as a non-root user ({user})", user not in ("", "0", "root"))
        if tag == "adjsh-worker-cuda:test":  # what the worker dlopens on first GPU use
            r = engine.docker("run", "--rm", "--network", "none", "--read-only", "--entrypoint",
                              "/bin/ls", tag, "/usr/local/cuda/lib64", timeout=60)
            want = [f"libcublas.so.{cuda[0]}", f"libcublasLt.so.{cuda[0]}"]
            record(f"{what}: {' and '.join(want)} in LD_LIBRARY_PATH",
                   r.returncode == 0 and all(w in r.stdout.split() for w in want),
                   (r.stdout, r.stderr))
        for as_user in ([], ["--user", "65534"]):
            r = engine.docker("run", "--rm", "--network", "none", "--read-only", *as_user, tag,
                              "--version", timeout=60)
            record(f"{what}: adjsh --version, read-only root{' as 65534' if as_user else ''}",
                   r.returncode == 0 and r.stdout.startswith("adjsh "), (r.stdout, r.stderr))

    # A coordinator and a worker in containers on the host's network; the job from the host.
    port, health = free_port(), free_port()
    addr = f"127.0.0.1:{port}"
    state = "/var/lib/adjsh:rw,uid=10001,gid=10001"
    r = engine.docker("run", "-d", "--name", "adjsh-test-coordinator", "--network", "host",
                      "--read-only", "--tmpfs", state, images["coordinator"][0], "coordinator",
                      "--insecure-local", "--listen", addr, "--state-dir", "/var/lib/adjsh/jobs",
                      "--health-listen", f"127.0.0.1:{health}")
    record("coordinator container started", r.returncode == 0, r.stderr)
    serving = wait_for(lambda: run_adjsh(adjsh, ["health", "--address", f"127.0.0.1:{health}"],
                                         timeout=10).returncode == 0, 60, interval=0.5)
    record("coordinator container: health SERVING from the host", serving,
           engine.docker("logs", "adjsh-test-coordinator").stderr[-2000:])
    r = engine.docker("run", "-d", "--name", "adjsh-test-worker", "--network", "host",
                      "--read-only", "--tmpfs", "/tmp", images["worker (CPU)"][0], "worker",
                      "--coordinator", addr, "--name", "container-0")
    record("worker container started", r.returncode == 0, r.stderr)
    r = run_adjsh(adjsh, ["submit", "--coordinator", addr, "--hidden-size", "16", "--layers", "2",
                          "--state-size", "4", "--context", "512", "--chunk", "64", "--steps",
                          "2"], timeout=30)
    job = r.stdout.strip()
    record("job submitted from the host", r.returncode == 0 and job.startswith("job-"), r.stderr)
    if job:
        w = run_adjsh(adjsh, ["watch", "--coordinator", addr, "--job", job], timeout=300)
        record("the job trains in the containers to SUCCEEDED", w.returncode == 0,
               (w.stdout[-1500:], w.stderr[-1500:],
                engine.docker("logs", "adjsh-test-worker").stderr[-2000:]))
    for name in ["adjsh-test-worker", "adjsh-test-coordinator"]:
        r = engine.docker("rm", "-f", name, timeout=60)
        record(f"container {name} removed", r.returncode == 0, r.stderr)
    if not keep_images:
        r = engine.docker("image", "rm", "-f", *[t for t, _, _ in images.values()], BASE)
        record("images removed (--keep-images keeps them)", r.returncode == 0, r.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--keep-images", action="store_true",
                    help="leave the images in the engine's data root (kept with --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--full-build", action="store_true",
                    help="also build the coordinator image from the repository, compiling adjsh "
                    "in its builder stage (minutes; the suite's images take its binary)")
    a = ap.parse_args()
    why = missing_tools()
    if why:
        if os.environ.get("CI") == "true":
            print(f"FAIL the images cannot be built here under CI=true: {why}")
            return 1
        print(f"SKIP container images: {why}")
        return 77
    tmp = tempfile.mkdtemp(prefix="adjsh-images-")
    res, engine = Results(), Engine(tmp)
    try:
        body(os.path.abspath(a.adjsh), tmp, engine, res.record, a.keep_images, a.full_build)
    except Exception as e:  # a bug of the test's own: a failed check, then the cleanup
        res.record("test harness", False, repr(e))
    finally:
        code = engine.stop()
        res.record("dockerd stopped", code is not None)
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
