"""Micro graphs: reductions over the Qwen3 vocabulary (151,936 = 2^7 * 1187) on RNGD."""

import dataclasses

import torch
from torch import nn

from npu_lora.device.graphs import DeviceGraph

V = 151936


class F(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, z):
        return self.fn(z)


def _sum2(z):
    return z.view(z.shape[0], 1187, 128).sum(-1).sum(-1)


def _sum_mm2(z):
    a = torch.matmul(z.view(z.shape[0], 1187, 128), torch.ones(128, 1, dtype=z.dtype))
    return torch.matmul(a.squeeze(-1), torch.ones(1187, 1, dtype=z.dtype)).squeeze(-1)


def _sum_pad(z):
    zp = torch.cat([z, z.new_zeros(z.shape[0], 152064 - V)], dim=-1)
    return zp.view(z.shape[0], 1188, 128).sum(-1).sum(-1)


GRAPHS = {
    "v_sum": lambda z: z.sum(-1),
    "v_amax": lambda z: z.amax(-1),
    "v_sum_2stage": _sum2,
    "v_sum_mm_2stage": _sum_mm2,
    "v_sum_pad": _sum_pad,
    "v_exp_sum_2stage": lambda z: _sum2(torch.exp(z)),
}


def device_graphs(widths="qwen3-30b-a3b", seq_len=128, buckets=None, dtype=torch.float32):
    z = torch.randn(32, V, dtype=torch.float32)
    out = []
    for name, fn in GRAPHS.items():
        out.append(DeviceGraph(name, F(fn), (z,), (), None))
    return out
