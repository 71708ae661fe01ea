"""One process, one MoE layer at Qwen3-30B-A3B widths (E=128, top-8, H=2048, I=768), the
npu_lora_stream kernel: expert weights in torch's allocator memory ("4k") against the same
values relocated by npu_lora.moe.pages ("thp"), alternating order every round, medians.

usage: python kernel_pages_ab.py {fp32|bf16} T rounds threads
"""

import statistics
import sys
import time

import torch
from npu_lora.bench.kernels import _inputs, _module
from npu_lora.bench.limits import CopyProbe
from npu_lora.machine import cpu_capabilities, machine_facts
from npu_lora.moe import experts, pages, stream

dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[1]]
T, rounds, threads = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
stream.register()
experts.register()
m, cfg = _module(2048, 768, 128, 8, dtype, False, 0)
cfg._experts_implementation = "npu_lora_stream"
x0, idx, w, gy, hit = _inputs(T, 2048, 128, 8, dtype, 0)
facts = machine_facts()
print("cpu", facts["cpu_model"], "|", facts["cpu_flags"], "| thp", cpu_capabilities()["thp"])
print("torch", torch.__version__, "threads", threads, "backend", stream.backend())
plain = (m.gate_up_proj.data, m.down_proj.data)
placed = tuple(pages.relocate(t) for t in plain)
assert all(torch.equal(a, b) for a, b in zip(plain, placed))
print("huge bytes: plain", pages.resident_huge_bytes(plain), "placed", pages.resident_huge_bytes(placed))
hit_bytes = hit * sum(t[0].numel() * t.element_size() for t in plain)
probe = CopyProbe(hit_bytes // 8)
res = {"4k": [], "thp": [], "copy": []}
for rnd in range(rounds + 1):  # round 0: warm-up
    order = ["4k", "thp"] if rnd % 2 == 0 else ["thp", "4k"]
    for k in order:
        m.gate_up_proj.data, m.down_proj.data = plain if k == "4k" else placed
        x = x0.clone().requires_grad_(True)
        t0 = time.perf_counter()
        y = m(x, idx, w)
        t1 = time.perf_counter()
        y.backward(gy)
        t2 = time.perf_counter()
        if rnd:
            res[k].append((t1 - t0, t2 - t1))
    if rnd:
        res["copy"].append(probe.measure(3).copy_gbs)
print(f"T={T} {sys.argv[1]} hit experts {hit} hit bytes {hit_bytes / 1e9:.3f} GB")
for k in ("4k", "thp"):
    f = statistics.median(a for a, _ in res[k])
    b = statistics.median(b for _, b in res[k])
    print(f"{k:4s} fwd {1e3 * f:7.1f} ms ({hit_bytes / f / 1e9:5.2f} GB/s) bwd {1e3 * b:7.1f} ms"
          f" ({hit_bytes / b / 1e9:5.2f} GB/s)  raw fwd {[round(1e3 * a, 1) for a, _ in res[k]]}"
          f" bwd {[round(1e3 * b, 1) for _, b in res[k]]}")
rf = [a[0] / b[0] for a, b in zip(res["4k"], res["thp"])]
rb = [a[1] / b[1] for a, b in zip(res["4k"], res["thp"])]
print(f"4k/thp per round: fwd median {statistics.median(rf):.3f} {[round(r, 3) for r in rf]}")
print(f"                  bwd median {statistics.median(rb):.3f} {[round(r, 3) for r in rb]}")
print(f"copy GB/s median {statistics.median(res['copy']):.1f} {[round(c, 1) for c in res['copy']]}")
