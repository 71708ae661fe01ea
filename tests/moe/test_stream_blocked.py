"""``npu_lora_stream``'s blocked backward (>= 10 rows an expert, T >~ 160 tokens a pass at Qwen3
widths): from ``NPU_LORA_STREAM_BLOCK_TOKENS`` rows an expert (default 10) the AVX512-BF16 axpy
kernel (bf16 weights) packs weight panels into L1 and keeps the out tile in registers. Each out
element still adds the row pairs in row order, one ``vdpbf16ps`` each, so the results are bitwise
the streaming kernel's — tested here against the streaming kernel (the switch off, in a fresh
process: the setting is read once), against the fp32 reference on every path, across thread
counts, and with experts of 0, 1 and many rows, odd T, odd rows per task and column tails. (The
fp32 paths keep the streaming kernels; the fp32 weights case below checks that the switch leaves
them alone.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from npu_lora.moe import kernels, stream

from .moe_blocks import run_block, stock_block

BLOCKED_ISAS = [i for i in ("avx512bf16",) if i in kernels.cpu_isas()]
needs_blocked = pytest.mark.skipif(not BLOCKED_ISAS, reason="CPU without AVX512-BF16")

# T odd; E=6 with expert 0 unhit, expert 1 one row, the others ~100-200 rows; H=136: two whole
# 64-column panels and an 8-column tail; inter=72: z's 72 columns = one panel + tail, 2I=144
T, K, E, H, INTER = 301, 2, 6, 136, 72


def _routing_idx() -> torch.Tensor:
    g = torch.Generator().manual_seed(31)
    idx = torch.stack([2 + torch.randperm(E - 2, generator=g)[:K] for _ in range(T)])
    idx[0, 0] = 1  # expert 1: exactly one row; expert 0: none
    return idx


_SCRIPT = r"""
import sys, torch
from npu_lora.moe import kernels, stream
from npu_lora.moe.experts import build_routing
from tests.moe.test_stream_blocked import _routing_idx, T, K, E, H, INTER
isa, dtype, threads, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
down_split, gu_split = int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
mod = kernels.load()
idx = _routing_idx()
r = build_routing(idx, E)
g = torch.Generator().manual_seed(32)
dt = getattr(torch, dtype)
gu = (torch.randn(E, 2 * INTER, H, generator=g) * 0.1).to(dt)
dn = (torch.randn(E, H, INTER, generator=g) * 0.1).to(dt)
x = torch.randn(T, H, generator=g).to(dt)
gy = torch.randn(T, H, generator=g).to(dt)
wr = torch.rand(T * K, generator=g).contiguous()
offs = stream._offsets(r)
code = kernels.ISA_CODES[isa]
y, h = mod.forward(x, r.token_idx, wr, offs, gu, dn, r.inv_perm, T, K, code, 16, 32)
dx, dw, dh = mod.backward(
    gy, r.token_idx, h, wr, offs, gu, dn, r.inv_perm, T, K, code, down_split, gu_split
)
torch.save({"y": y, "h": h, "dx": dx, "dw": dw, "dh": dh, "counts": list(r.counts)}, out)
"""


# rows per backward task (down, gate/up): odd (67 of 136, 75 of 144: a row paired with zeros),
# one panel of row pairs each (<= 64 pairs); the second: whole tensors (136 = 64 + 4 pairs, 143
# = 64 + 8 pairs, the last one odd), two panels of row pairs (accumulators spilled between them,
# the next panel's rows prefetched across the row blocks)
SPLITS = ((67, 75), (136, 143))


def _run_raw(
    tmp_path: Path,
    isa: str,
    dtype: str,
    threads: int,
    block_tokens: str | None,
    splits: tuple[int, int] = SPLITS[0],
):
    out = tmp_path / f"{isa}-{dtype}-{threads}-{block_tokens}-{splits[0]}.pt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("NPU_LORA_STREAM_BLOCK_TOKENS", None)
    if block_tokens is not None:
        env["NPU_LORA_STREAM_BLOCK_TOKENS"] = block_tokens
    p = subprocess.run(
        [sys.executable, "-c", _SCRIPT, isa, dtype, str(threads), str(out), *map(str, splits)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    return torch.load(out)


@needs_blocked
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("isa", BLOCKED_ISAS or ["avx512bf16"])
def test_blocked_backward_is_bitwise_the_streaming_kernel(tmp_path, isa, dtype, splits):
    """Experts with 0, 1 and ~100-200 rows, odd T, odd rows per task, one or two panels of row
    pairs per task: the blocked backward (default) against the streaming one
    (``NPU_LORA_STREAM_BLOCK_TOKENS=0``), bitwise, on 1 and 2 threads; the forward does not
    switch."""
    stream_ref = _run_raw(tmp_path, isa, dtype, 2, "0", splits)
    counts = stream_ref["counts"]
    assert counts[0] == 0 and counts[1] == 1 and min(counts[2:]) >= 32, counts
    for threads in (1, 2):
        got = _run_raw(tmp_path, isa, dtype, threads, None, splits)
        for name in ("y", "h", "dx", "dw", "dh"):
            assert torch.equal(got[name], stream_ref[name]), (name, threads)
    assert stream_ref["dx"].abs().max() > 0


@needs_blocked
def test_every_expert_blocked_equals_every_expert_streaming(tmp_path):
    """Threshold 1 (single-row experts blocked too) against a threshold above every expert's rows
    (all streaming): the same bits."""
    isa = BLOCKED_ISAS[-1]
    a = _run_raw(tmp_path, isa, "bfloat16", 2, "1")
    b = _run_raw(tmp_path, isa, "bfloat16", 2, "100000")
    for name in ("dx", "dw", "dh"):
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(params=["torch", *kernels.cpu_isas()])
def path(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setattr(kernels, "isa", lambda: None)
    else:
        monkeypatch.setenv("NPU_LORA_STREAM_ISA", request.param)
    return request.param


def test_long_pass_fp32_matches_eager_incl_grads(path):
    """T=515 tokens (odd) on 4 experts, top-2: ~260 rows an expert, the blocked backward on the
    AVX-512 paths, against transformers' eager experts in fp32."""
    blk, cfg = stock_block(torch.float32, E=4, K=2, H=136, inter=72)
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(1, 515, 136, generator=g)
    gy = torch.randn(1, 515, 136, generator=g)
    ref = run_block(blk, cfg, "eager", x0, gy)
    got = run_block(blk, cfg, stream.NAME, x0, gy)
    for name, a, b in zip(("y", "dx", "d_router", "d_gu", "d_down"), got, ref, strict=True):
        atol = 2e-5 * max(1.0, b.abs().max().item())
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def test_long_pass_bf16_close_to_fp32_reference(path):
    """bf16 weights and activations at T=515 against the fp32 eager reference of the same
    weights: within 2 % of each tensor's scale (the bound of the short-pass test)."""
    blk16, cfg16 = stock_block(torch.bfloat16, E=4, K=2, H=136, inter=72)
    blk32, cfg32 = stock_block(torch.float32, E=4, K=2, H=136, inter=72)
    blk32.load_state_dict({k: v.float() for k, v in blk16.state_dict().items()})
    g = torch.Generator().manual_seed(6)
    x0 = torch.randn(1, 515, 136, generator=g).bfloat16()
    gy = torch.randn(1, 515, 136, generator=g).bfloat16()
    ref = run_block(blk32, cfg32, "eager", x0.float(), gy.float())
    got = run_block(blk16, cfg16, stream.NAME, x0, gy)
    for name, a, b in zip(("y", "dx", "d_router", "d_gu", "d_down"), got, ref, strict=True):
        scale = b.abs().max().item()
        err = (a.float() - b).abs().max().item()
        assert err <= 2e-2 * scale + 1e-3, f"{name}: max err {err} vs scale {scale}"
