"""Head formulations at Qwen3-30B-A3B widths (scratch factory for `rngd-check --source`).

HEAD_VARIANT=mm: the row sums over the vocabulary (151,936) as matmuls: sum(exp(z - m)) as
exp(z - m) @ ones[V, 1], and the label logit z[label] as z[.., None, :] @ onehot[.., :, None],
instead of the fused mul+reduce kernel RNGD's compiler fails to lower at this width.
"""

import dataclasses
import os

import torch
from torch import nn

from npu_lora.device.graphs import device_graphs as _dg

V = os.environ.get("HEAD_VARIANT", "mm")


def _apply_cfg():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "2026-11-30-rngd-attention-split" / "split.py"
    spec = importlib.util.spec_from_file_location("_split", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod._apply_cfg()


def ce_gather(hn_BND, lm_head, z_BNV, labels, weights):
    """lse over V as before (ops.logsumexp_rngd); the label logit as hn . W[label] over D."""
    from npu_lora.device.ops import logsumexp_rngd

    z = z_BNV.float()
    w_BND = torch.nn.functional.embedding(labels, lm_head.weight)
    picked = (hn_BND * w_BND).sum(-1).float()
    ce = logsumexp_rngd(z, dim=-1) - picked
    return (ce * weights.float()).sum()


class HeadGather(nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, h_BSD, moe_BSD, sel_BNS, labels_BN, w_BN):
        hd = self.head
        h = h_BSD + moe_BSD
        hn = hd.norm(torch.bmm(sel_BNS.to(h.dtype), h))
        z = hd.lm_head(hn)
        return ce_gather(hn, hd.lm_head, z, labels_BN, w_BN)


def ce_mm(logits, labels, weights):
    z = logits.float()
    Vn = z.shape[-1]
    vocab = torch.arange(Vn, dtype=torch.int32, device=z.device)
    onehot = (vocab == labels[..., None]).to(z.dtype)
    m = z.detach().amax(dim=-1, keepdim=True)
    ones = torch.ones(Vn, 1, dtype=z.dtype, device=z.device)
    s = torch.matmul(torch.exp(z - m), ones)  # [.., 1]
    lse = (m + torch.log(s)).squeeze(-1)
    picked = torch.matmul(z.unsqueeze(-2), onehot.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    ce = lse - picked
    return (ce * weights.float()).sum()


class HeadMM(nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, h_BSD, moe_BSD, sel_BNS, labels_BN, w_BN):
        z = self.head.logits(h_BSD, moe_BSD, sel_BNS)
        return ce_mm(z, labels_BN, w_BN)


def device_graphs(widths="qwen3-30b-a3b", seq_len=128, buckets=None, dtype=torch.float32):
    _apply_cfg()
    g = {x.name: x for x in _dg(widths, seq_len, buckets, dtype)}["head"]
    m = {"mm": HeadMM, "gather": HeadGather, "stock": lambda h: h}[V](g.module)
    with torch.no_grad():
        a, b = m(*g.example_inputs), g.module(*g.example_inputs)
    print(f"head {V}: loss {a.item():.6f} vs graphs.py {b.item():.6f}", flush=True)
    return [dataclasses.replace(g, name=f"head_{V}", module=m)]
