"""Attention-backward formulation variants (scratch, for rngd-check --source)."""
import dataclasses
import os

import torch
from torch import nn

from npu_lora.device.graphs import device_graphs as _dg
from npu_lora.rngd.formulations import softmax_rngd, _repeat_kv

V = os.environ.get("ATTN_VARIANT", "A")


def _rot(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def hand_norm(mod, x, ones_var=False):
    if ones_var:
        ones = torch.ones(x.shape[-1], 1, dtype=x.dtype, device=x.device)
        var = torch.matmul(x * x, ones) * (1.0 / x.shape[-1])
    else:
        var = (x * x).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + mod.variance_epsilon) * mod.weight


def headwise_linear(lin, x, d):
    """peft LoRA Linear (or nn.Linear) applied per head: [B,S,D] -> [B,K,S,d], no transpose."""
    base = getattr(lin, "base_layer", lin)
    W = base.weight
    K = W.shape[0] // d
    xb = x[:, None]
    y = torch.matmul(xb, W.view(K, d, -1).transpose(1, 2))
    if base.bias is not None:
        y = y + base.bias.view(K, 1, d)
    for name in getattr(lin, "active_adapters", []):
        A = lin.lora_A[name].weight
        Bw = lin.lora_B[name].weight
        a = torch.matmul(x, A.t())[:, None]
        y = y + torch.matmul(a, Bw.view(K, d, -1).transpose(1, 2)) * lin.scaling[name]
    return y


class Attn(nn.Module):
    def __init__(self, blk):
        super().__init__()
        self.blk = blk

    def forward(self, h_BSD, moe_BSD, pos_BS, mask_B1SS):
        blk = self.blk
        sa = blk.self_attn
        h = h_BSD + moe_BSD
        cos, sin = blk.rope(pos_BS, h.dtype)
        cos, sin = cos[:, None], sin[:, None]
        x = blk.input_layernorm(h)
        B, S, _ = x.shape
        d = sa.head_dim
        q = sa.q_proj(x).view(B, S, -1, d)
        k = sa.k_proj(x).view(B, S, -1, d)
        v = sa.v_proj(x).view(B, S, -1, d).transpose(1, 2)
        if V in ("Q", "W"):
            v = headwise_linear(sa.v_proj, x, d)
        if V == "A":  # stock norm modules after the transpose
            q = sa.q_norm(q.transpose(1, 2))
            k = sa.k_norm(k.transpose(1, 2))
        elif V == "B":  # after transpose + contiguous
            q = sa.q_norm(q.transpose(1, 2).contiguous())
            k = sa.k_norm(k.transpose(1, 2).contiguous())
            v = v.contiguous()
        elif V == "C":  # hand norm (no casts) after transpose
            q = hand_norm(sa.q_norm, q.transpose(1, 2))
            k = hand_norm(sa.k_norm, k.transpose(1, 2))
        elif V == "D":  # hand norm, matmul-ones variance, after transpose
            q = hand_norm(sa.q_norm, q.transpose(1, 2), True)
            k = hand_norm(sa.k_norm, k.transpose(1, 2), True)
        elif V == "E":  # hand norm, ones variance, before transpose, contiguous after
            q = hand_norm(sa.q_norm, q, True).transpose(1, 2).contiguous()
            k = hand_norm(sa.k_norm, k, True).transpose(1, 2).contiguous()
        elif V == "W":  # q, k per head too: no activation transpose before the scores
            q = sa.q_norm(headwise_linear(sa.q_proj, x, d))
            k = sa.k_norm(headwise_linear(sa.k_proj, x, d))
        elif V in ("S", "H", "N", "Q"):  # stock order (norm then transpose), stock norm modules
            q = sa.q_norm(q).transpose(1, 2)
            k = sa.k_norm(k).transpose(1, 2)
        q = q * cos + _rot(q) * sin
        k = k * cos + _rot(k) * sin
        n_rep = sa.num_key_value_groups
        if V == "N":
            K = k.shape[1]
            qg = q.reshape(B, K, n_rep * S, d)
            w = torch.matmul(qg, k.transpose(2, 3)) * sa.scaling
            w = (w.view(B, K, n_rep, S, S) + mask_B1SS[:, :, None]).view(B, K, n_rep * S, S)
            w = softmax_rngd(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, v).view(B, -1, S, d).transpose(1, 2).reshape(B, S, -1)
        else:
            kk = _repeat_kv(k, n_rep)
            vv = _repeat_kv(v, n_rep)
            w = torch.matmul(q, kk.transpose(2, 3)) * sa.scaling + mask_B1SS
            w = softmax_rngd(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, vv).transpose(1, 2).reshape(B, S, -1)
        a = sa.o_proj(o)
        h_mid = h + a
        return h_mid, blk.post_attention_layernorm(h_mid)


def device_graphs(widths="tiny", seq_len=128, buckets=None, dtype=torch.float32):
    gs = {g.name: g for g in _dg(widths, seq_len, buckets, dtype)}
    g = gs["attention"]
    m = Attn(g.module)
    if V == "H":
        m.blk.self_attn.v_proj.scaling["default"] = 1.0
        m.blk.self_attn.q_proj.scaling["default"] = 1.0
    with torch.no_grad():
        out = m(*g.example_inputs)
        ref = g.reference(*g.example_inputs)
        err = max((a - b).abs().max().item() for a, b in zip(out, ref))
    print(f"variant {V}: max |out - stock| = {err:.3g}", flush=True)
    return [dataclasses.replace(g, module=m)]
