#!/bin/bash
# Benchmarks of the stream kernel after "bf16 weights run the fp32 dot tiles" (commit 65b34ff),
# run one after another on a quiet machine. Usage: bash experiments/raw/2026-12-02-stream-v2b/runs.sh
set -x
R=experiments/raw/2026-12-02-stream-v2b
. .venv/bin/activate
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 2 --rounds 6 --out $R/dtype-ab-2threads > $R/dtype-ab-2threads.log 2>&1
for S in 128 512; do
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype fp32 --backend cpu --threads 2 --rounds 3 \
    --variants host-only+keep_graph@npu_lora_stream --peer-impls grouped_mm --out $R/engine-s$S-fp32 > $R/engine-s$S-fp32.log 2>&1
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype bf16 --backend cpu --threads 2 --rounds 3 \
    --variants host-only+keep_graph@npu_lora_stream --no-peers --out $R/engine-s$S-bf16 > $R/engine-s$S-bf16.log 2>&1
done
python -m npu_lora.bench.kernels --tokens 128 --dtypes bfloat16 --impls npu_lora_stream grouped_mm --threads 2 --rounds 3 --out $R/bf16-vs-grouped-2threads > $R/bf16-vs-grouped-2threads.log 2>&1
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 1 --rounds 4 --out $R/dtype-ab-1thread > $R/dtype-ab-1thread.log 2>&1
echo done
