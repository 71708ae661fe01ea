#!/usr/bin/env bash
cd /work/main
export PYTHONPATH=/work/main/worker TMPDIR=/tmp/rngd-attn/tmp
echo "=== final bf16 backward $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check --widths tiny --seq-len 128 --dtype bfloat16 \
  --graphs attention --directions backward --tier compile --cache-dir /tmp/rngd-attn/cache-final-bf16 \
  --timeout 3000 --json /tmp/rngd-attn/res-final-bf16-backward.json
echo "=== final bf16 backward rc=$? $(date -u +%T)"
