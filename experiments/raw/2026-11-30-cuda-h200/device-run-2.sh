#!/usr/bin/env bash
# Second device session: fixed GPU tests, overlap diagnosis, hot bucket rule A/B (cost vs padmax).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/worker:$PWD/operator
R=experiments/raw/2026-11-30-cuda-h200
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu tests/bench/test_overlap.py \
  tests/engine/test_engine_backends.py tests/engine/test_engine_hot.py 2>&1 | tee $OUT/pytest-2.log | tail -8
timeout 90 python3 $R/diag_overlap.py 2>&1 | tee $OUT/diag-overlap.txt
for S in 512 2048; do
  timeout 150 python3 -m npu_lora.cli bench --preset qwen3-30b-a3b --layers 2 --seq-len $S \
    --answer-tokens 32 --host-dtype bf16 --backend cuda --no-peers --no-memory --warmup 1 --rounds 6 \
    --variants host-only+keep_graph,hot+keep_graph,hot+keep_graph+padmax \
    --title "H200 + host CPU, Qwen3-30B-A3B widths, 2 layers, S=$S, bf16 host: bucket rule" \
    --out $OUT/bucket-s$S 2>&1 | grep -v "^round" | head -12
done
timeout 120 python3 $R/prof_hot.py cuda 512 16 hot > $OUT/prof-hot-cuda-s512.txt 2>&1; tail -45 $OUT/prof-hot-cuda-s512.txt | cut -c1-180
