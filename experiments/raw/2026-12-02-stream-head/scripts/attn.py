import time, torch, statistics as st
from npu_lora.device.ops import _AttentionCore, repeat_kv
torch.set_num_threads(2)
B,H,KV,S,d=1,32,4,512,128
g=torch.Generator().manual_seed(0)
q=torch.randn(B,H,S,d,generator=g); k=torch.randn(B,KV,S,d,generator=g); v=torch.randn(B,KV,S,d,generator=g)
mask=torch.triu(torch.full((S,S),float("-inf")),1)[None,None]
do=torch.randn(B,H,S,d,generator=g)
sc=d**-0.5
def ours():
    qq,kk_,vv_=[t.clone().requires_grad_() for t in (q,k,v)]
    o=_AttentionCore.apply(qq,kk_,vv_,mask,sc); o.backward(do); return o,qq.grad,kk_.grad,vv_.grad
def stock():
    qq,kk_,vv_=[t.clone().requires_grad_() for t in (q,k,v)]
    kr,vr=repeat_kv(kk_,H//KV),repeat_kv(vv_,H//KV)
    w=torch.matmul(qq,kr.transpose(2,3))*sc + mask
    w=torch.softmax(w,dim=-1,dtype=torch.float32).to(q.dtype)
    o=torch.matmul(w,vr); o.backward(do); return o,qq.grad,kk_.grad,vv_.grad
fs={"ours":ours,"stock":stock}
r0=ours(); r1=stock()
print([ (a-b).abs().max().item() for a,b in zip(r0,r1)])
res={k:[] for k in fs}
for rnd in range(7):
    pass
for rnd in range(7):
    for name in (list(fs) if rnd%2==0 else list(fs)[::-1]):
        t0=time.perf_counter(); fs[name](); res[name].append(time.perf_counter()-t0)
print({n:"%.1f ms"%(st.median(x)*1e3) for n,x in res.items()})
for name in fs:
    with torch.profiler.profile(record_shapes=True) as p: fs[name]()
    ka=sorted(p.key_averages(group_by_input_shape=True), key=lambda e:-e.self_cpu_time_total)
    print(name)
    for e in ka[:14]: print("  %-36s %7.1fms %3d %s"%(e.key[:36], e.self_cpu_time_total/1e3, e.count, str(e.input_shapes)[:70]))
