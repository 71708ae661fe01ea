# Engine step vs stock transformers + peft with the 4 x 5 AVX2 axpy tile; the stock peer both on
# eager attention (as the engine's models are built) and on transformers' default sdpa.
# One npu-lora bench run per (storage, S): bf16 ours vs stock fp32 experts (peer+fp32, the fair
# peer without native bf16), fp32 ours vs stock fp32.
R=experiments/raw/2026-12-03-axpy-tile
for S in ${SEQS:-512 128}; do
  for DT in ${DTYPES:-fp32 bf16}; do
    if [ $DT = bf16 ]; then P=peer+fp32; else P=peer; fi
    npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype $DT --backend cpu --threads 2 --rounds ${ROUNDS:-5} \
      --variants host-only+keep_graph@npu_lora_stream,$P@grouped_mm,$P+sdpa@grouped_mm \
      --no-peers --out $R/engine-vs-stock-${TAG:-a}-s$S-$DT
  done
done
