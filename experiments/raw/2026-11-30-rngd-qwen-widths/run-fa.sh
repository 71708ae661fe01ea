#!/usr/bin/env bash
# usage: run-fa.sh WIDTHS DIRECTIONS
cd /work/main
export PYTHONPATH=/work/main/worker TMPDIR=/tmp/rngd-qwen/tmp-fa-$1-$2
mkdir -p $TMPDIR
echo "=== fa $1 $2 start $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check \
  --source experiments/raw/2026-11-30-rngd-qwen-widths/attn_fa.py:device_graphs \
  --widths $1 --seq-len 128 --dtype float32 --directions $2 --tier compile \
  --cache-dir /tmp/rngd-qwen/cache-fa-$1-$2 --timeout 2400 --json /tmp/rngd-qwen/fa-$1-$2.json
echo "=== fa $1 $2 rc=$? end $(date -u +%T)"
