#!/usr/bin/env bash
cd /work/main
export PYTHONPATH=/work/main/worker
export TMPDIR=/tmp/rngd-attn/tmp; mkdir -p $TMPDIR
PY=$HOME/.cache/npu-lora/rngd-venv/bin/python
for v in "$@"; do
  export ATTN_VARIANT=$v
  echo "=== $v $(date -u +%T)"
  $PY -m npu_lora.rngd.check --source /tmp/rngd-attn/variants.py:device_graphs --widths tiny --seq-len 128 \
     --dtype float32 --graphs attention --directions ${DIRS:-backward} --tier compile \
     --cache-dir /tmp/rngd-attn/cache-$v${DIRS:+-$DIRS} --timeout 2400 --json /tmp/rngd-attn/res-$v${DIRS:+-$DIRS}.json
  rc=$?
  echo "=== $v rc=$rc $(date -u +%T)"
  [ $rc -eq 0 ] && break
done
