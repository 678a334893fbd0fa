#!/usr/bin/env python3
"""What can be checked of the containers and manifests without a container engine or a cluster.

  test_deploy_files.py --adjsh build/cli/adjsh

  * every YAML file under docker/ and deploy/ parses, every dashboard is JSON and uses the
    provisioned datasource;
  * the generated ConfigMaps (deploy/k8s/generated/) hold exactly the files they are made from
    (scripts/gen-k8s-configmaps.py --check, and each data entry against its source);
  * Dockerfiles: every COPY source exists and is not excluded by .dockerignore, base images are
    pinned, the builder uses scripts/install-deps.sh and scripts/build.sh, the runtime stage
    installs every Debian package that provides a shared library of the built adjsh (`ldd`,
    `dpkg -S`), and every flag of ENTRYPOINT + CMD exists in `adjsh <command> --help`;
  * docker/compose.yaml: `docker-compose config` accepts it (Debian's docker-compose validates
    without an engine), build contexts, Dockerfiles and bind-mount sources exist, every adjsh
    command's flags exist, each worker reserves its own GPU, published ports are on 127.0.0.1,
    and the Prometheus config's targets are the services' metrics ports;
  * deploy/k8s: every object is namespaced in adjsh, each Service selects the pods of a
    workload, each ConfigMap a volume names is defined, kustomization lists existing files,
    container args' flags exist, the workers ask for nvidia.com/gpu on p4d/p4de nodes, and the
    prometheus.io/port annotations, container ports, Services and prometheus-k8s.yml agree
    with --metrics-listen.
Prints one line per check; exit 1 when any fails.
"""
import argparse
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def rel(p):
    return os.path.relpath(p, ROOT)


_help_cache = {}


def flags_of(adjsh, command):
    """The --flags `adjsh <command> --help` lists."""
    if command not in _help_cache:
        r = subprocess.run([adjsh, command, "--help"], capture_output=True, text=True, timeout=30)
        _help_cache[command] = set(re.findall(r"(--[a-z][a-z0-9-]*)", r.stdout)) if \
            r.returncode == 0 else set()
    return _help_cache[command]


def check_adjsh_args(adjsh, args, where):
    """args: the argument list after `adjsh` (a subcommand, then flags and values)."""
    if not args:
        check(False, f"{where}: no adjsh command")
        return
    known = flags_of(adjsh, args[0])
    used = [a.split("=", 1)[0] for a in args[1:] if a.startswith("--")]
    unknown = [f for f in used if f not in known]
    check(bool(known) and not unknown,
          f"{where}: `adjsh {args[0]}` knows {', '.join(used) or 'no flags'}"
          + (f" (unknown: {', '.join(unknown)})" if unknown else ""))


def metrics_port(args):
    for i, a in enumerate(args):
        if a == "--metrics-listen":
            return int(args[i + 1].rsplit(":", 1)[1])
    return None


def check_yaml_and_dashboards():
    files = sorted(glob.glob(os.path.join(ROOT, "docker", "*.yaml")) +
                   glob.glob(os.path.join(ROOT, "deploy", "**", "*.y*ml"), recursive=True))
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(open(f)) if d is not None]
            check(bool(docs), f"{rel(f)} parses as YAML ({len(docs)} documents)")
        except yaml.YAMLError as e:
            check(False, f"{rel(f)}: {e}")
    ds = yaml.safe_load(open(os.path.join(ROOT, "deploy", "grafana", "provisioning",
                                          "datasources", "adjsh.yaml")))
    uid = ds["datasources"][0]["uid"]
    for f in sorted(glob.glob(os.path.join(ROOT, "deploy", "grafana", "dashboards", "*.json"))):
        d = json.load(open(f))
        uids = {p["datasource"]["uid"] for p in d["panels"]} | \
               {t["datasource"]["uid"] for p in d["panels"] for t in p["targets"]}
        check(uids == {uid} and d.get("uid"), f"{rel(f)}: uid {d.get('uid')}, datasource {uids}")


def check_generated():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen-k8s-configmaps.py"),
                        "--check"], capture_output=True, text=True)
    check(r.returncode == 0, f"deploy/k8s/generated is up to date {r.stderr.strip()}")
    for f in sorted(glob.glob(os.path.join(ROOT, "deploy", "k8s", "generated", "*.yaml"))):
        # The header names the sources, in the order of the data keys.
        header = open(f).readline()
        srcs = header.split(" from ", 1)[1].rsplit("; do not edit", 1)[0].split(", ")
        cm = yaml.safe_load(open(f))
        check(len(srcs) == len(cm["data"]), f"{rel(f)}: one data entry per source")
        for (key, value), src in zip(cm["data"].items(), srcs):
            check(open(os.path.join(ROOT, src)).read() == value, f"{rel(f)}: {key} equals {src}")


def dockerfile_instructions(path):
    """[(INSTRUCTION, argument text)] with continuations joined and comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def ldd_packages(adjsh):
    libs = re.findall(r"=> (/\S+)", subprocess.run(["ldd", adjsh], capture_output=True,
                                                      text=True).stdout)
    r = subprocess.run(["dpkg", "-S", *{os.path.realpath(lib) for lib in libs}],
                       capture_output=True, text=True)
    pkgs = {line.split(":")[0] for line in r.stdout.splitlines() if ":" in line}
    return pkgs - {"libc6", "libgcc-s1"}  # in every Debian base image


def check_dockerfiles(adjsh):
    ignored = [l.strip() for l in open(os.path.join(ROOT, ".dockerignore"))
               if l.strip() and not l.startswith("#")]
    needed = ldd_packages(adjsh)
    check(len(needed) >= 5, f"adjsh links libraries of {len(needed)} Debian packages: "
                            f"{' '.join(sorted(needed))}")
    for path in sorted(glob.glob(os.path.join(ROOT, "docker", "Dockerfile.*"))):
        name = rel(path)
        ins = dockerfile_instructions(path)
        stages, last_install, entry, cmd = set(), "", [], []
        text = open(path).read()
        check("scripts/install-deps.sh" in text and "scripts/build.sh" in text,
              f"{name}: the builder uses scripts/install-deps.sh and scripts/build.sh")
        args, seen_from = {}, False  # the ARGs before the first FROM, with their defaults
        for word, arg in ins:
            if word == "ARG" and not seen_from and "=" in arg:
                key, _, value = arg.partition("=")
                args[key.strip()] = value.strip()
            elif word == "FROM":
                seen_from = True
                parts = arg.split()
                image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)),
                               parts[0])
                if len(parts) == 3 and parts[1].upper() == "AS":
                    stages.add(parts[2])
                pinned = image in stages or image == "scratch" or (
                    ":" in image and not image.endswith(":latest"))
                check(pinned, f"{name}: FROM {parts[0]} (by default {image}) is pinned or a stage")
                last_install = ""
            elif word == "COPY" and "--from=" not in arg:
                srcs = shlex.split(arg)[:-1]
                for s in srcs:
                    if s.startswith("prebuilt/"):  # ADJSH_BINARY=prebuilt: a context of its own
                        check(ins and any(w == "ARG" and a.startswith("ADJSH_BINARY=build")
                                          for w, a in ins),
                              f"{name}: COPY {s} only with ADJSH_BINARY=prebuilt (default build)")
                        continue
                    p = os.path.join(ROOT, s)
                    excluded = any(s.rstrip("/") == i or s.startswith(i + "/") for i in ignored)
                    check(os.path.exists(p) and not excluded,
                          f"{name}: COPY source {s} exists and is sent to the builder")
            elif word == "RUN" and "apt-get install" in arg:
                last_install = arg
            elif word == "ENTRYPOINT":
                entry = json.loads(arg)
            elif word == "CMD":
                cmd = json.loads(arg)
        pkgs = set(re.findall(r"\b(lib[a-z0-9+.-]+)", last_install))
        missing = sorted(needed - pkgs)
        check(not missing, f"{name}: the runtime stage installs adjsh's libraries"
                           + (f" (missing: {' '.join(missing)})" if missing else ""))
        check(entry == ["/usr/local/bin/adjsh"], f"{name}: ENTRYPOINT is adjsh")
        if name.endswith("Dockerfile.worker"):  # not in ldd: loaded with dlopen on first GPU use
            runtime = text[text.index("\nFROM ", text.index("\nFROM ") + 1):]  # after the builder
            check("libcublas-" in runtime, f"{name}: the runtime stage installs cuBLAS "
                                            "(kernels/cuda/cublas_api.h loads it)")
        check_adjsh_args(adjsh, cmd, f"{name} CMD")


def check_compose(adjsh):
    path = os.path.join(ROOT, "docker", "compose.yaml")
    exe = shutil.which("docker-compose")
    if exe:
        r = subprocess.run([exe, "-f", path, "--profile", "gpu8", "config", "-q"],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"docker-compose config accepts docker/compose.yaml "
                                 f"{r.stderr.strip()}")
    else:
        print("SKIP docker-compose config: docker-compose is not installed "
              "(scripts/install-deps.sh installs it)")
    c = yaml.safe_load(open(path))
    base = os.path.dirname(path)
    gpus, metrics = [], {}
    for name, svc in c["services"].items():
        if "build" in svc:
            ctx = os.path.join(base, svc["build"]["context"])
            check(os.path.isdir(ctx) and os.path.isfile(os.path.join(ctx, svc["build"]["dockerfile"])),
                  f"compose {name}: build context and Dockerfile exist")
            check_adjsh_args(adjsh, svc["command"], f"compose {name}")
            metrics[name] = metrics_port(svc["command"])
        for v in svc.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                check(os.path.exists(os.path.join(base, src)), f"compose {name}: mount {src} exists")
        for p in svc.get("ports", []):
            check(str(p).startswith("127.0.0.1:"), f"compose {name}: port {p} on 127.0.0.1 only")
        if name.startswith("worker-"):
            devs = svc["deploy"]["resources"]["reservations"]["devices"]
            check(len(devs) == 1 and devs[0]["driver"] == "nvidia" and
                  devs[0]["capabilities"] == ["gpu"] and len(devs[0]["device_ids"]) == 1,
                  f"compose {name}: reserves one NVIDIA GPU")
            gpus.append(devs[0]["device_ids"][0])
    check(len(gpus) >= 2 and len(set(gpus)) == len(gpus), f"compose workers' GPUs differ: {gpus}")
    prom = yaml.safe_load(open(os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")))
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    coord = jobs["adjsh-coordinator"]["static_configs"][0]["targets"]
    check(coord == [f"coordinator:{metrics['coordinator']}"],
          f"prometheus.yml scrapes the coordinator at {coord}")
    sd = jobs["adjsh-worker"]["dns_sd_configs"][0]
    workers = sorted(n for n in metrics if n.startswith("worker-"))
    check(sorted(sd["names"]) == workers and all(metrics[w] == sd["port"] for w in workers),
          f"prometheus.yml scrapes every compose worker on port {sd['port']}")
    # The alerts reach the compose host's Alertmanager, which has a route to a receiver.
    am = c["services"].get("alertmanager", {})
    targets = [t for a in prom.get("alerting", {}).get("alertmanagers", [])
               for sc in a.get("static_configs", []) for t in sc.get("targets", [])]
    amc = yaml.safe_load(open(os.path.join(ROOT, "deploy", "alertmanager", "alertmanager.yml")))
    receivers = {r["name"] for r in amc.get("receivers", [])}
    check(am and targets == ["alertmanager:9093"] and
          any(str(p).endswith(":9093") for p in am.get("ports", [])) and
          amc["route"]["receiver"] in receivers,
          f"prometheus.yml sends the alerts to the compose Alertmanager ({targets}), whose route "
          f"has a receiver")
    coord_cmd = c["services"]["coordinator"]["command"]
    check("--data-root" in coord_cmd and
          any(coord_cmd[coord_cmd.index("--data-root") + 1] in v.split(":")[1:]
              for v in c["services"]["coordinator"]["volumes"]),
          "compose coordinator: --data-root is a mounted volume (the models and data)")


def k8s_objects():
    out = []
    for f in sorted(glob.glob(os.path.join(ROOT, "deploy", "k8s", "**", "*.yaml"), recursive=True)):
        if f.endswith("kustomization.yaml"):
            continue
        for d in yaml.safe_load_all(open(f)):
            if d:
                out.append((rel(f), d))
    return out


def check_k8s(adjsh):
    kdir = os.path.join(ROOT, "deploy", "k8s")
    kust = yaml.safe_load(open(os.path.join(kdir, "kustomization.yaml")))
    files = {rel(os.path.join(kdir, r)) for r in kust["resources"]}
    on_disk = {f for f, _ in k8s_objects()}
    check(files == on_disk, f"kustomization lists every manifest ({len(files)} files)")
    objs = k8s_objects()
    configmaps = {d["metadata"]["name"] for _, d in objs if d["kind"] == "ConfigMap"}
    workloads = [(f, d) for f, d in objs if d["kind"] in ("Deployment", "StatefulSet")]
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for _, d in workloads]
    for f, d in objs:
        what = f"{f}: {d['kind']} {d['metadata']['name']}"
        check(d.get("apiVersion") and (d["kind"] == "Namespace" or
                                       d["metadata"].get("namespace") == "adjsh"),
              f"{what} is in namespace adjsh")
        if d["kind"] == "Service":
            sel = d["spec"]["selector"]
            check(any(all(l.get(k) == v for k, v in sel.items()) for l in pod_labels),
                  f"{what} selects the pods of a workload")
    ports = {}
    for f, d in workloads:
        what = f"{f}: {d['kind']} {d['metadata']['name']}"
        tmpl = d["spec"]["template"]
        check(d["spec"]["selector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items(),
              f"{what}: selector matches its pod labels")
        for v in tmpl["spec"].get("volumes", []):
            if "configMap" in v:
                check(v["configMap"]["name"] in configmaps,
                      f"{what}: ConfigMap {v['configMap']['name']} is defined")
        # Restricted Pod Security on every pod and container.
        psc = tmpl["spec"].get("securityContext", {})
        check(psc.get("runAsNonRoot") is True and
              psc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
              f"{what}: pod runs as non-root with the RuntimeDefault seccomp profile")
        for c in tmpl["spec"]["containers"]:
            csc = c.get("securityContext", {})
            check(csc.get("allowPrivilegeEscalation") is False and
                  csc.get("readOnlyRootFilesystem") is True and
                  "ALL" in csc.get("capabilities", {}).get("drop", []),
                  f"{what} container {c['name']}: no privilege escalation, a read-only root "
                  f"filesystem, every capability dropped")
        for c in tmpl["spec"]["containers"]:
            if c["image"].startswith("adjsh-"):
                check_adjsh_args(adjsh, c["args"], f"{what} container {c['name']}")
                port = metrics_port(c["args"])
                ann = tmpl["metadata"].get("annotations", {})
                cports = {p["name"]: p["containerPort"] for p in c["ports"]}
                check(ann.get("prometheus.io/scrape") == "true" and
                      ann.get("prometheus.io/port") == str(port) and cports.get("metrics") == port,
                      f"{what}: metrics on port {port}, annotated and declared")
                ports[d["metadata"]["name"]] = port
                # Readiness by the gRPC health service on its own plaintext port (a worker is
                # ready once registered: proto/health.h), the port --health-listen serves.
                args = c["args"]
                health = int(args[args.index("--health-listen") + 1].rsplit(":", 1)[1]) \
                    if "--health-listen" in args else None
                ready = c.get("readinessProbe", {}).get("grpc", {})
                check(health is not None and cports.get("health") == health and
                      ready.get("port") == health,
                      f"{what}: readiness by gRPC health on --health-listen's port {health}")
        if d["metadata"]["name"] == "adjsh-worker":
            res = tmpl["spec"]["containers"][0]["resources"]
            check(res["limits"].get("nvidia.com/gpu") == 1 and
                  res["requests"].get("nvidia.com/gpu") == 1, f"{what}: one nvidia.com/gpu each")
            terms = tmpl["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            expr = terms[0]["matchExpressions"][0]
            check(expr["key"] == "node.kubernetes.io/instance-type" and
                  {"p4d.24xlarge", "p4de.24xlarge"} <= set(expr["values"]),
                  f"{what}: scheduled on p4d/p4de nodes only")
    # A PodDisruptionBudget and a NetworkPolicy for the coordinator and the workers, each
    # selecting their pods; the coordinator's admits the workers on gRPC.
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for name in ("adjsh-coordinator", "adjsh-worker"):
            found = [d for _, d in objs if d["kind"] == kind and d["metadata"]["name"] == name]
            sel = (found[0]["spec"].get("selector") or found[0]["spec"].get("podSelector", {})
                   ).get("matchLabels", {}) if found else {}
            target = [d["spec"]["template"]["metadata"]["labels"] for _, d in workloads
                      if d["metadata"]["name"] == name]
            check(found and target and sel.items() <= target[0].items(),
                  f"{kind} {name} selects the {name} pods")
    netpol = [d for _, d in objs if d["kind"] == "NetworkPolicy" and
              d["metadata"]["name"] == "adjsh-coordinator"]
    admits_workers = netpol and any(
        any(f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") ==
            "worker" for f in rule.get("from", [])) and
        any(p.get("port") == 50051 for p in rule.get("ports", []))
        for rule in netpol[0]["spec"]["ingress"])
    check(admits_workers, "the coordinator's NetworkPolicy admits the workers on gRPC 50051")
    claims = {d["metadata"]["name"] for _, d in objs if d["kind"] == "PersistentVolumeClaim"}
    check({"adjsh-state", "adjsh-data", "adjsh-prometheus"} <= claims,
          f"volumes for the job state, the data and models, and Prometheus: {sorted(claims)}")
    prom = yaml.safe_load(open(os.path.join(ROOT, "deploy", "prometheus", "prometheus-k8s.yml")))
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    services = {d["metadata"]["name"]: d for _, d in objs if d["kind"] == "Service"}
    coord = jobs["adjsh-coordinator"]["static_configs"][0]["targets"][0]
    host, port = coord.rsplit(":", 1)
    svc = services[host.split(".")[0]]
    check(host.split(".")[1] == "adjsh" and int(port) == ports["adjsh-coordinator"] and
          any(p["port"] == int(port) for p in svc["spec"]["ports"]),
          f"prometheus-k8s.yml scrapes the coordinator Service at {coord}")
    sd = jobs["adjsh-worker"]["dns_sd_configs"][0]
    wsvc = services[sd["names"][0].split(".")[0]]
    check(wsvc["spec"].get("clusterIP") == "None" and sd["port"] == ports["adjsh-worker"],
          f"prometheus-k8s.yml finds the workers through the headless Service on {sd['port']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    adjsh = os.path.abspath(ap.parse_args().adjsh)
    for step in (check_yaml_and_dashboards, check_generated):
        step()
    for step in (check_dockerfiles, check_compose, check_k8s):
        step(adjsh)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
