import sys, time, torch, statistics as st
import torch.nn.functional as F
from npu_lora.bench.harness import BenchConfig, VariantRunner, Variant, _build_engine, make_batches
from npu_lora.moe.experts import register
import npu_lora.device.graphs as G
from npu_lora.device import ops
register()
S=int(sys.argv[1]); dt={"fp32":"float32","bf16":"bfloat16"}[sys.argv[2]]; R=int(sys.argv[3])
torch.set_num_threads(2)
cfg=BenchConfig(preset="qwen3-30b-a3b", layers=2, seq_len=S, host_dtype=dt, backend="cpu", threads=2, rounds=1, variants=["host-only+keep_graph@npu_lora_stream"], peer_impls=["grouped_mm"], out="/tmp/attn/out")
eng=_build_engine(cfg, False, print)
b=make_batches(1,batch=1,seq_len=S,vocab=int(eng.config.vocab_size),answer_tokens=8,seed=0)[0]
r=VariantRunner(eng,cfg,None)
def sdpa_attn(q,k,v,mask,scaling):
    o=F.scaled_dot_product_attention(q,k,v,attn_mask=mask,scale=scaling,enable_gqa=True)
    return o.transpose(1,2).contiguous(), None
ours=Variant.parse("host-only+keep_graph@npu_lora_stream"); peer=Variant.parse("peer+fp32@grouped_mm" if dt=="bfloat16" else "peer@grouped_mm")
def run(name):
    if name.startswith("ours"):
        G.eager_attention = sdpa_attn if name.endswith("sdpa") else ops.eager_attention
        r.apply(ours); rec=r.step(ours,b)
    else:
        eng.model.config._attn_implementation = "sdpa" if name.endswith("sdpa") else "eager"
        for m in eng.model.modules():
            if hasattr(m,"config") and hasattr(m.config,"_attn_implementation"): m.config._attn_implementation=eng.model.config._attn_implementation
        r.apply(peer); rec=r.step(peer,b)
    return rec
names=["ours-eager","ours-sdpa","peer-eager","peer-sdpa"]
for n in names: print(n, "warm loss", run(n)["loss"])
ts={n:[] for n in names}
for i in range(R):
    for n in (names if i%2==0 else names[::-1]):
        rec=run(n); ts[n].append(rec["step_s"])
for n in names: print(n, "median %.3f"%st.median(ts[n]), ["%.3f"%x for x in ts[n]])
for a,p in (("ours-eager","peer-eager"),("ours-sdpa","peer-sdpa"),("ours-sdpa","peer-eager")):
    print(a,"/",p, "paired median %.3f"%st.median([x/y for x,y in zip(ts[a],ts[p])]))
