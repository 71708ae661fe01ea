# engine step with the final code and the fixed harness (copy samples on buffers allocated once)
R=experiments/raw/2026-12-02-zen4
for c in "512 fp32" "128 bf16" "512 bf16" "128 fp32"; do set -- $c
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $1 --host-dtype $2 --backend cpu --threads 2 --rounds 3 --variants host-only+keep_graph@npu_lora_stream --peer-impls grouped_mm --out $R/engine3-s$1-$2
done
