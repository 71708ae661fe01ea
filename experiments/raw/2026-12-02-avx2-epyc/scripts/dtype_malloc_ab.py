"""bf16 vs fp32 expert storage (host-only+keep_graph[+fp32]@npu_lora_stream) in one process, S=512,
with glibc's default allocator settings (arg 0) or mallopt(M_MMAP_THRESHOLD = 1 GiB,
M_TRIM_THRESHOLD = 2 GiB - 1) set first (arg 1). Prints per-variant medians of the step, attn+head
and HostMLP times and the paired per-round ratio fp32 / bf16.
Usage: python dtype_malloc_ab.py <S> <0|1> [rounds]"""

import ctypes
import statistics as st
import sys

import torch

if sys.argv[2] == "1":
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    print("mallopt", libc.mallopt(M_MMAP_THRESHOLD, 1 << 30), libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
from npu_lora.bench.harness import BenchConfig, Variant, VariantRunner, _build_engine, make_batches
from npu_lora.moe.experts import register

register()
S, rounds = int(sys.argv[1]), int(sys.argv[3]) if len(sys.argv) > 3 else 8
torch.set_num_threads(2)
cfg = BenchConfig(preset="qwen3-30b-a3b", layers=2, seq_len=S, host_dtype="bfloat16", backend="cpu", threads=2)
eng = _build_engine(cfg, False, lambda s: None)
b = make_batches(1, batch=1, seq_len=S, vocab=int(eng.config.vocab_size), answer_tokens=8, seed=0)[0]
r = VariantRunner(eng, cfg, None)
vs = [Variant.parse("host-only+keep_graph@npu_lora_stream"), Variant.parse("host-only+keep_graph+fp32@npu_lora_stream")]
for v in vs:
    r.apply(v)
    r.step(v, b)
res = {v.name: {"step_s": [], "attn_head_s": [], "host_fwd_s": [], "host_bwd_s": []} for v in vs}
for rnd in range(rounds):
    for v in vs if rnd % 2 == 0 else vs[::-1]:
        r.apply(v)
        rec = r.step(v, b)
        for k in res[v.name]:
            res[v.name][k].append(rec[k])
a, f = (res[v.name]["step_s"] for v in vs)
ratios = [y / x for x, y in zip(a, f)]
for v in vs:
    print(sys.argv[2], v.name, {k: "%.3f" % st.median(x) for k, x in res[v.name].items()})
print(sys.argv[2], "fp32/bf16 step ratio %.3f" % st.median(ratios), ["%.2f" % x for x in ratios])
