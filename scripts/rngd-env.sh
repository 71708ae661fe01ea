#!/usr/bin/env bash
# Build the RNGD venv: furiosa-torch 2026.4.0 + its pinned torch 2.10.0 + this project.
#
# furiosa-torch's compiler runs on the CPU (no NPU needed), so this venv lets us compile every
# device graph here and in CI (`npu-lora rngd-check`, `.ci/rngd-tests.sh`). It is kept apart from
# the main venv: furiosa-torch pins torch 2.10.0 and autoloads into every `import torch`.
#
# Usage:   bash scripts/rngd-env.sh            (idempotent: re-running only fixes what is missing)
# Path:    ${NPU_LORA_RNGD_VENV:-$HOME/.cache/npu-lora/rngd-venv}
#          (outside the repo so CI runs in a fresh clone on the same machine find it)
# Python:  ${PYTHON:-python3.11}
# Cost:    torch==2.10.0 from PyPI is a CUDA build (~7 GB on disk, ~3 min); furiosa-torch ~10 s.
#
# Also installs Debian's aarch64 cross-compiler (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross):
# furiosa's compiler shells out to it, and without it every op "fails to compile" -- and those
# failures are cached on disk, so we clear furiosa's compile cache when we install the compiler.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${NPU_LORA_RNGD_VENV:-$HOME/.cache/npu-lora/rngd-venv}"
PY="${PYTHON:-python3.11}"
TORCH_VERSION="2.10.0"
FURIOSA_VERSION="2026.4.0"
# Worker dependencies except torch (which must stay at furiosa-torch's pin).
WORKER_DEPS=(
  "transformers>=5.24,<6" "peft>=0.21,<0.22" "pyyaml>=6" "pydantic>=2.10,<3" "tqdm>=4.66"
  "safetensors>=0.5" "tokenizers>=0.22" "pytest>=8" "pytest-timeout>=2.3"
)

log() { printf '[rngd-env] %s\n' "$*" >&2; }

# --- 1. aarch64 cross-compiler (Debian) -----------------------------------------------------
apt_missing=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || apt_missing+=(gcc-aarch64-linux-gnu)
dpkg -s libc6-dev-arm64-cross >/dev/null 2>&1 || apt_missing+=(libc6-dev-arm64-cross)
if ((${#apt_missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { log "need root or sudo to apt-get install ${apt_missing[*]}"; exit 1; }
    SUDO="sudo"
  fi
  log "installing ${apt_missing[*]} (apt-get update first)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${apt_missing[@]}"
  # Compiles attempted before the cross-compiler existed are cached as failures: drop them.
  stale="${XDG_CACHE_HOME:-$HOME/.cache}/furiosa/compiler"
  if [[ -d "$stale" ]]; then
    log "clearing furiosa compile cache $stale (may hold failures cached without the cross-compiler)"
    rm -rf "$stale"
  fi
else
  log "aarch64 cross-compiler present: $(command -v aarch64-linux-gnu-gcc)"
fi

# --- 2. the venv ------------------------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv $VENV with $PY"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
VPY="$VENV/bin/python"

# Version of an installed distribution, without importing it (importing torch autoloads furiosa).
dist_version() {
  "$VPY" -I - "$1" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    print("")
EOF
}

# Keep pip from ever moving torch off the pin (peft/transformers resolve against it).
CONSTRAINTS="$VENV/npu-lora-constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" >"$CONSTRAINTS"
PIP=("$VPY" -m pip install -q -c "$CONSTRAINTS")

if [[ "$(dist_version torch)" != "$TORCH_VERSION" ]]; then
  log "installing torch==$TORCH_VERSION from PyPI (CUDA build, ~7 GB, ~3 min)"
  "${PIP[@]}" "torch==$TORCH_VERSION"
else
  log "torch $TORCH_VERSION present"
fi

if [[ "$(dist_version furiosa-torch)" != "$FURIOSA_VERSION" ]]; then
  log "installing furiosa-torch==$FURIOSA_VERSION"
  "${PIP[@]}" "furiosa-torch==$FURIOSA_VERSION"
else
  log "furiosa-torch $FURIOSA_VERSION present"
fi

missing_deps=0
for mod in transformers peft yaml pydantic tqdm safetensors tokenizers pytest pytest_timeout; do
  "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" \
    || { missing_deps=1; break; }
done
if ((missing_deps)); then
  log "installing worker dependencies (torch stays at $TORCH_VERSION)"
  "${PIP[@]}" "${WORKER_DEPS[@]}"
else
  log "worker dependencies present"
fi

# The project itself (editable, no deps: never let pip touch torch). Tests run from another
# checkout put that checkout's worker/ first on PYTHONPATH (see .ci/rngd-tests.sh).
editable_from() {
  "$VPY" -I - <<'EOF2'
import json
from importlib.metadata import PackageNotFoundError, distribution
try:
    text = distribution("npu-lora").read_text("direct_url.json") or "{}"
    print(json.loads(text).get("url", ""))
except PackageNotFoundError:
    print("")
EOF2
}
if [[ "$(editable_from)" != "file://$REPO" ]]; then
  log "installing npu-lora (editable) from $REPO"
  "$VPY" -m pip install -q --no-deps -e "$REPO"
else
  log "npu-lora installed (editable) from $REPO"
fi

# --- 3. verify --------------------------------------------------------------------------------
"$VPY" - <<'EOF'
import importlib.metadata as md
import shutil
import sys

import torch
import furiosa.torch  # noqa: F401  (autoloaded by torch too)

assert torch.__version__.split("+")[0] == "2.10.0", torch.__version__
print(
    f"[rngd-env] ok: python {sys.version.split()[0]}, torch {torch.__version__}, "
    f"furiosa-torch {md.version('furiosa-torch')}, "
    f"aarch64 gcc {shutil.which('aarch64-linux-gnu-gcc')}",
    file=sys.stderr,
)
EOF
log "venv ready: $VENV (activate: source $VENV/bin/activate)"
