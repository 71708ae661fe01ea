#!/usr/bin/env bash
# usage: run-head.sh TAG VARIANT DIRECTIONS [FURIOSA_CFG]
cd /work/main
export PYTHONPATH=/work/main/worker HEAD_VARIANT=$2 FURIOSA_CFG=${4:-}
mkdir -p /tmp/rngd-qwen/tmp-$1; export TMPDIR=/tmp/rngd-qwen/tmp-$1
echo "=== $1 $2 $3 cfg=${4:-} start $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check \
  --source experiments/raw/2026-11-30-rngd-qwen-widths/head.py:device_graphs \
  --widths qwen3-30b-a3b --seq-len 128 --dtype float32 --directions $3 --tier compile \
  --cache-dir /tmp/rngd-qwen/cache-$1 --timeout 1800 --json /tmp/rngd-qwen/res-$1.json
echo "=== $1 rc=$? end $(date -u +%T)"
