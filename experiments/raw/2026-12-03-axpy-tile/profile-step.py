import sys, time, torch
from npu_lora.bench.harness import BenchConfig, VariantRunner, Variant, _build_engine, make_batches
from npu_lora.moe.experts import register
register()
S=int(sys.argv[1]); dt=sys.argv[2]
torch.set_num_threads(2)
cfg=BenchConfig(preset="qwen3-30b-a3b", layers=2, seq_len=S, host_dtype={"fp32":"float32","bf16":"bfloat16"}[dt], backend="cpu", threads=2, rounds=1, variants=["host-only+keep_graph@npu_lora_stream"], peer_impls=["grouped_mm"], out="/tmp/prof/out")
eng=_build_engine(cfg, False, print)
b=make_batches(1,batch=1,seq_len=S,vocab=int(eng.config.vocab_size),answer_tokens=8,seed=0)[0]
r=VariantRunner(eng,cfg,None)
vs=[Variant.parse("host-only+keep_graph@npu_lora_stream"), Variant.parse("peer@grouped_mm")]
print(eng.model.dtype if hasattr(eng.model,'dtype') else None)
for v in vs:
    r.apply(v); r.step(v,b); r.step(v,b)
for v in vs:
    r.apply(v)
    ts=[]
    for i in range(3):
        t=time.perf_counter(); rec=r.step(v,b); ts.append(time.perf_counter()-t)
    print(v.name, ["%.3f"%x for x in ts], {k:round(rec[k],3) for k in rec if k.endswith('_s') and isinstance(rec[k],float)})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as p:
        r.step(v,b)
    ka=sorted(p.key_averages(group_by_input_shape=True), key=lambda e:-e.self_cpu_time_total)
    for e in ka[:22]: print("%-32s %8.1fms %4d %s"%(e.key[:32], e.self_cpu_time_total/1e3, e.count, str(e.input_shapes)[:80]))
