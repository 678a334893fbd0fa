#!/usr/bin/env python3
"""Every Kubernetes object that `kubectl apply -k deploy/k8s` creates, validated against the
Kubernetes API's own OpenAPI schemas (the `kubernetes-validate` package, pinned in
scripts/setup-venv.sh, which bundles them), in strict mode: an unknown or misspelt field is an
error, as `kubectl apply --validate=strict` makes it. No cluster is needed.

  .venv/bin/python tests/deploy/test_k8s_schemas.py

Checked against the oldest and the newest Kubernetes the manifests are for (grpc probes need
1.24; EKS, where the P4 nodes are, supports 1.28 and later in extended support). The field
checks that no schema expresses (securityContext values, what selects what) are
tests/deploy/test_deploy_files.py's. Two broken copies must fail, so that a validator that
accepts everything cannot pass this test. Prints one line per check; exit 1 when any fails.
"""
import copy
import os
import sys

import kubernetes_validate
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
VERSIONS = ("1.28.0", "1.37.0")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def errors(obj, version):
    """'' when obj validates strictly against version's schema, else the reason."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
        return ""
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        return f"{path}: {e.message}"
    except (kubernetes_validate.SchemaNotFoundError,
            kubernetes_validate.InvalidSchemaError) as e:
        return str(e)


def objects():
    """[(file, object)] of the kustomization's resources, in its order."""
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    out = []
    for rel in kustomization["resources"]:
        with open(os.path.join(K8S, rel)) as f:
            out += [(rel, o) for o in yaml.safe_load_all(f) if o]
    return out


def main():
    objs = objects()
    check(len(objs) >= 15, f"{len(objs)} objects in deploy/k8s/kustomization.yaml's resources")
    for version in VERSIONS:
        for rel, o in objs:
            why = errors(o, version)
            check(not why, f"{rel}: {o['kind']}/{o['metadata']['name']} valid against "
                           f"Kubernetes {version}, strict{': ' + why if why else ''}")

    # The validator rejects what is wrong: a misspelt securityContext field and a wrong type.
    worker = next(o for _, o in objs if o["kind"] == "StatefulSet")
    misspelt = copy.deepcopy(worker)
    sc = misspelt["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    sc["readOnlyRootFileSystem"] = sc.pop("readOnlyRootFilesystem")
    why = errors(misspelt, VERSIONS[-1])
    check("readOnlyRootFileSystem" in why,
          f"a worker with a misspelt readOnlyRootFilesystem is refused ({why or 'accepted'})")
    wrong_type = copy.deepcopy(worker)
    wrong_type["spec"]["replicas"] = "eight"
    why = errors(wrong_type, VERSIONS[-1])
    check("replicas" in why, f"a worker with replicas: \"eight\" is refused ({why or 'accepted'})")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
