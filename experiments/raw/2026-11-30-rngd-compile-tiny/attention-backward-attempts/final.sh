#!/usr/bin/env bash
# final graphs.py attention, one direction: $1
cd /work/main
export PYTHONPATH=/work/main/worker TMPDIR=/tmp/rngd-attn/tmp
echo "=== final $1 $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check --widths tiny --seq-len 128 --dtype float32 \
  --graphs attention --directions $1 --tier compile --cache-dir /tmp/rngd-attn/cache-final \
  --timeout 3000 --json /tmp/rngd-attn/res-final-$1.json
echo "=== final $1 rc=$? $(date -u +%T)"
