"""Attention block split into device graphs (scratch factory for `rngd-check --source`).

Parts of graphs.py's DeviceAttentionBlock (same modules, same arithmetic):
  attn_project(h, moe, pos)   -> (hres, q_BHSd, k_BKSd, v_BKSd)   norms, q/k/v (LoRA), rope
  attn_core(q, k, v, mask)    -> o_BSE                            scores, softmax_rngd, @ v
  attn_output(hres, o)        -> (h_mid, x)                       o_proj, residual, post norm
  attn_pre = project + core   -> (hres, o)
  attn_post = core + output   -> (h_mid, x)   inputs (hres, q, k, v, mask)
Env FURIOSA_CFG: comma list of CompilerConfig kwargs (k=v) set globally in the job process.
"""

import dataclasses
import os

import torch
from torch import nn

from npu_lora.device.graphs import _rotate_half, device_graphs as _dg, headwise_linear
from npu_lora.device.ops import eager_attention


def _apply_cfg() -> None:
    spec = os.environ.get("FURIOSA_CFG", "")
    if not spec:
        return
    import furiosa.torch.config as fc

    if spec == "transformers":  # furiosa-torch's own config for Llama-like block compiles
        from furiosa.torch.ext.transformers import CONFIG

        fc.set_compiler_config(CONFIG)
        print("compiler config:", fc.get_compiler_config(), flush=True)
        return
    kw = {}
    for item in spec.split(","):
        k, v = item.split("=")
        kw[k] = {"true": True, "false": False}.get(v.lower(), None)
        if kw[k] is None:
            kw[k] = int(v) if v.isdigit() else (
                getattr(fc.TacticHintConfig, v, None) or getattr(fc.TacticSortingPolicy, v)
            )
    fc.set_compiler_config(fc.CompilerConfig(**kw))
    print("compiler config:", fc.get_compiler_config(), flush=True)


class Project(nn.Module):
    def __init__(self, blk):
        super().__init__()
        self.blk = blk

    def forward(self, h_BSD, moe_BSD, pos_BS):
        blk, sa = self.blk, self.blk.self_attn
        h = h_BSD + moe_BSD
        cos, sin = blk.rope(pos_BS, h.dtype)
        x = blk.input_layernorm(h)
        B, S, _ = x.shape
        d = sa.head_dim
        q = sa.q_norm(sa.q_proj(x).view(B, S, -1, d)).transpose(1, 2)
        k = sa.k_norm(sa.k_proj(x).view(B, S, -1, d)).transpose(1, 2)
        v = headwise_linear(sa.v_proj, x, d)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return h, q, k, v


class ProjLinear(nn.Module):
    """Residual add, input norm, q/k/v projections (LoRA): q_BSHd, k_BSKd raw, v per head."""

    def __init__(self, blk):
        super().__init__()
        self.blk = blk

    def forward(self, h_BSD, moe_BSD):
        blk, sa = self.blk, self.blk.self_attn
        h = h_BSD + moe_BSD
        x = blk.input_layernorm(h)
        B, S, _ = x.shape
        d = sa.head_dim
        q = sa.q_proj(x).view(B, S, -1, d)
        k = sa.k_proj(x).view(B, S, -1, d)
        return h, q, k, headwise_linear(sa.v_proj, x, d)


class ProjRope(nn.Module):
    """q/k norms, head transpose, rope."""

    def __init__(self, blk):
        super().__init__()
        self.blk = blk

    def forward(self, q_BSHd, k_BSKd, pos_BS):
        blk, sa = self.blk, self.blk.self_attn
        cos, sin = blk.rope(pos_BS, q_BSHd.dtype)
        q = sa.q_norm(q_BSHd).transpose(1, 2)
        k = sa.k_norm(k_BSKd).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def rotate_half_matrix(d: int, dtype: torch.dtype) -> torch.Tensor:
    """``R [d, d]`` with ``x @ R == rotate_half(x)`` (entries 0, +1, -1: exact in any dtype)."""
    h = d // 2
    R = torch.zeros(d, d, dtype=dtype)
    R[h:, :h] = -torch.eye(h, dtype=dtype)  # out[:, :h] = -x[:, h:]
    R[:h, h:] = torch.eye(h, dtype=dtype)  # out[:, h:] = x[:, :h]
    return R


class ProjRopeMM(nn.Module):
    """ProjRope with rotate_half as a matmul by a fixed signed permutation (no slice/cat)."""

    def __init__(self, blk, norm: bool = True, rope: bool = True):
        super().__init__()
        self.blk, self.norm, self.rope_on = blk, norm, rope
        d = blk.self_attn.head_dim
        self.register_buffer("R", rotate_half_matrix(d, next(blk.parameters()).dtype))

    def forward(self, q_BSHd, k_BSKd, pos_BS):
        blk, sa = self.blk, self.blk.self_attn
        q, k = q_BSHd, k_BSKd
        if self.norm:
            q, k = sa.q_norm(q), sa.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if not self.rope_on:
            return q, k
        cos, sin = blk.rope(pos_BS, q_BSHd.dtype)
        cos, sin = cos[:, None], sin[:, None]
        return q * cos + torch.matmul(q, self.R) * sin, k * cos + torch.matmul(k, self.R) * sin


class Core(nn.Module):
    def __init__(self, blk):
        super().__init__()
        self.scaling = blk.self_attn.scaling

    def forward(self, q, k, v, mask):
        o, _ = eager_attention(q, k, v, mask, self.scaling)
        B, S = o.shape[:2]
        return o.reshape(B, S, -1)


class Output(nn.Module):
    def __init__(self, blk):
        super().__init__()
        self.blk = blk

    def forward(self, h, o):
        h_mid = h + self.blk.self_attn.o_proj(o)
        return h_mid, self.blk.post_attention_layernorm(h_mid)


class Pre(nn.Module):
    def __init__(self, blk):
        super().__init__()
        self.p, self.c = Project(blk), Core(blk)

    def forward(self, h_BSD, moe_BSD, pos_BS, mask):
        h, q, k, v = self.p(h_BSD, moe_BSD, pos_BS)
        return h, self.c(q, k, v, mask)


class Post(nn.Module):
    def __init__(self, blk):
        super().__init__()
        self.c, self.o = Core(blk), Output(blk)

    def forward(self, h, q, k, v, mask):
        return self.o(h, self.c(q, k, v, mask))


def device_graphs(widths="tiny", seq_len=128, buckets=None, dtype=torch.float32):
    _apply_cfg()
    g = {x.name: x for x in _dg(widths, seq_len, buckets, dtype)}["attention"]
    blk = g.module
    h_in, moe, pos, mask = g.example_inputs
    proj, core, out = Project(blk), Core(blk), Output(blk)
    with torch.no_grad():
        hres, q, k, v = proj(h_in, moe, pos)
        o = core(q, k, v, mask)
        hm, x = out(hres, o)
        ref_hm, ref_x = blk(*g.example_inputs)
        assert torch.equal(hm, ref_hm) and torch.equal(x, ref_x), "split != DeviceAttentionBlock"
        _, q_raw0, k_raw0, _ = ProjLinear(blk)(h_in, moe)
        a = ProjRope(blk)(q_raw0, k_raw0, pos)
        b = ProjRopeMM(blk)(q_raw0, k_raw0, pos)
        assert all(torch.equal(u, w) for u, w in zip(a, b)), "matmul rope != rotate_half rope"
    G = lambda n, m, ins, gi: dataclasses.replace(g, name=n, module=m, example_inputs=ins,  # noqa: E731
                                                 grad_inputs=gi, reference=None)
    with torch.no_grad():
        _, q_raw, k_raw, _ = ProjLinear(blk)(h_in, moe)
    return [
        G("proj_linear", ProjLinear(blk), (h_in, moe), (0, 1)),
        G("proj_rope", ProjRope(blk), (q_raw, k_raw, pos), (0, 1)),
        G("proj_rope_mm", ProjRopeMM(blk), (q_raw, k_raw, pos), (0, 1)),
        G("proj_norm_only", ProjRopeMM(blk, rope=False), (q_raw, k_raw, pos), (0, 1)),
        G("proj_rope_only", ProjRopeMM(blk, norm=False), (q_raw, k_raw, pos), (0, 1)),
        G("attn_project", proj, (h_in, moe, pos), (0, 1)),
        G("attn_core", core, (q, k, v, mask), (0, 1, 2)),
        G("attn_output", out, (hres, o), (0, 1)),
        G("attn_pre", Pre(blk), (h_in, moe, pos, mask), (0, 1)),
        G("attn_post", Post(blk), (hres, q, k, v, mask), (0, 1, 2, 3)),
        G("attention", blk, g.example_inputs, g.grad_inputs),
    ]
