"""The node expert pass (``moe/node_pass.py``) between real spawned processes: bitwise equal to
each rank computing alone (forward and backward, fp32 and bf16 weights), the node's streamed
bytes counted once instead of once per rank, and a rank that dies or stalls ends the pass with
an error instead of a hang."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from npu_lora.moe import stream  # noqa: E402
from npu_lora.moe.experts import hit_expert_bytes  # noqa: E402
from npu_lora.moe.node_pass import (  # noqa: E402
    LocalPass,
    NodeLink,
    NodePass,
    NodePassBroken,
    NodePassTimeout,
)

E, H, I, K = 16, 128, 64, 4  # noqa: E741
ROWS = (37, 64)  # tokens of rank 0 and rank 1 (unequal on purpose)


class _Experts(torch.nn.Module):
    """The experts call as the Qwen3-MoE block makes it, on the streaming kernel."""

    def __init__(self, dtype: Any) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.gate_up_proj = torch.nn.Parameter(
            (torch.randn(E, 2 * I, H, generator=g) * 0.05).to(dtype), requires_grad=False
        )
        self.down_proj = torch.nn.Parameter(
            (torch.randn(E, H, I, generator=g) * 0.05).to(dtype), requires_grad=False
        )

    def forward(self, x: Any, idx: Any, w: Any) -> Any:
        return stream.stream_experts(x, idx, w, self.gate_up_proj, self.down_proj)


def _inputs(rank: int) -> tuple[Any, Any, Any, Any]:
    g = torch.Generator().manual_seed(100 + rank)
    T = ROWS[rank]
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    idx[::5, -1] = E  # masked slots (hot experts' pairs): sorted to the tail, computed as zero
    w = torch.rand(T, K, generator=g)
    dy = torch.randn(T, H, generator=g)
    return x, idx, w, dy


def _step(npass: Any, experts: Any, rank: int, layers: int = 2) -> dict[str, Any]:
    """Two layers' forward, then backward in reverse order (as the engine runs them)."""
    x, idx, w, dy = _inputs(rank)
    outs, leaves, plain = [], [], []
    for layer in range(layers):
        with torch.no_grad():  # keepGraph off: a forward without a graph first (recompute later)
            plain.append(npass.module(experts, layer)(x + layer, idx, w))
        xl = (x + layer).requires_grad_(True)
        wl = w.clone().requires_grad_(True)
        y = npass.module(experts, layer)(xl, idx, wl)
        outs.append(y)
        leaves.append((xl, wl))
    res: dict[str, Any] = {"y": [y.detach() for y in outs], "plain": plain}
    grads = []
    for layer in reversed(range(layers)):
        grads.append(torch.autograd.grad(outs[layer], leaves[layer], dy))
    res["dx"] = [g[0] for g in reversed(grads)]
    res["dw"] = [g[1] for g in reversed(grads)]
    res["bytes"] = npass.streamed_bytes
    return res


def _pack(v: Any) -> bytes:
    """Results by value (a tensor sent through a queue would need its sender alive)."""
    import io

    buf = io.BytesIO()
    torch.save(v, buf)
    return buf.getvalue()


def _unpack(b: Any) -> Any:
    import io

    return torch.load(io.BytesIO(b), weights_only=False) if isinstance(b, bytes) else b


def _worker(rank: int, link: Any, dtype: Any, shared: bool, q: Any, mode: str) -> None:
    torch.set_num_threads(1)
    experts = _Experts(dtype)
    if not shared:
        q.put((rank, _pack(_step(LocalPass(), experts, rank))))
        return
    npass = NodePass(link, rank, 2, timeout_s=3.0 if mode == "stall" else 60.0, threads=2)
    npass.active = True
    if mode != "ok" and rank == 1:
        if mode == "die":
            import os

            os._exit(9)
        time.sleep(30)  # "stall": never reaches the pass
        return
    try:
        q.put((rank, _pack(_step(npass, experts, rank))))
    except NodePassBroken as e:
        q.put((rank, e))


def _run(dtype: Any, shared: bool, mode: str = "ok", abort_on_death: bool = True) -> dict:
    ctx = multiprocessing.get_context("spawn")
    link = NodeLink.create(ctx, 2)
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, link, dtype, shared, q, mode)) for r in (0, 1)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    t0 = time.monotonic()
    try:
        while len(got) < (1 if mode != "ok" else 2):
            if mode == "die" and abort_on_death and procs[1].exitcode is not None:
                link.abort()  # what the launcher does when a rank exits
            try:
                r, v = q.get(timeout=0.2)
                got[r] = _unpack(v)
            except Exception:
                bad = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert mode != "ok" or not bad, f"a worker failed: {bad}"
                assert time.monotonic() - t0 < 120, "the pass hung"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
        link.cleanup()
    got["elapsed"] = time.monotonic() - t0
    return got


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shared_pass_is_bitwise_each_rank_alone_and_streams_once(dtype: str) -> None:
    dt = getattr(torch, dtype)
    alone = _run(dt, shared=False)
    node = _run(dt, shared=True)
    for r in (0, 1):
        for key in ("y", "plain", "dx", "dw"):
            for layer in (0, 1):
                a, b = alone[r][key][layer], node[r][key][layer]
                assert a.dtype == b.dtype and torch.equal(a, b), (r, key, layer)
    # bytes: apart, each rank streams its own hit experts (fwd + bwd per layer); together the
    # executor streams the union's once and rank 1 nothing
    ex = _Experts(dt)
    own = [hit_expert_bytes(_inputs(r)[1], ex.gate_up_proj, ex.down_proj) for r in (0, 1)]
    union = hit_expert_bytes(
        torch.cat([_inputs(r)[1] for r in (0, 1)]), ex.gate_up_proj, ex.down_proj
    )
    # per layer: the forward without a graph, the forward with one, the backward
    assert [alone[r]["bytes"] for r in (0, 1)] == [6 * own[0], 6 * own[1]]
    assert [node[r]["bytes"] for r in (0, 1)] == [6 * union, 0]
    assert node[0]["bytes"] + node[1]["bytes"] < alone[0]["bytes"] + alone[1]["bytes"]


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_pass_at_once() -> None:
    got = _run(torch.float32, shared=True, mode="die")
    assert isinstance(got[0], NodePassBroken) and not isinstance(got[0], NodePassTimeout)
    assert "left the node expert pass" in str(got[0])
    assert got["elapsed"] < 30  # no wait for the 60 s timeout


@pytest.mark.slow
def test_a_rank_that_stalls_ends_the_pass_with_the_rendezvous_code() -> None:
    got = _run(torch.float32, shared=True, mode="stall")
    assert isinstance(got[0], NodePassTimeout), got[0]
    assert got[0].exit_code == 4
    assert "rendezvousTimeoutSeconds (3 s)" in str(got[0])


@pytest.mark.parametrize(("cap", "h", "k"), [(1, 3, 1), (37, 64, 2), (20511, 64, 2)])
def test_segment_regions_are_aligned_and_shared(tmp_path: Any, cap: int, h: int, k: int) -> None:
    """Odd capacities and widths (a cold call's token count is any number) keep every region
    aligned for its dtype, and a second mapping sees the first one's writes."""
    from npu_lora.moe.node_pass import _Segment

    path = str(tmp_path / "seg")
    mine, theirs = _Segment(path, cap, h, k, create=True), _Segment(path, cap, h, k, create=False)
    mine.idx.fill_(7)
    mine.a.fill_(1.0)
    mine.b.fill_(2.0)
    mine.w.fill_(3.0)
    assert int(theirs.idx.sum()) == 7 * cap * k
    assert float(theirs.a.sum()) == cap * h and float(theirs.b.sum()) == 2 * cap * h
    assert float(theirs.w.sum()) == 3 * cap * k
