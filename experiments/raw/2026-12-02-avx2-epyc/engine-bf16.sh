# engine step on the AVX2 EPYC, bf16 storage: ours (stream kernel; +torch_head) vs stock
# transformers + peft with fp32 experts (peer+fp32@grouped_mm: the fair peer on a CPU without
# native bf16, where stock bf16 is the cliff), in one npu-lora bench run per S.
R=experiments/raw/2026-12-02-avx2-epyc
for S in 128 512; do
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype bf16 --backend cpu --threads 2 --rounds 5 \
    --variants host-only+keep_graph@npu_lora_stream,host-only+keep_graph+torch_head@npu_lora_stream,peer+fp32@grouped_mm \
    --no-peers --out $R/engine-${TAG:-a}-s$S-bf16
done
