import sys, time, ctypes, statistics as st, torch
if sys.argv[3]=="1":
    libc=ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    print("mallopt", libc.mallopt(M_MMAP_THRESHOLD, 1<<30), libc.mallopt(M_TRIM_THRESHOLD, 1<<32 - 1 if False else 2**31-1))
from npu_lora.bench.harness import BenchConfig, VariantRunner, Variant, _build_engine, make_batches
from npu_lora.moe.experts import register
register()
S=int(sys.argv[1]); dt=sys.argv[2]
torch.set_num_threads(2)
cfg=BenchConfig(preset="qwen3-30b-a3b", layers=2, seq_len=S, host_dtype=dt, backend="cpu", threads=2, out="/tmp/prof/out")
eng=_build_engine(cfg, False, lambda s: None)
b=make_batches(1,batch=1,seq_len=S,vocab=int(eng.config.vocab_size),answer_tokens=8,seed=0)[0]
r=VariantRunner(eng,cfg,None)
vs=[Variant.parse("host-only+keep_graph@npu_lora_stream"), Variant.parse("peer@grouped_mm")]
for v in vs: r.apply(v); r.step(v,b)
res={v.name:[] for v in vs}; attn=[]
for rnd in range(8):
    for v in (vs if rnd%2==0 else vs[::-1]):
        r.apply(v); rec=r.step(v,b); res[v.name].append(rec["step_s"])
        if not v.is_peer: attn.append(rec["attn_head_s"])
ratios=[a/p for a,p in zip(*res.values())]
print(sys.argv[3], {k:"%.3f"%st.median(x) for k,x in res.items()}, "attn %.3f"%st.median(attn), "ratio %.3f"%st.median(ratios), ["%.2f"%x for x in ratios])
