import sys, time, torch, statistics as st
import torch.nn.functional as F
from npu_lora.device.ops import eager_attention
torch.set_num_threads(2); torch.manual_seed(0)
S=int(sys.argv[1]); dt=torch.float32 if sys.argv[2]=="fp32" else torch.bfloat16
B,H,K,d=1,32,4,128
q=torch.randn(B,H,S,d,dtype=dt,requires_grad=True); k=torch.randn(B,K,S,d,dtype=dt,requires_grad=True); v=torch.randn(B,K,S,d,dtype=dt,requires_grad=True)
mask=torch.full((S,S),float("-inf")).triu(1)[None,None].to(dt)
do=torch.randn(B,S,H,d,dtype=dt)
def eager():
    o,_=eager_attention(q,k,v,mask,d**-0.5); o.backward(do)
def sdpa_causal():
    o=F.scaled_dot_product_attention(q,k,v,is_causal=True,scale=d**-0.5,enable_gqa=True).transpose(1,2); o.backward(do)
def sdpa_mask():
    o=F.scaled_dot_product_attention(q,k,v,attn_mask=mask,scale=d**-0.5,enable_gqa=True).transpose(1,2); o.backward(do)
fs=dict(eager=eager,sdpa_causal=sdpa_causal,sdpa_mask=sdpa_mask)
# correctness
outs={}
for n,f in fs.items():
    for t in (q,k,v): t.grad=None
    f(); outs[n]=[t.grad.clone() for t in (q,k,v)]
for n in fs:
    print(n, [float((a-b).abs().max()) for a,b in zip(outs[n],outs["eager"])])
ts={n:[] for n in fs}
for r in range(7):
    order=list(fs) if r%2==0 else list(fs)[::-1]
    for n in order:
        t=time.perf_counter(); fs[n](); ts[n].append(time.perf_counter()-t)
for n in fs: print(n, "median %.1f ms"%(1e3*st.median(ts[n])), ["%.0f"%(1e3*x) for x in ts[n]])
