#!/bin/bash
# Zen 4 session (2026-12-02): the exact commands, in the order run. From the repo root, venv active.
set -x
R=experiments/raw/2026-12-02-zen4
# 1. bf16 vs fp32 storage, default path (avx512bf16 = native bf16 on this CPU)
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 2 --rounds 6 --out $R/dtype-ab-native
# 2. the same with the widening AVX-512 path forced
NPU_LORA_STREAM_ISA=avx512 python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 2 --rounds 4 --out $R/dtype-ab-widening
# 3. against torch grouped_mm (bf16 native through oneDNN here) and copy
python -m npu_lora.bench.kernels --tokens 128 512 --dtypes bfloat16 float32 --impls npu_lora_stream grouped_mm --threads 2 --rounds 3 --out $R/vs-grouped
# 4. engine step, 2 Qwen3 layers, host-only + keep_graph with the stream kernel vs stock transformers + peft (grouped_mm)
for S in 128 512; do for D in bf16 fp32; do
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype $D --backend cpu --threads 2 --rounds 3 --variants host-only+keep_graph@npu_lora_stream --peer-impls grouped_mm --out $R/engine-s$S-$D
done; done
# 5. after the block cache (final code): kernels against grouped_mm again
python -m npu_lora.bench.kernels --tokens 128 512 --dtypes bfloat16 float32 --impls npu_lora_stream grouped_mm --threads 2 --rounds 3 --out $R/vs-grouped-final
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 2 --rounds 6 --out $R/dtype-ab-native-final
