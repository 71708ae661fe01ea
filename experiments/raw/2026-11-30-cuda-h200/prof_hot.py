import sys, time, warnings, torch
warnings.filterwarnings("ignore")
from npu_lora.api.v1alpha1 import MoEFinetuneSpec
from npu_lora.engine import build_engine
backend = sys.argv[1]; S = int(sys.argv[2]); threads = int(sys.argv[3]); placement = sys.argv[4]
torch.set_num_threads(threads)
spec = MoEFinetuneSpec.model_validate({
    "model": {"preset": "qwen3-30b-a3b", "layers": 2},
    "data": {"path": "example:jsonl-mini"},
    "moe": {"placement": placement, "warmupSteps": 0, "keepGraph": True, "hostDtype": "bfloat16"},
    "training": {"seqLen": S, "batchSize": 1, "steps": 10},
})
eng = build_engine(spec, backend=backend)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 150000, (1, S), generator=g)
labels = torch.full_like(ids, -100); labels[:, -32:] = ids[:, -32:]
batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
eng.forward_backward(batch)  # routing counts
eng.select_hot_experts(0)
for m in eng.mlps: print("hot", m.hot.num_hot if m.hot else None, flush=True)
for _ in range(2): eng.forward_backward(batch)
from torch.profiler import profile, ProfilerActivity
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if backend == "cuda" else [])
with profile(activities=acts, record_shapes=True) as prof:
    for _ in range(2):
        p = eng.forward_backward(batch)
print(p)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=40))
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=30, max_shapes_column_width=70))
