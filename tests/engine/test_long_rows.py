"""Long rows: the LM-head loss in chunks, sdpa attention, and a whole step at S = 1-4K tokens."""

from __future__ import annotations

import pytest
import torch
from npu_lora.api.sizing import (
    SDPA_MIN_SEQ,
    attention_impl,
    head_chunk_rows,
    head_loss_blocks,
    head_vocab_rows,
    label_gather_impl,
    rope_impl,
)
from npu_lora.device.graphs import DeviceAttentionBlock, DeviceHead, label_gather
from npu_lora.device.ops import eager_attention, sdpa_attention
from torch import nn

from tests.engine.conftest import make_batch, make_spec, randomize_lora


def test_head_chunk_rows_rule():
    assert head_chunk_rows(1, 64, 512) == 64  # 128 KiB of logits: one chunk
    V = 151_936  # Qwen3: 608 KB of fp32 logits a position
    assert head_chunk_rows(1, 2048, V) == 64  # 64 × 608 KB = 37 MiB <= 64 MiB
    assert head_chunk_rows(2, 2048, V) == 32
    assert head_chunk_rows(1, 4096, V, limit=1) == 1
    for n in (3, 48, 4096):  # a power of two dividing n (S may be any length)
        c = head_chunk_rows(1, n, V, limit=V * 4 * 16)
        assert n % c == 0 and c <= 16


def test_head_loss_blocks_rule():
    assert head_loss_blocks("cpu") == "vocab" and head_loss_blocks("cuda") == "vocab"
    assert head_loss_blocks("furiosa") == "rows"  # the static position chunks the plan lists
    assert label_gather_impl("cpu") == "index" and label_gather_impl("furiosa") == "onehot"
    V = 151_936
    assert head_vocab_rows(512, V) == 32_768  # 512 × 32,768 × 4 B = 64 MiB
    assert head_vocab_rows(4096, V) == 4096
    assert head_vocab_rows(3, V) == V  # one block: the whole vocabulary
    assert head_vocab_rows(16, 97, limit=16 * 4 * 10) == 10  # under 64: as it comes
    assert head_vocab_rows(1 << 30, V) == 1


def test_attention_impl_rule():
    assert attention_impl("cpu", SDPA_MIN_SEQ) == "sdpa"
    assert attention_impl("cuda", 4096) == "sdpa"
    assert attention_impl("cpu", SDPA_MIN_SEQ - 1) == "eager"  # short rows: bitwise the stock
    assert attention_impl("furiosa", 4096) == "eager"  # the form RNGD's compiler takes


def _head(D=32, V=97, dtype=torch.float32, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    norm = nn.RMSNorm(D, eps=1e-6).to(dtype)
    lm = nn.Linear(D, V, bias=False).to(dtype)
    with torch.no_grad():
        lm.weight.copy_(torch.randn(V, D, generator=g).to(dtype) * 0.3)
        norm.weight.copy_(1 + 0.1 * torch.randn(D, generator=g).to(dtype))
    lm.weight.requires_grad_(False)
    return DeviceHead(norm, lm, V, **kw)


def _inputs(B=2, S=96, D=32, V=97, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, S), generator=g)
    labels = ids.clone()
    labels[:, :7] = -100
    labels[1, -9:] = -100  # rows with different label counts: zero rows pad the bucket
    lg = label_gather(labels, dtype)
    h = torch.randn(B, S, D, generator=g).to(dtype).requires_grad_(True)
    moe = torch.randn(B, S, D, generator=g).to(dtype).requires_grad_(True)
    return h, moe, lg


@pytest.mark.parametrize("backend", ["furiosa", "cpu"])  # position chunks, vocabulary blocks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lora_head", [False, True])
def test_chunked_head_loss_and_gradients_equal_unchunked(dtype, lora_head, backend):
    V = 97
    whole = _head(V=V, dtype=dtype)
    # furiosa: 8 positions a chunk; cpu: every position against blocks of the vocabulary
    chunked = _head(V=V, dtype=dtype, chunk_bytes=2 * 8 * V * 4, backend=backend)
    if lora_head:  # a trained head: the checkpointed chunks (logits recomputed in backward)
        for m in (whole, chunked):
            m.lm_head.weight.requires_grad_(True)
    h, moe, lg = _inputs(V=V, dtype=dtype)
    assert head_chunk_rows(2, lg.sel_BNS.shape[1], V, chunked.chunk_bytes) == 8
    outs = []
    for m in (whole, chunked):
        hh, mm = h.detach().clone().requires_grad_(), moe.detach().clone().requires_grad_()
        loss = m(hh, mm, lg.sel_BNS, lg.labels_BN, lg.w_BN)
        loss.backward()
        grads = [hh.grad, mm.grad]
        if lora_head:
            grads.append(m.lm_head.weight.grad)
        outs.append((loss.detach(), grads))
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-3}
    torch.testing.assert_close(outs[1][0], outs[0][0], **tol)
    for a, b in zip(outs[1][1], outs[0][1], strict=True):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("backend", ["furiosa", "cpu"])
def test_chunked_head_never_holds_all_logits(monkeypatch, backend):
    """The largest logits tensor the head makes is one chunk's (the head's F.linear calls): 8
    positions' on furiosa, a vocabulary block of the same bytes for every position on cpu."""
    import npu_lora.device.graphs as graphs

    V = 97
    budget = 2 * 8 * V * 4
    head = _head(V=V, chunk_bytes=budget, backend=backend)
    h, moe, lg = _inputs(V=V)
    B, N = lg.labels_BN.shape
    seen = []
    real = graphs.F.linear

    def spy(x, w, *a):
        out = real(x, w, *a)
        seen.append(out.shape)
        return out

    monkeypatch.setattr(graphs.F, "linear", spy)
    head(h, moe, lg.sel_BNS, lg.labels_BN, lg.w_BN).backward()
    assert seen and max(s.numel() for s in seen) * 4 <= budget < B * N * V * 4
    if backend == "furiosa":
        assert max(s[-2] for s in seen) == 8 < N
    else:  # every position in each call, the vocabulary in blocks
        assert all(s[0] == B * N and s[-1] < V for s in seen)
        assert sum(s[-1] for s in seen) == V  # the weight read once


@pytest.mark.parametrize("backend", ["furiosa", "cpu"])  # one-hot bmm, index gather
def test_chunked_head_per_position_losses_equal(backend):
    V = 97
    whole, chunked = _head(V=V), _head(V=V, chunk_bytes=2 * 8 * V * 4, backend=backend)
    h, moe, lg = _inputs(V=V)
    with torch.no_grad():
        a = whole(h, moe, lg.sel_BNS, lg.labels_BN, None)
        b = chunked(h, moe, lg.sel_BNS, lg.labels_BN, None)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_attention_equals_eager_core(dtype):
    from npu_lora.device.graphs import causal_mask

    g = torch.Generator().manual_seed(0)
    B, H, K, S, d = 2, 4, 2, 64, 16
    q = torch.randn(B, H, S, d, generator=g).to(dtype)
    k = torch.randn(B, K, S, d, generator=g).to(dtype)
    v = torch.randn(B, K, S, d, generator=g).to(dtype)
    am = torch.ones(B, S, dtype=torch.long)
    am[1, -5:] = 0
    pid = torch.cat([torch.arange(40), torch.arange(24)])[None].expand(B, S)  # packed rows
    mask = causal_mask(am, B, S, dtype, pid)
    do = torch.randn(B, S, H, d, generator=g).to(dtype)
    res = []
    for core in (eager_attention, sdpa_attention):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o, _ = core(qq, kk, vv, mask, d**-0.5)
        (o.float() * do.float()).sum().backward()
        res.append([o, qq.grad, kk.grad, vv.grad])
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 3e-2, "atol": 3e-2}
    for a, b in zip(res[1], res[0], strict=True):
        torch.testing.assert_close(a, b, **tol)


def test_attention_block_switches_to_sdpa_on_long_rows(monkeypatch):
    import npu_lora.device.graphs as graphs

    used = []
    monkeypatch.setattr(graphs, "sdpa_attention", lambda *a: used.append("sdpa") or eager(*a))
    monkeypatch.setattr(graphs, "eager_attention", lambda *a: used.append("eager") or eager(*a))
    eager = eager_attention
    from npu_lora.engine import build_engine

    tiny = build_engine(make_spec(training={"seqLen": SDPA_MIN_SEQ, "batchSize": 1}))
    blk = tiny.attn[0]
    blk = getattr(blk, "_orig_mod", blk)
    assert isinstance(blk, DeviceAttentionBlock) and blk.backend == "cpu"
    D = tiny.config.hidden_size
    for S in (SDPA_MIN_SEQ // 2, SDPA_MIN_SEQ):
        h = torch.randn(1, S, D)
        pos = torch.arange(S, dtype=torch.int32)[None]
        blk(h, torch.zeros_like(h), pos, graphs.causal_mask(None, 1, S, h.dtype))
    assert used == ["eager", "sdpa"]


def test_rope_rule_and_both_forms_are_bitwise_equal():
    """cpu/cuda write rotate_half as transformers does (slices); furiosa as ``x @ R``, the form
    its compiler schedules. Same values, bit for bit, forward and backward, in fp32 and bf16."""
    assert rope_impl("cpu") == "slice" and rope_impl("cuda") == "slice"
    assert rope_impl("furiosa") == "matmul"
    from npu_lora.engine import build_engine

    tiny = build_engine(make_spec())
    blk = tiny.attn[0]
    blk = getattr(blk, "_orig_mod", blk)
    D, S = tiny.config.hidden_size, 16
    g = torch.Generator().manual_seed(3)
    h0 = torch.randn(1, S, D, generator=g)
    pos = torch.arange(S, dtype=torch.int32)[None]
    from npu_lora.device.graphs import causal_mask

    mask = causal_mask(None, 1, S, h0.dtype)
    outs = []
    for backend in ("cpu", "furiosa"):
        blk.backend = backend
        h = h0.clone().requires_grad_(True)
        h_mid, x = blk(h, torch.zeros_like(h), pos, mask)
        (h_mid.square().sum() + x.sum()).backward()
        outs.append((h_mid.detach(), x.detach(), h.grad))
    blk.backend = "cpu"
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("S", [1024, 2048, 4096])
def test_step_at_long_rows(S):
    """A whole step at S = 1K-4K (tiny preset): finite loss, LoRA gradients, the head chunked
    (the label bucket over one chunk), sdpa attention."""
    from npu_lora.engine import build_engine

    eng = build_engine(
        make_spec(
            training={"seqLen": S, "batchSize": 1},
            moe={"expertsKernel": "npu_lora_stream", "hostDtype": "auto"},
        )
    )
    head = eng._head_module
    head.chunk_bytes = 256 * 512 * 4  # 256 positions a chunk at the tiny vocab
    randomize_lora(eng.model)
    batch = make_batch(B=1, S=S, answer=S // 2)
    prof = eng.forward_backward(batch)
    assert torch.isfinite(torch.tensor(prof.loss)) and prof.tokens == S
    grads = [p.grad for p in eng.adapter.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_keep_graph_auto_spec_values():
    from pydantic import ValidationError

    assert make_spec(moe={"keepGraph": None}).moe.keep_graph is None  # omitted: auto
    assert make_spec(moe={"keepGraph": False}).moe.keep_graph is False
    for word, hint in (("auto", "omit the field"), ("true", "without quotes"), ("x", "or omit")):
        with pytest.raises(ValidationError, match=f"moe.keepGraph is a YAML boolean.*{hint}"):
            make_spec(moe={"keepGraph": word})


def test_memory_estimate_grows_with_long_rows_and_sizes_kept_graphs():
    from npu_lora.api.memory import (
        HEADROOM,
        estimate,
        kept_graph_layers,
        long_row_bytes,
        preset_config,
        text_config,
    )

    cfg = text_config(preset_config("qwen3-30b-a3b"), 4)
    spec = make_spec(
        model={"preset": "qwen3-30b-a3b", "layers": 4},
        training={"seqLen": 4096, "batchSize": 1},
        moe={"keepGraph": None, "hostDtype": "bfloat16"},
    )
    long_est = estimate(spec, cfg)
    dt = 4  # device.dtype float32 (the tests' spec)
    S2 = 4096 * 4096
    # the mask (+ its booleans) and the label gather: S² terms; sdpa keeps no S² scores; the
    # head holds one chunk (3 × 64 rows × V fp32) and dhn
    head = 3 * 64 * 151_936 * 4 + 4096 * 2048 * 4
    assert long_row_bytes(spec, cfg) == S2 * (dt + 2) + S2 * dt + head
    short = make_spec(model={"preset": "qwen3-30b-a3b", "layers": 4}, training={"seqLen": 512})
    B, nh, S = 2, 32, 512  # eager attention below SDPA_MIN_SEQ: saved P per layer + scores
    eager = 4 * B * nh * S * S * dt + B * nh * S * S * 4
    assert (
        long_row_bytes(short, cfg)
        == B * S * S * (2 * dt + 2) + eager + 3 * B * 32 * 151_936 * 4 + B * S * 2048 * 4
    )
    per_layer = 4 * 4096 * 8 * 3 * 768  # one layer's kept graph (k=8 experts, I=768)
    assert kept_graph_layers(spec, cfg, None) == 4
    none = estimate(spec, cfg, kept_layers=0)
    assert long_est.total - none.total == 4 * per_layer
    for n in range(5):  # the limit that fits n kept layers exactly gives n
        est = estimate(spec, cfg, kept_layers=n)
        assert kept_graph_layers(spec, cfg, int(est.total * HEADROOM)) == n
    assert kept_graph_layers(spec, cfg, 1) == 0
    assert "1 keeping the MoE graph" in estimate(spec, cfg, kept_layers=1).describe()


def test_keep_graph_auto_recomputes_the_layers_over_budget(deterministic):
    """Kept in the last layer only: layer 0 recomputes, layer 1 reuses its graph, and the
    gradients equal keeping every graph bit for bit."""
    from npu_lora.engine import build_engine
    from npu_lora.engine.build import keep_graph_auto

    spec = make_spec(moe={"keepGraph": None})
    grads = []
    for n in (None, 1):
        eng = build_engine(spec)
        randomize_lora(eng.model)
        if n is not None:
            from npu_lora.api.memory import HEADROOM, estimate, model_widths

            est = estimate(spec, model_widths(spec), host_dtype="float32", kept_layers=n)
            choice = keep_graph_auto(eng, spec, (int(est.total * HEADROOM), "t"))
            assert choice["kept_layers"] == 1 and choice["kept"] == [1]
        eng.forward_backward(make_batch())
        mlps = eng.mlps
        if n is None:
            assert [m.reused for m in mlps] == [1, 1]
        else:
            assert [m.recomputed for m in mlps] == [1, 0] and [m.reused for m in mlps] == [0, 1]
        grads.append([p.grad.clone() for p in eng.adapter.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_plain_causal_rows_run_sdpa_is_causal_without_a_mask():
    from npu_lora.device.graphs import attention_mask_input, causal_mask

    S = SDPA_MIN_SEQ
    ones = torch.ones(1, S, dtype=torch.long)
    assert attention_mask_input(ones, 1, S, torch.float32, None, "cpu") is None
    assert attention_mask_input(None, 1, S, torch.float32, None, "cuda") is None
    padded = ones.clone()
    padded[0, -3:] = 0
    packed = torch.cat([torch.arange(S // 2), torch.arange(S // 2)])[None]
    for am, pid, backend, s in (
        (padded, None, "cpu", S),  # padding: the additive mask
        (ones, packed, "cpu", S),  # packed rows: block-diagonal
        (ones, None, "furiosa", S),  # the eager core takes a mask
        (ones[:, : S // 2], None, "cpu", S // 2),  # short rows: eager
    ):
        m = attention_mask_input(am, 1, s, torch.float32, pid, backend)
        torch.testing.assert_close(m, causal_mask(am, 1, s, torch.float32, pid), rtol=0, atol=0)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 64, 16, generator=g, requires_grad=True) for n in (4, 2, 2))
    res = []
    for mask in (causal_mask(None, 1, 64, torch.float32), None):
        o, _ = sdpa_attention(q, k, v, mask, 0.25)
        res.append([o, *torch.autograd.grad(o.square().sum(), (q, k, v))])
    for a, b in zip(res[1], res[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
