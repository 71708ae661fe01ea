import sys, time, statistics as st, torch
from npu_lora.bench import harness as h
from npu_lora.bench.harness import BenchConfig, VariantRunner, Variant, _build_engine, make_batches
from npu_lora.moe.experts import register
register()
S=int(sys.argv[1])
torch.set_num_threads(2)
cfg=BenchConfig(preset="qwen3-30b-a3b", layers=2, seq_len=S, host_dtype="bfloat16", backend="cpu", threads=2, out="/tmp/prof/out")
eng=_build_engine(cfg, False, lambda s: None)
b=make_batches(1,batch=1,seq_len=S,vocab=int(eng.config.vocab_size),answer_tokens=8,seed=0)[0]
r=VariantRunner(eng,cfg,None)
class Zero(torch.nn.Module):
    def __init__(self, block, dtype): super().__init__()
    def forward(self, x): return x*0
orig=h._CastBlock
vs=[Variant.parse("host-only+keep_graph@npu_lora_stream"), Variant.parse("host-only+keep_graph+torch_head@npu_lora_stream"), Variant.parse("peer@grouped_mm")]
res={v.name:[] for v in vs}; res["peer-nomoe"]=[]; attn={v.name:[] for v in vs[:2]}
def run(v, nomoe=False):
    r.apply(v)
    h._CastBlock = Zero if nomoe else orig
    rec=r.step(v,b)
    h._CastBlock = orig
    return rec
for v in vs: run(v)
run(vs[2], True)
order=[(v,False) for v in vs]+[(vs[2],True)]
for rnd in range(6):
    for v,nm in (order if rnd%2==0 else order[::-1]):
        rec=run(v,nm)
        res["peer-nomoe" if nm else v.name].append(rec["step_s"])
        if not v.is_peer: attn[v.name].append(rec["attn_head_s"])
print(S, {k:"%.3f"%st.median(x) for k,x in res.items()}, {k:"attn+head %.3f"%st.median(x) for k,x in attn.items()})
