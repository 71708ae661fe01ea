# The engine's expert weights where npu_lora.moe.pages placed them (huge pages, THP madvise)
# against copies in the allocator's memory (+4k), ONE process per (storage dtype, S).
# (A first version ran bf16, +4k, +fp32, +fp32+4k in one process: killed by the OOM killer at
# 24 GB on this 23.5 GiB machine, so one storage dtype per process.)
R=experiments/raw/2026-12-02-hugepages
for S in ${SEQS:-128 512}; do
  for dt in bf16 fp32; do
    npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $S --host-dtype $dt --backend cpu --threads 2 --rounds ${ROUNDS:-8} \
      --variants host-only+keep_graph@npu_lora_stream,host-only+keep_graph+4k@npu_lora_stream \
      --no-peers --out $R/engine-pages-ab-${TAG:-a}-s$S-$dt
  done
done
