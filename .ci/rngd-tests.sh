#!/usr/bin/env bash
# RNGD compile tests: furiosa-torch's compiler on the CPU, in the RNGD venv (no NPU needed).
#
# Runs tests/rngd (the rngd-marked compile tests plus the pure-torch inventory tests, which then
# also run on furiosa's pinned torch 2.10) with the RNGD venv's python, when that venv exists at
#   ${NPU_LORA_RNGD_VENV:-$HOME/.cache/npu-lora/rngd-venv}   (built by scripts/rngd-env.sh)
# and exits 0 with a message when it does not. The furiosa compile cache persists in
#   ${NPU_LORA_RNGD_CACHE:-$HOME/.cache/npu-lora/furiosa-compile-cache}
# so only the first run compiles cold; later runs take seconds per graph. The attention's
# whole-graph compiles always run (cold 5.5 + 8 min on an idle 2-core machine); its per-op probes
# (cold 11-14 min per direction) only with NPU_LORA_RNGD_ATTENTION=1. Extra arguments go to pytest
# (e.g. -k hot_experts).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${NPU_LORA_RNGD_VENV:-$HOME/.cache/npu-lora/rngd-venv}"
PY="$VENV/bin/python"

if [[ ! -x "$PY" ]]; then
  echo "rngd-tests: RNGD venv absent at $VENV; skipping the RNGD compile tests" \
       "(build it with: bash scripts/rngd-env.sh)"
  exit 0
fi
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('furiosa.torch') is None)"; then
  echo "rngd-tests: $VENV has no furiosa-torch; skipping (rebuild with: bash scripts/rngd-env.sh)"
  exit 0
fi

export NPU_LORA_RNGD_CACHE="${NPU_LORA_RNGD_CACHE:-$HOME/.cache/npu-lora/furiosa-compile-cache}"
mkdir -p "$NPU_LORA_RNGD_CACHE"
# This checkout's code, not whatever checkout the venv's editable install points at.
export PYTHONPATH="$REPO/worker${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO"
echo "rngd-tests: $("$PY" -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "furiosa-torch", m.version("furiosa-torch"))'), cache $NPU_LORA_RNGD_CACHE"
set +e
"$PY" -m pytest tests/rngd -p no:cacheprovider -ra "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then  # no tests collected
  echo "rngd-tests: no tests collected"
  exit 0
fi
exit $rc
