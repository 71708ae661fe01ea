#!/bin/bash
# Engine bf16 re-runs with the router and activations in fp32 for the stream kernel (commit
# "bench: a variant switched to npu_lora_stream gets that kernel's compute dtype").
# The bf16 runs before that fix are in before-fp32-router/.
set -x
R=experiments/raw/2026-12-02-stream-v2b
. .venv/bin/activate
npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len 512 --host-dtype bf16 --backend cpu --threads 2 --rounds 3 \
  --variants host-only+keep_graph@npu_lora_stream --no-peers --out $R/engine-s512-bf16 > $R/engine-s512-bf16.log 2>&1
npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len 128 --host-dtype bf16 --backend cpu --threads 2 --rounds 3 \
  --variants host-only+keep_graph@npu_lora_stream --peer-impls grouped_mm --out $R/engine-s128-bf16 > $R/engine-s128-bf16.log 2>&1
echo done
npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len 512 --host-dtype fp32 --backend cpu --threads 2 --rounds 5 --variants host-only+keep_graph@npu_lora_stream --peer-impls grouped_mm --out experiments/raw/2026-12-02-stream-v2b/engine-s512-fp32-5rounds  # quiet machine, after all other runs
