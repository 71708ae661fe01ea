#!/usr/bin/env bash
# graphs.py (rotate_half as a matmul) attention, one direction $1, tier $2; own cold cache.
cd /work/main
export PYTHONPATH=/work/main/worker TMPDIR=/tmp/rngd-final/tmp-$1-$2
mkdir -p $TMPDIR
echo "=== attention $1 $2 start $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check --widths tiny --seq-len 128 \
  --dtype float32 --graphs attention --directions $1 --tier $2 \
  --cache-dir /tmp/rngd-final/cache-$1-$2 --timeout 3000 --json /tmp/rngd-final/attention-$1-$2.json
echo "=== attention $1 $2 rc=$? end $(date -u +%T)"
