# bf16 vs fp32 expert storage of our engine in ONE process (host-only+keep_graph+fp32: the same
# engine on an fp32 copy of the experts), with stock transformers + peft on fp32 experts.
R=experiments/raw/2026-12-02-avx2-epyc
for S in 128 512; do
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype bf16 --backend cpu --threads 2 --rounds ${ROUNDS:-6} \
    --variants host-only+keep_graph@npu_lora_stream,host-only+keep_graph+fp32@npu_lora_stream,peer+fp32@grouped_mm \
    --no-peers --out $R/engine-dtype-ab-${TAG:-a}-s$S
done
