#!/usr/bin/env python3
"""Adversarial and unlucky-user cases against real `adjsh` processes on 127.0.0.1.

  test_adversarial.py --adjsh build/cli/adjsh [--keep]

Each case was a defect (it lost data, crashed or hung the coordinator); each check below failed
on the build before its fix.
  * Resume never loses checkpoints: a checkpoint directory whose `latest` names a missing
    folder, is empty, or names a folder without its model, optimizer or trainer state, or that
    has step folders but no `latest`: `adjsh train` stops with exit 1 naming the problem, writes
    nothing and deletes nothing; with --resume-newest-complete it resumes from the newest
    complete step folder and says so. The same directory given to a job: the job FAILS with
    the reason, and every step folder is still there.
  * No spec can kill or hang the coordinator: a 4 TiB model (hidden 16384, 1024 layers, each
    tensor under --max-tensor-bytes) is refused at submit naming --max-model-bytes; text files
    that are /dev/zero, a FIFO, or over --max-data-bytes are refused at submit; a text file
    replaced by a FIFO after the submit fails its job when it runs (no read blocks), the next
    job runs, and SIGTERM still stops the coordinator; the coordinator serves throughout.
    `adjsh init` and `adjsh train` with a model bigger than the machine: a message, exit 1.
    A coordinator under an address-space limit that a job's model (within every limit) does
    not fit: that job FAILS with "ran out of memory", the coordinator lives, the next job runs.
  * Paths are confined: with --data-root DATA, a spec naming /etc/shadow (or a file that does
    not exist outside DATA: the same answer), a link out of DATA, or a checkpoint dir outside
    DATA and the state dir is PERMISSION_DENIED at submit; a job inside DATA runs and its
    checkpoint files are 0600, its folders 0700.
  * Nothing is left behind by a killed run: a local cluster's private socket directory of an
    `adjsh train --workers` that was SIGKILLed is removed by the next local cluster, and a
    `latest.tmp.<pid>.<n>` of a process that is gone by the next checkpoint (a live process's
    is kept).
Bounded in time (every call has a timeout) and memory (tiny models).
"""
import glob
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import run_process_test  # noqa: E402

TRAIN = ["--hidden-size", "8", "--layers", "2", "--state-size", "4", "--context", "256",
         "--chunk", "64", "--warmup", "1"]


def tree(d):
    """Every path under d with its size: what a run must leave alone."""
    out = {}
    for root, dirs, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = os.path.getsize(p)
        for x in dirs:
            out[os.path.relpath(os.path.join(root, x), d) + "/"] = 0
    return out


def resume_cases(adjsh, tmp, cluster, record):
    run = cluster.run
    good = os.path.join(tmp, "good")
    r = run("train", *TRAIN, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", good,
            timeout=120)
    if not record("a run with checkpoints at steps 2 and 4", r.returncode == 0 and
                  os.path.isdir(os.path.join(good, "step-00000004")), r.stderr):
        return

    def damage_latest(text):
        return lambda d: open(os.path.join(d, "latest"), "w").write(text)

    def remove(rel):
        return lambda d: os.remove(os.path.join(d, rel))

    cases = [
        ("latest names a missing folder", damage_latest("step-00000077"), "does not load", 4),
        ("latest is empty", damage_latest(""), "is empty", 4),
        ("latest names a folder outside", damage_latest("../../etc"), "not a step folder", 4),
        ("no latest", remove("latest"), "no `latest`", 4),
        ("step folder without model", remove("step-00000004/model.safetensors"),
         "has no model.safetensors", 2),
        ("step folder without optimizer", remove("step-00000004/optimizer.safetensors"),
         "has no optimizer.safetensors", 2),
        ("step folder without trainer state", remove("step-00000004/trainer_state.json"),
         "has no trainer_state.json", 2),
    ]
    for name, damage, message, fallback_step in cases:
        d = os.path.join(tmp, "ck-" + name.replace(" ", "-"))
        shutil.copytree(good, d)
        damage(d)
        before = tree(d)
        r = run("train", *TRAIN, "--steps", "6", "--checkpoint-dir", d, timeout=120)
        record(f"resume, {name}: exit 1 naming the problem, nothing written or deleted",
               r.returncode == 1 and message in r.stderr and "step 1/" not in r.stderr and
               tree(d) == before, f"exit {r.returncode}: {r.stderr[-600:]}")
        r = run("train", *TRAIN, "--steps", "6", "--checkpoint-dir", d, "--resume-newest-complete",
                timeout=120)
        said = f"resuming from step-{fallback_step:08d} instead" in r.stderr
        record(f"resume, {name}: --resume-newest-complete resumes at step {fallback_step}, "
               "says so, keeps the older folders",
               r.returncode == 0 and said and f"resumed at step {fallback_step}" in r.stderr and
               os.path.isdir(os.path.join(d, "step-00000002")) and
               os.path.isdir(os.path.join(d, "step-00000006")),
               f"exit {r.returncode}: {r.stderr[-600:]}")

    # The same through the job API: the job FAILS with the reason, nothing is deleted.
    state = os.path.join(tmp, "state")
    _, address = cluster.coordinator(state)
    if not record("coordinator started", address is not None):
        return
    cluster.worker(address, "w0")
    d = os.path.join(tmp, "ck-job")
    shutil.copytree(good, d)
    open(os.path.join(d, "latest"), "w").write("step-00000077")
    before = tree(d)
    spec = {"init": {"hidden_size": 8, "layers": 2, "state_size": 4, "vocab_size": 256},
            "context_length": 256, "chunk": 64, "steps": 6, "checkpoint_dir": d}
    job, r = cluster.submit(address, spec)
    if record("job with a broken latest submitted", job is not None, r.stderr):
        w = cluster.watch(address, job, timeout=120)
        st = cluster.status(address, job) or {}
        record("job with a broken latest FAILED naming the problem, nothing deleted",
               w.returncode == 1 and st.get("state") == "FAILED" and
               "does not load" in (w.stdout + w.stderr + str(st)) and tree(d) == before,
               f"{st} {w.stderr[-400:]}")


def spec_cases(adjsh, tmp, cluster, record):
    run = cluster.run
    huge = ["--hidden-size", "16384", "--layers", "1024", "--state-size", "16", "--vocab-size",
            "256"]
    for cmd in (["init", "--out", os.path.join(tmp, "huge")], ["train", "--steps", "1",
                                                                "--checkpoint-dir",
                                                                os.path.join(tmp, "huge-ck")]):
        r = run(*cmd, *huge, timeout=60)
        record(f"adjsh {cmd[0]} of a 4 TiB model: exit 1 with a message (no abort)",
               r.returncode == 1 and "needs" in r.stderr and "memory" in r.stderr and
               not os.path.exists(os.path.join(tmp, "huge")), f"exit {r.returncode}: {r.stderr}")

    state = os.path.join(tmp, "state-specs")
    coord, address = cluster.coordinator(state, flags=("--insecure-local", "--max-data-bytes",
                                                       "4000000"))
    if not record("coordinator with --max-data-bytes 4000000 started", address is not None):
        return
    cluster.worker(address, "w1")
    tiny = {"hidden_size": 8, "layers": 2, "state_size": 4, "vocab_size": 256}
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    # /dev/zero itself is outside the data root (refused for that); a node of the same device
    # inside it reaches the regular-file check (root only; otherwise the path answer counts).
    zero, zero_message = "/dev/zero", "outside the coordinator's data roots"
    try:
        os.mknod(os.path.join(tmp, "zero"), 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        zero, zero_message = os.path.join(tmp, "zero"), "not a regular file"
    except OSError:
        pass
    big = os.path.join(tmp, "big.txt")
    with open(big, "wb") as f:
        f.write(b"x" * 4000001)
    refused = [
        ("a 4 TiB model", {"init": {"hidden_size": 16384, "layers": 1024, "state_size": 16,
                                    "vocab_size": 256}}, "--max-model-bytes"),
        ("/dev/zero as text", {"init": tiny, "text_files": {"paths": [zero]}}, zero_message),
        ("a FIFO as text", {"init": tiny, "text_files": {"paths": [fifo]}}, "not a regular file"),
        ("a FIFO as tokens", {"init": tiny, "token_file": fifo + ".u32"}, "does not exist"),
        ("text over --max-data-bytes", {"init": tiny, "text_files": {"paths": [big]}},
         "--max-data-bytes"),
    ]
    for name, spec, message in refused:
        spec = {"context_length": 256, "chunk": 64, "steps": 2, **spec}
        job, r = cluster.submit(address, spec)
        record(f"submit of {name} refused naming the problem", job is None and
               r.returncode == 1 and message in r.stderr, f"{job} {r.stderr[-300:]}")
    r = run("status", "--coordinator", address, timeout=30)
    record("the coordinator serves after the refused specs", r.returncode == 0 and
           coord.poll() is None, r.stderr)

    # A regular file at submit that is a FIFO when the job runs: the job fails, nothing blocks.
    swapped = os.path.join(tmp, "swapped.txt")
    with open(swapped, "wb") as f:
        f.write(b"the quick brown fox " * 100)
    first, _ = cluster.submit(address, {"init": tiny, "context_length": 8192, "chunk": 256,
                                        "steps": 40})
    job, r = cluster.submit(address, {"init": tiny, "context_length": 256, "chunk": 64,
                                      "steps": 2, "text_files": {"paths": [swapped]}})
    after, _ = cluster.submit(address, {"init": tiny, "context_length": 256, "chunk": 64,
                                        "steps": 2})
    os.remove(swapped)
    os.mkfifo(swapped)
    if record("jobs submitted around a file later swapped for a FIFO",
              first and job and after, r.stderr):
        w = cluster.watch(address, job, timeout=60)
        st = cluster.status(address, job) or {}
        record("the job whose text file became a FIFO FAILED naming it (no hang)",
               w.returncode == 1 and st.get("state") == "FAILED" and
               "not a regular file" in str(st), f"{st} {w.stderr[-300:]}")
        w = cluster.watch(address, after, timeout=60)
        record("the job after it SUCCEEDED", w.returncode == 0, w.stderr[-300:])
    coord.terminate()
    try:
        code = coord.wait(timeout=20)
    except Exception:
        code = None
    record("SIGTERM stops the coordinator (exit 0) after all of it", code == 0, f"exit {code}")


def path_cases(adjsh, tmp, cluster, record):
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    with open(os.path.join(data, "corpus.txt"), "w") as f:
        f.write("a small corpus of text for one job. " * 40)
    os.symlink("/etc/passwd", os.path.join(data, "passwd-link.txt"))
    state = os.path.join(tmp, "state-paths")
    _, address = cluster.coordinator(state, data_root=data, log="coordinator-paths")
    if not record("coordinator with --data-root started", address is not None):
        return
    cluster.worker(address, "w-paths")
    tiny = {"hidden_size": 8, "layers": 2, "state_size": 4, "vocab_size": 256}
    base = {"init": tiny, "context_length": 256, "chunk": 64, "steps": 2}
    answers = []
    for name, extra in [
            ("/etc/shadow as text", {"text_files": {"paths": ["/etc/shadow"]}}),
            ("a missing file outside the roots", {"text_files": {"paths": ["/etc/adjsh-none"]}}),
            ("a link out of the data root", {"text_files": {"paths": [
                os.path.join(data, "passwd-link.txt")]}}),
            ("a checkpoint dir outside the roots", {"checkpoint_dir": os.path.join(tmp, "x")}),
            ("a checkpoint dir with ..", {"checkpoint_dir": os.path.join(data, "..", "x")})]:
        job, r = cluster.submit(address, {**base, **extra})
        answers.append(r.stderr.replace("/etc/shadow", "P").replace("/etc/adjsh-none", "P"))
        record(f"submit of {name}: PERMISSION_DENIED, exit 1", job is None and
               r.returncode == 1 and "PERMISSION_DENIED" in r.stderr, r.stderr[-300:])
    record("an existing and a missing file outside the roots get the same answer",
           answers[0] == answers[1], answers[:2])
    ck = os.path.join(data, "ckpt")
    job, r = cluster.submit(address, {**base, "text_files": {"paths": [
        os.path.join(data, "corpus.txt")]}, "checkpoint_dir": ck})
    w = cluster.watch(address, job, timeout=120) if job else r
    modes = []
    for root, dirs, files in os.walk(ck):
        modes += [(os.path.join(root, d), os.stat(os.path.join(root, d)).st_mode & 0o777, 0o700)
                  for d in dirs]
        modes += [(os.path.join(root, f), os.stat(os.path.join(root, f)).st_mode & 0o777, 0o600)
                  for f in files]
    record("a job inside the data root SUCCEEDED; its checkpoint files are 0600, folders 0700",
           w.returncode == 0 and modes and all(m == want for _, m, want in modes),
           f"{w.stderr[-300:]} {[(p, oct(m)) for p, m, want in modes if m != want][:5]}")


def out_of_memory_case(adjsh, tmp, cluster, record):
    state = os.path.join(tmp, "state-oom")
    limit = 3 << 30  # address space: an idle coordinator maps about 1.2 GiB (thread stacks)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    p = subprocess.Popen([adjsh, "coordinator", "--listen", "127.0.0.1:0", "--state-dir", state,
                          "--data-root", tmp, "--insecure-local", "--threads", "1"],
                         stdout=subprocess.PIPE, stderr=open(cluster.log_path("coordinator-oom"),
                                                              "wb"), preexec_fn=cap)
    cluster.procs.append(p)
    line = p.stdout.readline().decode().strip()
    address = line.split()[-1] if line.startswith("listening on ") else None
    if not record("coordinator under a 3 GiB address-space limit started", address, line):
        return
    cluster.worker(address, "w-oom")
    # 4096 wide, 4 layers: 1.7 GB of f32 parameters, under every limit of the spec; with its
    # gradient and moments far more than the 3 GiB the process may map.
    big = {"init": {"hidden_size": 4096, "layers": 4, "state_size": 16, "vocab_size": 256},
           "context_length": 256, "chunk": 64, "steps": 1}
    job, r = cluster.submit(address, big)
    w = cluster.watch(address, job, timeout=120) if job else r
    st = cluster.status(address, job) if job else None
    record("a job that does not fit in memory FAILS with the reason, the coordinator lives",
           job and w.returncode == 1 and st and st.get("state") == "FAILED" and
           "out of memory" in st.get("error", "") and p.poll() is None,
           (st, w.stderr[-300:], p.poll()))
    small = {"init": {"hidden_size": 8, "layers": 2, "state_size": 4, "vocab_size": 256},
             "context_length": 256, "chunk": 64, "steps": 2}
    job, r = cluster.submit(address, small)
    w = cluster.watch(address, job, timeout=120) if job else r
    record("the next job SUCCEEDS on the same coordinator", w.returncode == 0, w.stderr[-300:])


def leftover_cases(adjsh, tmp, cluster, record):
    run = cluster.run
    base = os.path.join(tmp, "clu")
    os.makedirs(base)
    env = dict(os.environ, TMPDIR=base)
    ck = os.path.join(tmp, "ck-killed")
    p = subprocess.Popen([adjsh, "train", *TRAIN, "--steps", "100000", "--workers", "2",
                          "--checkpoint-dir", ck], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    cluster.procs.append(p)
    seen = False
    for _ in range(200):
        if glob.glob(os.path.join(base, "adjsh-cluster-*")):
            seen = True
            break
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(0.5)  # its workers notice their parent is gone
    left = glob.glob(os.path.join(base, "adjsh-cluster-*"))
    if not record("a SIGKILLed local cluster leaves its socket directory (nothing can run)",
                  seen and len(left) == 1, f"seen {seen}, left {left}"):
        return
    r = subprocess.run([adjsh, "train", *TRAIN, "--steps", "2", "--workers", "1",
                        "--checkpoint-dir", os.path.join(tmp, "ck-next")], env=env,
                       capture_output=True, text=True, timeout=120)
    record("the next local cluster removes the dead one's directory, and its own at exit",
           r.returncode == 0 and not glob.glob(os.path.join(base, "adjsh-cluster-*")),
           f"{r.stderr[-300:]} {glob.glob(os.path.join(base, '*'))}")

    # latest.tmp files of a process killed while replacing `latest`.
    gone = subprocess.Popen(["true"])
    gone.wait()
    d = os.path.join(tmp, "ck-temps")
    r = run("train", *TRAIN, "--steps", "2", "--checkpoint-dir", d, timeout=120)
    dead = os.path.join(d, f"latest.tmp.{gone.pid}.0")
    live = os.path.join(d, f"latest.tmp.{os.getpid()}.3")
    for f in (dead, live):
        open(f, "w").write("step-00000001")
    r = run("train", *TRAIN, "--steps", "4", "--checkpoint-dir", d, timeout=120)
    record("a checkpoint removes latest.tmp files of processes that are gone, keeps a live one's",
           r.returncode == 0 and not os.path.exists(dead) and os.path.exists(live),
           f"{r.stderr[-300:]} {os.listdir(d)}")


def body(adjsh, tmp, cluster, record):
    resume_cases(adjsh, tmp, cluster, record)
    spec_cases(adjsh, tmp, cluster, record)
    path_cases(adjsh, tmp, cluster, record)
    out_of_memory_case(adjsh, tmp, cluster, record)
    leftover_cases(adjsh, tmp, cluster, record)


if __name__ == "__main__":
    run_process_test("adjsh_adversarial_", body)
