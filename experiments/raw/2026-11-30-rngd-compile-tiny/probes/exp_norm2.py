"""Isolate the attention-backward whole-graph failure: per-head RMSNorm (q_norm/k_norm) + transpose."""
import os, sys, time, json
os.environ["XDG_CACHE_HOME"] = "/tmp/rngd/cache-norm2"; os.environ["TMPDIR"] = "/tmp/rngd/scratch/tmp"
import torch, furiosa.torch as ft
from types import SimpleNamespace
from npu_lora.rngd.inventory import capture

class Norm(torch.nn.Module):
    def __init__(self, d, square):
        super().__init__(); self.weight = torch.nn.Parameter(torch.ones(d)); self.square = square
    def forward(self, x):
        x32 = x.float()
        v = (x32 * x32 if self.square == "mul" else x32.pow(2)).mean(-1, keepdim=True)
        return self.weight * (x32 * torch.rsqrt(v + 1e-6)).to(x.dtype)

class Mini(torch.nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.variant = variant
        sq = "mul" if "mul" in variant else "pow"
        self.q_norm, self.k_norm = Norm(16, sq), Norm(16, sq)
        self.q_proj = torch.nn.Linear(64, 64, bias=False); self.k_proj = torch.nn.Linear(64, 32, bias=False)
        for p in (self.q_norm.weight, self.k_norm.weight, self.q_proj.weight, self.k_proj.weight): p.requires_grad_(False)
    def forward(self, x):      # x [1,S,64] -> q [1,S,4,16], k [1,S,2,16]
        q = self.q_proj(x).view(1, 128, 4, 16); k = self.k_proj(x).view(1, 128, 2, 16)
        if "tfirst" in self.variant:     # transpose, then norm (same math)
            qn, kn = self.q_norm(q.transpose(1, 2)), self.k_norm(k.transpose(1, 2))
        else:                            # Qwen3: norm, then transpose
            qn, kn = self.q_norm(q).transpose(1, 2), self.k_norm(k).transpose(1, 2)
        if "contig" in self.variant:
            qn, kn = qn.contiguous(), kn.contiguous()
        kr = kn[:, :, None].expand(1, 2, 2, 128, 16).reshape(1, 4, 128, 16)
        return qn @ kr.transpose(-1, -2)

for variant in sys.argv[1].split(","):
    torch.manual_seed(0)
    g = SimpleNamespace(name=variant, module=Mini(variant), example_inputs=(torch.randn(1, 128, 64),), trainable=[0])
    cap = capture(g)
    t = time.time()
    try:
        ft.CompileModule.from_module(cap.bw, cap.bw_args); ok, err = True, ""
    except Exception as e:
        s = str(e); i = s.find("Caused by"); ok, err = False, " ".join(s[i:i+700].split())[:600]
    print(json.dumps({"variant": variant, "ok": ok, "seconds": round(time.time() - t, 1), "err": err}), flush=True)
