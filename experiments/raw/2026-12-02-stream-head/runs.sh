# Final code (a4009dd): engine runs d and e, the head A/B, the kernels rotation (fp32 and bf16).
R=experiments/raw/2026-12-02-stream-head
for t in d e; do TAG=$t bash $R/engine.sh > $R/engine-$t.log 2>&1; done
python experiments/stream-kernel/head_ab.py --rows 8 16 32 --dtypes float32 bfloat16 --rounds 7 --threads 2 --out $R/head-ab.json > $R/head-ab.txt 2>&1
python -m npu_lora.bench.kernels --tokens 128 512 --dtypes float32 bfloat16 --impls copy grouped_mm npu_lora_stream --threads 2 --rounds 6 --out $R/kernels > $R/kernels.txt 2>&1
