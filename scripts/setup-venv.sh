#!/usr/bin/env bash
# Creates or updates the project virtual environment .venv at the repository root, used by the
# data-preparation tool (scripts/adjsh_data.py), the Python client and the venv tests
# (tests/CMakeLists.txt: adjsh_venv_test).
# Idempotent: when .venv already holds the pinned versions nothing is installed and nothing is
# printed. The pinned versions are written to .venv/.adjsh-stamp; changing a pin reinstalls.
#
# The venv is made with --system-site-packages so Debian's numpy and torch (python3-numpy,
# python3-torch) stay visible. pip is constrained to the system numpy and torch versions, read at
# run time, so it can never install another numpy or torch into .venv (a newer numpy would shadow
# the one Debian's torch is built against).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
VENV=.venv
STAMP="$VENV/.adjsh-stamp"

# transformers 4.44.2 requires tokenizers>=0.19,<0.20 and has MambaForCausalLM; it supports
# torch 1.13. pyarrow 18.1.0's cp311 wheel runs with numpy 1.16.6 and later, 1.24 included
# (17.0.0 is avoided: its wheel installs stray top-level packages named benchmarks, examples,
# scripts and cmake_modules into site-packages).
TOKENIZERS_VERSION=0.19.1
TRANSFORMERS_VERSION=4.44.2
PYARROW_VERSION=18.1.0
# The Python client (clients/python): gRPC and its stub generator; grpcio-tools 1.62 needs
# protobuf 4.21.6 to 4.x.
GRPC_VERSION=1.62.3
PROTOBUF_VERSION=4.25.8
# The manifests' schema check (tests/deploy/test_k8s_schemas.py): the Kubernetes API schemas,
# bundled, with a strict validator.
KUBERNETES_VALIDATE_VERSION=1.37.0
# Their dependencies that Debian does not provide (or too old: jsonschema 4.10), pinned for
# reproducible installs.
DEP_PINS="huggingface-hub==0.36.2 safetensors==0.8.0 regex==2026.11.19 tqdm==4.70.1
fsspec==2026.9.0 filelock==4.3.1 hf-xet==1.8.0 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
importlib_resources==7.1.0"

log() { echo "setup-venv: $*" >&2; }

# Keep the venv out of git.
if ! grep -qxF '/.venv/' .gitignore 2>/dev/null; then
  if [ -s .gitignore ] && [ -n "$(tail -c1 .gitignore)" ]; then echo >> .gitignore; fi
  echo '/.venv/' >> .gitignore
fi

sys_version() {  # prints the installed version of a distribution in the system python
  "$PY" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' \
    "$1" 2>/dev/null
}
if [ ! -x "$PY" ]; then
  log "$PY not found (apt-get install python3 python3-numpy python3-torch)"
  exit 1
fi
if ! SYS_NUMPY=$(sys_version numpy) || ! SYS_TORCH=$(sys_version torch); then
  log "the system python lacks numpy or torch (apt-get install python3-numpy python3-torch)"
  exit 1
fi

STAMP_TEXT="python=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
tokenizers==$TOKENIZERS_VERSION
transformers==$TRANSFORMERS_VERSION
pyarrow==$PYARROW_VERSION
grpcio==$GRPC_VERSION grpcio-tools==$GRPC_VERSION protobuf==$PROTOBUF_VERSION
kubernetes-validate==$KUBERNETES_VALIDATE_VERSION
$DEP_PINS
numpy==$SYS_NUMPY (system)
torch==$SYS_TORCH (system)"

# Fast path: the stamp matches and the pinned packages import at their pinned versions.
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] &&
   "$VENV/bin/python" - "$TOKENIZERS_VERSION" "$TRANSFORMERS_VERSION" "$PYARROW_VERSION" \
     "$GRPC_VERSION" "$KUBERNETES_VALIDATE_VERSION" >/dev/null 2>&1 <<'EOF'
import sys, tokenizers, transformers, pyarrow, grpc, grpc_tools, kubernetes_validate
from importlib.metadata import version
assert (tokenizers.__version__, transformers.__version__, pyarrow.__version__,
        grpc.__version__, version("kubernetes-validate")) == tuple(sys.argv[1:6])
EOF
then
  exit 0
fi

# Creating a venv needs the venv and ensurepip modules (Debian: python3-venv).
install_venv_pkg() {
  if [ "$(id -u)" -ne 0 ]; then
    log "python's venv/ensurepip module is missing; run as root or: sudo apt-get install python3-venv"
    exit 1
  fi
  log "installing python3-venv"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
}
if [ ! -x "$VENV/bin/python" ] || [ ! -x "$VENV/bin/pip" ]; then
  "$PY" -c 'import venv, ensurepip; ensurepip.version()' >/dev/null 2>&1 || install_venv_pkg
  log "creating $VENV"
  rm -rf "$VENV"
  if ! "$PY" -m venv --system-site-packages "$VENV" >/dev/null 2>&1; then
    # Debian's ensurepip can import yet fail without python3-venv: install it and retry once.
    rm -rf "$VENV"
    install_venv_pkg
    "$PY" -m venv --system-site-packages "$VENV"
  fi
fi
rm -f "$STAMP"

CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'numpy==%s\ntorch==%s\n%s\n' "$SYS_NUMPY" "$SYS_TORCH" "$DEP_PINS" | tr ' ' '\n' \
  > "$CONSTRAINTS"

log "installing tokenizers==$TOKENIZERS_VERSION transformers==$TRANSFORMERS_VERSION" \
    "pyarrow==$PYARROW_VERSION grpcio==$GRPC_VERSION" \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install -q --constraint "$CONSTRAINTS" \
  "tokenizers==$TOKENIZERS_VERSION" "transformers==$TRANSFORMERS_VERSION" \
  "pyarrow==$PYARROW_VERSION" "grpcio==$GRPC_VERSION" "grpcio-tools==$GRPC_VERSION" \
  "protobuf==$PROTOBUF_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"

# Verify: everything imports, numpy and torch are still the system ones, Mamba is importable.
if ! "$VENV/bin/python" - "$SYS_NUMPY" "$SYS_TORCH" <<'EOF'
import sys
import tokenizers, pyarrow, transformers, torch, numpy, grpc, grpc_tools, kubernetes_validate
from importlib.metadata import version
from transformers import MambaForCausalLM, MambaConfig
for mod, want in ((numpy, sys.argv[1]), (torch, sys.argv[2])):
    name = mod.__name__
    if version(name) != want or not mod.__file__.startswith("/usr/"):
        sys.exit(f"setup-venv: {name} {version(name)} at {mod.__file__} is not the system {want}")
EOF
then
  log "verification of $VENV failed"
  exit 1
fi
printf '%s\n' "$STAMP_TEXT" > "$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "ready: $VENV"
