#!/usr/bin/env bash
# usage: run.sh TAG GRAPHS DIRECTIONS [FURIOSA_CFG]; results in /tmp/rngd-split/res-TAG.json
cd /work/main
export PYTHONPATH=/work/main/worker
mkdir -p /tmp/rngd-split/tmp-$1
export TMPDIR=/tmp/rngd-split/tmp-$1 FURIOSA_CFG=${4:-}
echo "=== $1 $2 $3 cfg=${4:-} start $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check \
  --source experiments/raw/2026-11-30-rngd-attention-split/split.py:device_graphs \
  --widths tiny --seq-len 128 --dtype float32 --graphs $2 --directions $3 --tier compile \
  --cache-dir /tmp/rngd-split/cache-$1 --timeout 3000 --json /tmp/rngd-split/res-$1.json
echo "=== $1 rc=$? end $(date -u +%T)"
