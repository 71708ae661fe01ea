#!/usr/bin/env bash
# Third device session: the StreamRunner backward fix, GPU tests 5 times; S=512 bench rerun.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/worker:$PWD/operator
for i in 1 2 3 4 5; do
  timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu 2>&1 | tail -1 | tee -a $OUT/pytest-3.log
done
timeout 120 python3 -m npu_lora.cli bench --preset qwen3-30b-a3b --layers 2 --seq-len 512 \
  --answer-tokens 32 --host-dtype bf16 --backend cuda --no-peers --no-memory --warmup 1 --rounds 6 \
  --variants host-only+keep_graph,hot+keep_graph,hot+keep_graph+sequential \
  --title "H200 + host CPU, Qwen3-30B-A3B widths, 2 layers, S=512, bf16 host: after the backward stream fix" \
  --out $OUT/fix-s512 2>&1 | grep -v "^round" | head -14
