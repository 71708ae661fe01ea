"""One process: npu_lora_stream forward + backward of one Qwen3-30B-A3B MoE layer (E=128, top-8,
H=2048, I=768), 2 warm-up + 6 timed calls; prints medians of wall ms and page faults per call.
Run alternately with NPU_LORA_STREAM_POOL_MB=0 (every block freed = no cache) and the default."""
import os, resource, statistics, sys, time
import torch
from npu_lora.moe.stream import stream_experts
torch.manual_seed(0); torch.set_num_threads(2)
E, H, I, K = 128, 2048, 768, 8
T = int(sys.argv[1]); dt = getattr(torch, sys.argv[2])
gu = (torch.randn(E, 2 * I, H) * 0.02).to(dt); dn = (torch.randn(E, H, I) * 0.02).to(dt)
x = torch.randn(T, H, dtype=dt, requires_grad=True)
w, idx = torch.topk(torch.randn(T, E).softmax(-1), K); w = w.requires_grad_()
rows = []
for i in range(8):
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
    out = stream_experts(x, idx, w, gu, dn)
    t1 = time.perf_counter(); r1 = resource.getrusage(resource.RUSAGE_SELF)
    out.backward(torch.ones_like(out))
    t2 = time.perf_counter(); r2 = resource.getrusage(resource.RUSAGE_SELF)
    x.grad = None; w.grad = None; del out
    if i >= 2:
        rows.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, r1.ru_minflt - r0.ru_minflt, r2.ru_minflt - r1.ru_minflt))
med = [statistics.median(c) for c in zip(*rows)]
print(f"T={T} {sys.argv[2]} pool_mb={os.environ.get('NPU_LORA_STREAM_POOL_MB', 'default')}: "
      f"fwd {med[0]:.1f} ms bwd {med[1]:.1f} ms | faults/call fwd {med[2]:.0f} bwd {med[3]:.0f}")
