"""Attention core with a FlashAttention-style explicit backward (scratch factory, rngd-check).

The Qwen-width attention backward failed to lower a kernel that fuses the softmax backward's row
sum ((g * y) @ ones) with dP = dO @ V^T. This core's backward uses rowsum(dP * P) = rowsum(dO * O)
(a row sum over the head dim, computed as a matmul with ones), so no such fusion exists:

    dV = P^T dO    dP = dO V^T    D = (dO * O) @ ones[d, 1]    dS = P * (dP - D)
    dQ = dS K * scaling    dK = dS^T Q * scaling    (GQA: dK, dV summed over the query groups)
"""

import dataclasses

import torch

import npu_lora.device.graphs as graphs
from npu_lora.device.ops import repeat_kv


class _Core(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scaling):
        n_rep = q.shape[1] // k.shape[1]
        kk, vv = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        s = torch.matmul(q, kk.transpose(2, 3)) * scaling
        if mask is not None:
            s = s + mask
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(p, vv)
        ctx.save_for_backward(q, kk, vv, p, o)
        ctx.scaling, ctx.n_rep = scaling, n_rep
        return o

    @staticmethod
    def backward(ctx, do):
        q, kk, vv, p, o = ctx.saved_tensors
        B, H, S, d = q.shape
        K, r = H // ctx.n_rep, ctx.n_rep
        dv_full = torch.matmul(p.transpose(2, 3), do)
        dp = torch.matmul(do, vv.transpose(2, 3))
        ones = torch.ones(d, 1, dtype=do.dtype, device=do.device)
        D = torch.matmul(do * o, ones)
        ds = p * (dp - D)
        dq = torch.matmul(ds, kk) * ctx.scaling
        dk_full = torch.matmul(ds.transpose(2, 3), q) * ctx.scaling
        dk = dk_full.view(B, K, r, S, d).sum(2)
        dv = dv_full.view(B, K, r, S, d).sum(2)
        return dq, dk, dv, None, None


def fa_attention(q, k, v, mask, scaling):
    o = _Core.apply(q, k, v, mask, scaling)
    return o.transpose(1, 2).contiguous(), None


def device_graphs(widths="qwen3-30b-a3b", seq_len=128, buckets=None, dtype=torch.float32):
    gs = {g.name: g for g in graphs.device_graphs(widths, seq_len, buckets, dtype)}
    g = gs["attention"]
    ins = [t.clone().requires_grad_(i in g.grad_inputs) for i, t in enumerate(g.example_inputs)]
    ref = g.module(*ins)
    gref = torch.autograd.grad(sum(x.sum() for x in ref), [ins[i] for i in g.grad_inputs])
    graphs.eager_attention = fa_attention  # DeviceAttentionBlock.attend looks it up here
    ins2 = [t.detach().clone().requires_grad_(i in g.grad_inputs) for i, t in enumerate(ins)]
    out = g.module(*ins2)
    gout = torch.autograd.grad(sum(x.sum() for x in out), [ins2[i] for i in g.grad_inputs])
    err_o = max((a - b).abs().max().item() for a, b in zip(out, ref))
    err_g = max((a - b).abs().max().item() / (b.abs().max().item() + 1e-12) for a, b in zip(gout, gref))
    print(f"fa core: max|out diff| {err_o:.3g}, max rel grad diff {err_g:.3g}", flush=True)
    return [dataclasses.replace(g, name="attention_fa")]
