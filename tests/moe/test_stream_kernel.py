"""``npu_lora_stream``: the streaming C++ experts kernel (every ISA path this CPU runs, and the
pure-torch fallback) against transformers' ``eager`` experts."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from npu_lora.moe import kernels, stream

from .moe_blocks import run_block, stock_block

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")

#: "torch" is the fallback (the Function's pure-torch path); the others are the C++ ISA paths.
PATHS = ["torch", *kernels.cpu_isas()]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setattr(kernels, "isa", lambda: None)
    else:
        monkeypatch.setenv("NPU_LORA_STREAM_ISA", request.param)
    return request.param


_block = stock_block


_run = run_block


NAMES = ("y", "dx", "d_router", "d_gate_up", "d_down")


def test_extension_builds_here():
    """On this (x86-64, g++ + ninja) machine the extension must build: the fallback is for
    hosts where it cannot, not a silent default."""
    assert kernels.load() is not None, kernels.error()
    assert stream.backend().startswith("cpp:")
    assert "base" in kernels.cpu_isas()


@pytest.mark.parametrize("unit", ["stream_avx2.cpp", "stream_avx512.cpp"])
def test_widening_tiles_keep_their_software_prefetches(unit, tmp_path):
    """The weight tiles prefetch the row tile two ahead (worth ~8 % on an AVX2 EPYC). A refactor
    that moved those lines into a helper made g++ 12 drop every prefetch of the unit, silently
    (experiments/2026-12-02-avx2-epyc.md §5): the compiled unit must still hold them."""
    import shutil
    from pathlib import Path

    cxx = shutil.which("g++")
    if cxx is None or not sys.platform.startswith("linux"):
        pytest.skip("needs g++ on Linux x86-64")
    src = Path(kernels.__file__).parent / unit
    asm = tmp_path / "unit.s"
    subprocess.run(
        [cxx, *kernels.CFLAGS, "-std=c++17", f"-I{src.parent}", "-S", str(src), "-o", str(asm)],
        check=True,
    )
    assert asm.read_text().count("prefetcht1") >= 8  # every tile shape of dot and axpy


def test_phases_run_on_torch_threads():
    """Each phase runs on torch's intra-op threads (``torch.set_num_threads``): the extension is
    built with OpenMP; without it at::parallel_for silently ran every phase on one thread."""
    mod = kernels.load()
    prev = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert mod.parallel_threads() == threads
    finally:
        torch.set_num_threads(prev)


# H=40, I=24: widths that are not multiples of any vector width (tails); E=64, K=2, 9 tokens:
# most experts unhit. H=520, I=200, E=8, K=2, T=96: ~24 tokens per expert (several token tiles),
# more rows than a row group and more columns than a packed block (backward), row tiles past the
# prefetch distance (forward), vector tails of 8 columns.
@pytest.mark.parametrize(
    ("H", "inter", "E", "K", "T"), [(64, 32, 16, 4, 48), (40, 24, 64, 2, 9), (520, 200, 8, 2, 96)]
)
def test_fp32_matches_eager_incl_grads(path, H, inter, E, K, T):
    blk, cfg = _block(torch.float32, E=E, K=K, H=H, inter=inter)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(1, T, H, generator=g)
    gy = torch.randn(1, T, H, generator=g)
    ref = _run(blk, cfg, "eager", x0, gy)
    got = _run(blk, cfg, stream.NAME, x0, gy)
    for name, a, b in zip(NAMES, got, ref, strict=True):
        # fp32 sums of H or I terms in another order: absolute tolerance relative to the scale
        atol = 1e-5 * max(1.0, b.abs().max().item())
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def test_frozen_experts_no_weight_grads(path):
    blk, cfg = _block(torch.float32)
    blk.experts.requires_grad_(False)
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(2, 12, 64, generator=g)
    gy = torch.randn(2, 12, 64, generator=g)
    ref = _run(blk, cfg, "eager", x0, gy)
    got = _run(blk, cfg, stream.NAME, x0, gy)
    assert got[3] is None and got[4] is None
    for a, b in zip(got[:3], ref[:3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# 72, 40: vector pairs + tails; 520, 200: several token tiles, row groups and packed blocks
@pytest.mark.parametrize(("H", "inter"), [(64, 32), (72, 40), (520, 200)])
def test_bf16_storage_close_to_fp32_reference(path, H, inter):
    """bf16 weights, inputs and outputs against the fp32 eager reference of the same (bf16-
    rounded) weights. Bound: max error ≤ 2 % of the tensor's max magnitude (+1e-3), the same
    bound the bf16 torch kernels meet (the kernel itself accumulates in fp32; the error is the
    bf16 rounding of inputs, outputs and gradients)."""
    blk16, cfg16 = _block(torch.bfloat16, H=H, inter=inter)
    blk32, cfg32 = _block(torch.float32, H=H, inter=inter)
    blk32.load_state_dict({k: v.float() for k, v in blk16.state_dict().items()})
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(2, 24, H, generator=g).bfloat16()
    gy = torch.randn(2, 24, H, generator=g).bfloat16()
    ref = _run(blk32, cfg32, "eager", x0.float(), gy.float())
    got = _run(blk16, cfg16, stream.NAME, x0, gy)
    for name, a, b in zip(NAMES, got, ref, strict=True):
        assert a.dtype == torch.bfloat16
        scale = b.abs().max().item()
        err = (a.float() - b).abs().max().item()
        assert err <= 2e-2 * scale + 1e-3, f"{name}: max err {err} vs scale {scale}"


def _routing(T: int, K: int, E: int, seed: int) -> dict[str, torch.Tensor]:
    """Expert-order routing tensors as stream.py builds them: top-K distinct experts per token."""
    from npu_lora.moe.experts import build_routing

    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    r = build_routing(idx, E)
    return {
        "token_idx": r.token_idx,
        "inv_perm": r.inv_perm,
        "offsets": stream._offsets(r),
        "wr": torch.rand(T * K, generator=g).contiguous(),
    }


@pytest.mark.parametrize("isa", [i for i in kernels.cpu_isas() if i in kernels.WIDENING_ISAS])
def test_bf16_weights_run_the_fp32_tiles_bitwise(isa):
    """bf16 weights are widened in registers and run the fp32 tiles in the fp32 order: given the
    same bf16-valued inputs, the gate/up pre-activations and the whole backward (dX, routing-weight
    gradient, dh) are bitwise those of the fp32 path on the widened weights. (The forward output
    differs only by the bf16 rounding of the SiLU·mul activations, which the bf16 path applies.)"""
    mod = kernels.load()
    T, K, E, H, inter = 40, 2, 8, 136, 72
    r = _routing(T, K, E, seed=5)
    g = torch.Generator().manual_seed(6)
    gu16 = (torch.randn(E, 2 * inter, H, generator=g) * 0.1).bfloat16()
    dn16 = (torch.randn(E, H, inter, generator=g) * 0.1).bfloat16()
    x16 = torch.randn(T, H, generator=g).bfloat16()
    gy16 = torch.randn(T, H, generator=g).bfloat16()
    code = kernels.ISA_CODES[isa]
    outs = {}
    for name, gu, dn, x, gy in (
        ("bf16", gu16, dn16, x16, gy16),
        ("fp32", gu16.float(), dn16.float(), x16.float(), gy16.float()),
    ):
        _, h = mod.forward(
            x, r["token_idx"], r["wr"], r["offsets"], gu, dn, r["inv_perm"], T, K, code, 16, 32
        )
        dx, dw, dh = mod.backward(
            gy, r["token_idx"], h, r["wr"], r["offsets"], gu, dn, r["inv_perm"], T, K, code, 48, 40
        )
        outs[name] = (h, dx, dw, dh)
    for what, a, b in zip(("h", "dx", "dw", "dh"), outs["bf16"], outs["fp32"], strict=True):
        assert torch.equal(a, b), what
    assert outs["bf16"][0].abs().max() > 0


def _native_inputs(T, K, E, H, inter, seed):
    r = _routing(T, K, E, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    gu = (torch.randn(E, 2 * inter, H, generator=g) * 0.1).bfloat16()
    dn = (torch.randn(E, H, inter, generator=g) * 0.1).bfloat16()
    x = torch.randn(T, H, generator=g).bfloat16()
    gy = torch.randn(T, H, generator=g).bfloat16()
    return r, gu, dn, x, gy


def _raw_call(code, r, gu, dn, x, gy, T, K):
    mod = kernels.load()
    out, h = mod.forward(
        x, r["token_idx"], r["wr"], r["offsets"], gu, dn, r["inv_perm"], T, K, code, 16, 32
    )
    dx, dw, dh = mod.backward(
        gy, r["token_idx"], h, r["wr"], r["offsets"], gu, dn, r["inv_perm"], T, K, code, 48, 40
    )
    return {"out": out, "h": h, "dx": dx, "dw": dw, "dh": dh}


NATIVE_HERE = [i for i in kernels.NATIVE_ISAS if i in kernels.cpu_isas()]
needs_native = pytest.mark.skipif(not NATIVE_HERE, reason="CPU without AVX512-BF16 or AMX")


# odd widths: column tails of every length class, an odd number of rows per task (a row paired
# with zeros), experts without tokens; (160, 2, 4, ...): 80 tokens per expert, five blocks of 16
# (the AMX kernels' pairs of token blocks and a single one)
@pytest.mark.parametrize(
    ("T", "K", "E", "H", "inter"),
    [(40, 2, 8, 136, 72), (33, 3, 5, 71, 33), (96, 2, 8, 520, 200), (160, 2, 4, 136, 72)],
)
@pytest.mark.parametrize("isa", NATIVE_HERE or ["avx512bf16"])
@needs_native
def test_native_bf16_matches_the_widening_path(isa, T, K, E, H, inter):
    """``avx512bf16`` (vdpbf16ps) and ``amx`` (tdpbf16ps) against the widening AVX-512 path on the
    same bf16 inputs.
    Forward pre-activations: fp32 sums of the same exact products in another order (≤ 1e-5 of the
    scale); ``out``: plus the bf16 rounding of a few activations that land on the other side of a
    rounding boundary; backward: ``dw`` and ``dh`` come from ``z`` whose coefficients (``dout``) are
    bf16 already, so they match to fp32 order; ``dx`` uses ``dh`` rounded to bf16 (relative
    error 2^-9 per coefficient): ≤ 1 % of the scale."""
    r, gu, dn, x, gy = _native_inputs(T, K, E, H, inter, seed=T)
    wide = _raw_call(kernels.ISA_CODES["avx512"], r, gu, dn, x, gy, T, K)
    nat = _raw_call(kernels.ISA_CODES[isa], r, gu, dn, x, gy, T, K)
    bounds = {"h": 1e-5, "out": 2e-3, "dw": 1e-5, "dh": 1e-5, "dx": 1e-2}
    for name, bound in bounds.items():
        a, b = nat[name], wide[name]
        scale = b.abs().max().item()
        assert scale > 0, name
        err = (a - b).abs().max().item()
        assert err <= bound * scale, f"{name}: max err {err} vs scale {scale}"
    # the native path really differs from the widening one (it is not silently the same code)
    assert not torch.equal(nat["dx"], wide["dx"])


@pytest.mark.parametrize("isa", NATIVE_HERE or ["avx512bf16"])
@needs_native
def test_row_blocks_per_task_do_not_change_native_results(isa):
    """Rows are independent, so the forward's row blocks per task (odd ones included: the packed
    AMX activations take even blocks) leave ``out`` and ``h`` bitwise unchanged."""
    mod = kernels.load()
    T, K, E, H, inter = 40, 2, 8, 136, 72
    r, gu, dn, x, _ = _native_inputs(T, K, E, H, inter, seed=13)
    args = (x, r["token_idx"], r["wr"], r["offsets"], gu, dn, r["inv_perm"], T, K)
    ref = mod.forward(*args, kernels.ISA_CODES[isa], 16, 32)
    for gu_block in (15, 7, 72):
        got = mod.forward(*args, kernels.ISA_CODES[isa], gu_block, 32)
        for a, b in zip(got, ref, strict=True):
            assert torch.equal(a, b), gu_block


@pytest.mark.parametrize("isa", NATIVE_HERE or ["avx512bf16"])
@needs_native
def test_a_tokens_rows_do_not_depend_on_how_many_tokens_share_its_expert(isa, monkeypatch):
    """A token's output and gradient rows depend only on its own row, routing and the weights,
    whether its expert has 1 token in the pass or ~40 (the native backward switches to column
    blocks from 12 tokens an expert; 600 columns = two blocks and a masked tail). The node's
    shared expert pass relies on it: the union's rows equal each rank's alone, bitwise."""
    monkeypatch.setenv("NPU_LORA_STREAM_ISA", isa)
    T, K, E, H, inter = 40, 2, 2, 600, 72
    g = torch.Generator().manual_seed(21)
    gu = (torch.randn(E, 2 * inter, H, generator=g) * 0.1).bfloat16()
    dn = (torch.randn(E, H, inter, generator=g) * 0.1).bfloat16()
    x = torch.randn(T, H, generator=g).bfloat16()
    gy = torch.randn(T, H, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)

    def run(rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xr = x[rows].clone().requires_grad_(True)
        wr = w[rows].clone().requires_grad_(True)
        y = stream.stream_experts(xr, idx[rows], wr, gu, dn)
        y.backward(gy[rows])
        return y.detach(), xr.grad, wr.grad

    together = run(slice(0, T))
    alone = [run(slice(t, t + 1)) for t in range(T)]
    for name, i in (("y", 0), ("dx", 1), ("dw", 2)):
        assert torch.equal(together[i], torch.cat([a[i] for a in alone])), name
    assert together[1].abs().max() > 0


@pytest.mark.parametrize("isa", NATIVE_HERE or ["avx512bf16"])
@needs_native
def test_native_bf16_runs_fp32_weights_on_the_avx512_tiles(isa):
    """fp32 weights on ``avx512bf16`` and ``amx`` run the AVX-512 fp32 tiles: bitwise the
    ``avx512`` path."""
    T, K, E, H, inter = 40, 2, 8, 136, 72
    r, gu, dn, x, gy = _native_inputs(T, K, E, H, inter, seed=9)
    args = (r, gu.float(), dn.float(), x.float(), gy.float(), T, K)
    wide = _raw_call(kernels.ISA_CODES["avx512"], *args)
    nat = _raw_call(kernels.ISA_CODES[isa], *args)
    for name in wide:
        assert torch.equal(nat[name], wide[name]), name


def test_buffers_come_from_a_reused_cache():
    """Work buffers and output tensors come from the extension's block cache (glibc maps blocks
    over 32 MiB afresh on every call: page faults each time): once a shape has run, further calls
    allocate nothing new (the cache does not grow), results are
    bitwise the first call's although the reused memory holds the previous call's values, outputs
    freed by torch go back to the cache, and ``trim_workspace`` empties it."""
    mod = kernels.load()
    T, K, E, H, inter = 48, 2, 8, 136, 72
    r, gu, dn, x, gy = _native_inputs(T, K, E, H, inter, seed=11)
    args = (r, gu.float(), dn.float(), x.float(), gy.float(), T, K)
    code = kernels.ISA_CODES[kernels.isa()]
    mod.trim_workspace()
    first = _raw_call(code, *args)
    warm = mod.workspace_bytes()
    assert warm > 0  # the work buffers went back to the cache
    sizes = []
    for _ in range(7):
        again = _raw_call(code, *args)
        for name in first:
            assert torch.equal(again[name], first[name]), name
        del again  # its outputs return to the cache
        sizes.append(mod.workspace_bytes())
    # the repeats need new blocks for their outputs while the first call's are held, and best fit
    # may hand a block to another buffer of the call for a while; then every block is reused
    assert sizes[-4:] == sizes[-1:] * 4 and sizes[-1] <= 3 * sizes[0], (warm, sizes)
    held = mod.workspace_bytes()
    del first
    assert mod.workspace_bytes() > held  # the freed outputs returned to the cache
    mod.trim_workspace()
    assert mod.workspace_bytes() == 0


def _det_case(dtype=torch.float32):
    blk, cfg = _block(dtype, E=8, K=2, H=136, inter=72)
    blk.experts.requires_grad_(False)
    g = torch.Generator().manual_seed(4)
    x0, gy = torch.randn(4, 32, 136, generator=g), torch.randn(4, 32, 136, generator=g)
    return blk, cfg, x0.to(dtype), gy.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_across_runs_and_threads(path, dtype):
    """Bitwise equal: repeated runs, and 1 vs 2 intra-op threads (the task partition depends on
    the shapes and routing only; threads take tasks in any order, each output is written by one
    task and every sum has a fixed order)."""
    prev = torch.get_num_threads()
    blk, cfg, x0, gy = _det_case(dtype)
    try:
        outs = []
        for threads in (2, 2, 1):
            torch.set_num_threads(threads)
            outs.append(_run(blk, cfg, stream.NAME, x0, gy)[:3])
    finally:
        torch.set_num_threads(prev)
    for other in outs[1:]:
        for u, v in zip(outs[0], other, strict=True):
            assert torch.equal(u, v)


def test_fallback_when_extension_disabled(tmp_path):
    """``NPU_LORA_STREAM_EXT=0`` (what a failed build amounts to): the kernel runs its torch
    path, reports it, and still matches eager."""
    code = (
        "import torch\n"
        "from npu_lora.moe import kernels, stream\n"
        "from tests.moe.test_stream_kernel import _block, _run\n"
        "blk, cfg = _block(torch.float32)\n"
        "x0 = torch.randn(1, 10, 64); gy = torch.randn(1, 10, 64)\n"
        "ref = _run(blk, cfg, 'eager', x0, gy); got = _run(blk, cfg, stream.NAME, x0, gy)\n"
        "for a, b in zip(got, ref): torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)\n"
        "assert kernels.load() is None and 'NPU_LORA_STREAM_EXT' in kernels.error()\n"
        "print(stream.backend())\n"
    )
    env = {"NPU_LORA_STREAM_EXT": "0", "PYTHONPATH": "."}
    import os

    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch"


def test_forced_isa_must_run_here(monkeypatch):
    monkeypatch.setenv("NPU_LORA_STREAM_ISA", "neon")
    with pytest.raises(ValueError, match="NPU_LORA_STREAM_ISA='neon'"):
        kernels.isa()


def test_the_extension_refuses_an_isa_code_the_cpu_cannot_run():
    """A raw call with an instruction-set code this CPU cannot run (or an unknown code) is an
    error naming the path, not an illegal-instruction crash of the process."""
    assert kernels.load() is not None
    r, gu, dn, x, gy = _native_inputs(16, 2, 4, 64, 32, seed=3)
    missing = [c for n, c in kernels.ISA_CODES.items() if n not in kernels.cpu_isas()]
    for code in [*missing, 99]:
        with pytest.raises(RuntimeError, match=r"npu_lora_stream: (ISA|unknown ISA)"):
            _raw_call(code, r, gu, dn, x, gy, 16, 2)


def test_host_dtype_auto_and_probe():
    """The probe lands in machine_facts; auto picks bf16 with the stream kernel where the
    extension runs (here), float32 for a torch kernel on a CPU without native bf16."""
    from npu_lora.machine import machine_facts
    from npu_lora.moe.host_dtype import resolve_host_dtype

    caps = machine_facts()["cpu_capabilities"]
    assert {"isa", "native_bf16", "cores", "numa_nodes", "caches", "thp"} <= set(caps)
    choice = resolve_host_dtype("auto", stream.NAME, log_it=False)
    assert choice.dtype == "bfloat16" and choice.kernel_backend == stream.backend()
    native_here = stream.backend().removeprefix("cpp:") in kernels.NATIVE_ISAS
    assert ("computes bf16 natively" in choice.reason) == native_here, choice.reason
    assert ("widens bf16 operands" in choice.reason) == (not native_here), choice.reason
    no_bf16 = {"native_bf16": False, "isa": ["avx2"]}
    assert resolve_host_dtype("auto", "eager", caps=no_bf16, log_it=False).dtype == "float32"
    # the stream kernel never computes in bf16: explicit bf16 is not flagged even without it
    assert resolve_host_dtype("bfloat16", stream.NAME, caps=no_bf16, log_it=False).warning is None
    # without native bf16 the router and activations stay fp32 (bf16 weights only)
    for req in ("auto", "bfloat16"):
        c = resolve_host_dtype(req, stream.NAME, caps=no_bf16, log_it=False)
        assert (c.dtype, c.compute_dtype) == ("bfloat16", "float32"), req
        assert "router and activations in float32" in c.reason
        assert c.to_dict()["compute_dtype"] == "float32"
    native = {"native_bf16": True, "isa": ["avx512f", "avx512_bf16"]}
    c = resolve_host_dtype("auto", stream.NAME, caps=native, log_it=False)
    assert (c.dtype, c.compute_dtype) == ("bfloat16", "bfloat16")
    c = resolve_host_dtype("float32", stream.NAME, caps=no_bf16, log_it=False)
    assert (c.dtype, c.compute_dtype) == ("float32", "float32")
