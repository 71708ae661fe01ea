#!/usr/bin/env bash
# One device-machine session (device tool `run`, carry .whl): GPU tests + cuda benches.
# Outputs go to $OUT (facts.txt, pytest.log, bench-*/bench.{md,jsonl}).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/worker:$PWD/operator
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|Flags" | sed 's/Flags:.*amx_bf16.*/Flags: ... amx_bf16 .../'
  free -g | head -2
  python3 -c "import torch, transformers, peft, pydantic; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'pydantic', pydantic.__version__)"
} > $OUT/facts.txt 2>&1
cat $OUT/facts.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu tests/bench/test_overlap.py \
  tests/engine/test_engine_backends.py 2>&1 | tee $OUT/pytest.log | tail -25
for S in 512 2048; do
  timeout 150 python3 -m npu_lora.cli bench --preset qwen3-30b-a3b --layers 2 --seq-len $S \
    --answer-tokens 32 --host-dtype bf16 --backend cuda --no-peers --warmup 1 --rounds 6 \
    --variants host-only+keep_graph,hot+keep_graph,hot+keep_graph+sequential,host-only \
    --title "H200 + host CPU, Qwen3-30B-A3B widths, 2 layers, S=$S, bf16 host" \
    --out $OUT/bench-s$S 2>&1 | tail -22
done
ls -la $OUT $OUT/* | head -30
