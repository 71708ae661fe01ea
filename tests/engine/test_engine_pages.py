"""Host expert weights in transparent huge pages (npu_lora.moe.pages)."""

from __future__ import annotations

import io

import pytest
import torch
from npu_lora.engine import build_engine
from npu_lora.machine import huge_page_bytes, machine_facts, thp_mode
from npu_lora.moe import pages


def test_relocated_tensor_keeps_its_values_in_an_aligned_storage_of_its_own():
    huge = huge_page_bytes()
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.randn(3 * huge // 4 + 5, generator=g).to(dtype).view(-1, 1)  # not page-sized
        out = pages.relocate(t)
        assert out.dtype == dtype and out.shape == t.shape and torch.equal(out, t)
        assert out.data_ptr() != t.data_ptr() and out.data_ptr() % huge == 0
        # the storage is exactly the tensor: torch.save / safetensors see an ordinary tensor
        assert out.untyped_storage().nbytes() == t.numel() * t.element_size()
        out.add_(1)  # writable, private: the source is untouched
        assert not torch.equal(out, t)
        # what the run does with weights: save them, share them with local ranks
        buf = io.BytesIO()
        torch.save({"w": out}, buf)
        buf.seek(0)
        assert torch.equal(torch.load(buf)["w"], out)
        shared = pages.relocate(t)
        shared.share_memory_()
        assert shared.is_shared() and torch.equal(shared, t)
    strided = torch.arange(24.0).view(4, 6).t()  # non-contiguous source
    assert torch.equal(pages.relocate(strided), strided)
    with pytest.raises(ValueError, match="CPU tensor"):
        pages.relocate(torch.empty(1, device="meta"))


@pytest.mark.skipif(thp_mode() not in ("madvise", "always"), reason=f"THP is {thp_mode()}")
def test_relocated_weights_are_backed_by_huge_pages():
    """Where the kernel grants huge pages on request (THP madvise/always), a relocated tensor of
    four huge pages sits in at least one (fragmented memory may refuse some, never all here)."""
    huge = huge_page_bytes()
    t = torch.ones(4 * huge // 2, dtype=torch.bfloat16)
    plain = torch.ones_like(t)
    out = pages.relocate(t)
    assert pages.resident_huge_bytes([out]) >= huge
    if thp_mode() == "madvise":  # without asking, torch's own allocation got none
        assert pages.resident_huge_bytes([plain]) == 0


def _experts_block(E: int = 4, H: int = 256, inter: int = 256):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=inter, num_experts=E)
    block = torch.nn.Module()
    block.experts = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        for p in block.experts.parameters():
            p.normal_(0, 0.02)
    return block


def test_place_experts_moves_weights_of_a_huge_page_or_more(monkeypatch):
    monkeypatch.setattr(pages, "thp_mode", lambda: "madvise")
    huge = huge_page_bytes()
    big = _experts_block(E=8, H=256, inter=256)  # gate_up 2 MiB, down 1 MiB (fp32)
    small = _experts_block(E=2, H=64, inter=32)
    params = {n: p for b in (big, small) for n, p in b.named_parameters(prefix=str(id(b)))}
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in params.items()}
    big.experts.down_proj.requires_grad_(False)
    info = pages.place_experts([big, small])
    sizes = {p.numel() * p.element_size() for p in big.experts.parameters()}
    want = [p for b in (big, small) for p in b.experts.parameters() if p.numel() * 4 >= huge]
    assert info["placed_tensors"] == len(want) >= 1, (info, sizes)
    assert info["placed_bytes"] == sum(p.numel() * 4 for p in want)
    for n, p in params.items():
        moved = p.data_ptr() != before[n][0]
        assert moved == any(p is w for w in want), n
        assert torch.equal(p.detach(), before[n][1]), n  # same values, same Parameter object
    assert big.experts.gate_up_proj.requires_grad and not big.experts.down_proj.requires_grad
    assert info["thp"] == "madvise" and "reason" not in info


@pytest.mark.parametrize(
    ("mode", "env", "reason"),
    [
        ("never", None, "no THP"),
        (None, None, "no THP"),
        ("always", None, "THP always"),
        ("madvise", "0", "NPU_LORA_HUGEPAGES=0"),
    ],
)
def test_place_experts_leaves_weights_alone_where_asking_is_useless(monkeypatch, mode, env, reason):
    monkeypatch.setattr(pages, "thp_mode", lambda: mode)
    if env is None:
        monkeypatch.delenv(pages.ENV, raising=False)
    else:
        monkeypatch.setenv(pages.ENV, env)
    block = _experts_block(E=16, H=256, inter=256)
    ptr = block.experts.gate_up_proj.data_ptr()
    info = pages.place_experts([block])
    assert block.experts.gate_up_proj.data_ptr() == ptr
    assert info["placed_tensors"] == 0 and reason in info["reason"]


def test_engine_on_placed_experts_trains_bitwise_as_on_allocator_memory(tiny, monkeypatch):
    """The engine places its expert weights at build (tiny experts placed by shrinking the
    threshold), records it for summary.json, and a step with trained experts and bf16 storage
    gives bitwise the gradients, and after an optimizer step the weights, of unplaced ones."""
    monkeypatch.setattr(pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(pages, "huge_page_bytes", lambda: 4096)
    results = {}
    for env in ("1", "0"):
        monkeypatch.setenv(pages.ENV, env)
        spec = tiny.spec(
            moe={"hostDtype": "bfloat16", "expertsKernel": "npu_lora_stream"},
            lora={"trainExperts": True},
        )
        eng = build_engine(spec)
        info = machine_facts(eng)["experts_pages"]
        layers = len(eng.mlps)
        experts = [p for m in eng.mlps for p in (m.experts.gate_up_proj, m.experts.down_proj)]
        if env == "1":
            assert info["placed_tensors"] == 2 * layers and info["thp"] == "madvise"
            assert all(p.data_ptr() % 4096 == 0 for p in experts)
        else:
            assert info["placed_tensors"] == 0 and info["reason"] == "NPU_LORA_HUGEPAGES=0"
        tiny.randomize_lora(eng.model)
        opt = torch.optim.SGD(eng.adapter.parameters(), lr=0.1)
        eng.forward_backward(tiny.batch())
        grads = {n: p.grad.clone() for n, p in eng.adapter.named_parameters()}
        opt.step()
        results[env] = grads, [p.detach().clone() for p in experts]
    assert results["1"][0].keys() == results["0"][0].keys()
    assert any("experts.gate_up_proj" in n for n in results["1"][0])
    for n, g in results["1"][0].items():
        assert torch.equal(g, results["0"][0][n]), n
    for a, b in zip(results["1"][1], results["0"][1], strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)
