import time, torch, statistics as st, sys
from npu_lora.bench.harness import BenchConfig, _build_engine
from npu_lora.device.graphs import causal_mask, positions
from npu_lora.models.build import decoder_layers
from npu_lora.moe.experts import register
register()
torch.set_num_threads(2)
S=int(sys.argv[1])
cfg=BenchConfig(preset="qwen3-30b-a3b", layers=1, seq_len=S, host_dtype="bfloat16", backend="cpu", threads=2, out="/tmp/prof/o2")
eng=_build_engine(cfg, False, print)
blk=eng.attn[0]
layer=decoder_layers(eng.model)[0]
inner=eng.lm.model
D=2048
g=torch.Generator().manual_seed(0)
h0=torch.randn(1,S,D,generator=g); moe=torch.zeros(1,S,D)
am=torch.ones(1,S,dtype=torch.long)
import inspect
print(inspect.signature(causal_mask), inspect.signature(positions))
mask=causal_mask(am,1,S,torch.float32); pos=positions(1,S)
def ours():
    h=h0.clone().requires_grad_()
    hm,x=blk(h,moe,pos,mask)
    (hm.sum()+x.sum()).backward()
def stock():
    h=h0.clone().requires_grad_()
    cos,sin=inner.rotary_emb(h,pos.long())
    r=h
    a,_=layer.self_attn(hidden_states=layer.input_layernorm(h),position_embeddings=(cos,sin),attention_mask=mask)
    hm=r+a
    x=layer.post_attention_layernorm(hm)
    (hm.sum()+x.sum()).backward()
fs={"ours":ours,"stock":stock}
for f in fs.values(): f()
res={n:[] for n in fs}
for rnd in range(7):
    for n in (list(fs) if rnd%2==0 else list(fs)[::-1]):
        t0=time.perf_counter(); fs[n](); res[n].append(time.perf_counter()-t0)
print(S,{n:"%.1f ms"%(st.median(x)*1e3) for n,x in res.items()})
