# engine step on the AVX2 EPYC, fp32 storage: ours (stream kernel, head on the stream kernel and
# +torch_head) vs stock transformers + peft (grouped_mm, fp32) in one npu-lora bench run per S.
R=experiments/raw/2026-12-02-avx2-epyc
for S in 128 512; do
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype fp32 --backend cpu --threads 2 --rounds 5 \
    --variants host-only+keep_graph@npu_lora_stream,host-only+keep_graph+torch_head@npu_lora_stream \
    --peer-impls grouped_mm --out $R/engine-${TAG:-a}-s$S-fp32
done
