#!/usr/bin/env bash
# graphs.py's head at Qwen3-30B-A3B widths, compile tier, both directions, cold cache.
cd /work/main
export PYTHONPATH=/work/main/worker TMPDIR=/tmp/rngd-qwen/tmp-head-final
mkdir -p $TMPDIR
echo "=== head qwen start $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check --widths qwen3-30b-a3b \
  --seq-len 128 --dtype float32 --graphs head --tier compile --cache-dir /tmp/rngd-qwen/cache-head-final \
  --timeout 3000 --json /tmp/rngd-qwen/head-final.json
echo "=== head qwen rc=$? end $(date -u +%T)"
