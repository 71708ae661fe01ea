#!/usr/bin/env bash
# The done-when: rngd-check --widths tiny, all tiers, every graph and direction.
# $1 = widths, $2 = tier(s), $3 = cache dir, $4 = json out
cd /work/main
export PYTHONPATH=/work/main/worker TMPDIR=/tmp/rngd-full/tmp-$1
mkdir -p $TMPDIR
echo "=== rngd-check $1 $2 start $(date -u +%T)"
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check --widths $1 --seq-len 128 \
  --dtype float32 --tier $2 --cache-dir $3 --timeout 3600 --json $4
echo "=== rngd-check $1 $2 rc=$? end $(date -u +%T)"
