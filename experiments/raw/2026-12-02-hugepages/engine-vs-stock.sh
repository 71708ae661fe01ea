# Engine step vs stock transformers + peft at the current code (expert weights placed in huge
# pages), one npu-lora bench run per (storage, S): bf16 ours vs stock with fp32 experts (the fair
# peer without native bf16), fp32 ours vs stock fp32 (grouped_mm).
R=experiments/raw/2026-12-02-hugepages
for S in ${SEQS:-128 512}; do
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype bf16 --backend cpu --threads 2 --rounds 5 \
    --variants host-only+keep_graph@npu_lora_stream,peer+fp32@grouped_mm \
    --no-peers --out $R/engine-vs-stock-${TAG:-a}-s$S-bf16
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype fp32 --backend cpu --threads 2 --rounds 5 \
    --variants host-only+keep_graph@npu_lora_stream \
    --peer-impls grouped_mm --out $R/engine-vs-stock-${TAG:-a}-s$S-fp32
done
