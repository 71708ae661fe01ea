# engine step, host-only + keep_graph with npu_lora_stream (LM head on the streaming kernel, and
# +torch_head: the head on torch's mm, as before) vs stock transformers + peft (grouped_mm),
# one npu-lora bench run per (S, hostDtype); rounds alternate the variants' order.
# Usage: bash engine.sh <tag>   (writes engine-<tag>-s<S>-<dtype>/)
R=experiments/raw/2026-12-02-stream-head
for c in "128 bf16" "512 bf16" "128 fp32" "512 fp32"; do set -- $c
  npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len $1 --host-dtype $2 --backend cpu --threads 2 --rounds 5 \
    --variants host-only+keep_graph@npu_lora_stream,host-only+keep_graph+torch_head@npu_lora_stream \
    --peer-impls grouped_mm --out $R/engine-${TAG:-a}-s$1-$2
done
