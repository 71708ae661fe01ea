"""Host experts on reserved 2 MiB pages (hugetlb) where the pod has them, THP otherwise
(npu_lora.moe.pages), and the budget they come from (npu_lora.machine.hugetlb_budget)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from npu_lora.machine import huge_page_bytes, hugetlb_budget
from npu_lora.moe import pages

HUGE = 2 << 20


def _meminfo(tmp_path: Path, free: int, rsvd: int = 0, size_kb: int = 2048) -> str:
    p = tmp_path / "meminfo"
    p.write_text(
        f"MemTotal:       1000 kB\nHugePages_Total:   {free + 5}\nHugePages_Free:    {free}\n"
        f"HugePages_Rsvd:    {rsvd}\nHugepagesize:       {size_kb} kB\n"
    )
    return str(p)


def test_budget_is_the_free_pool_capped_by_the_cgroup_room(tmp_path):
    info = _meminfo(tmp_path, free=100, rsvd=10)
    cg = tmp_path / "cg"
    cg.mkdir()

    def budget(meminfo: str = info) -> int:
        return hugetlb_budget(HUGE, meminfo=meminfo, cgroup=str(cg))

    assert budget() == 90 * HUGE  # no cgroup limit: the pool's free pages less reservations
    # cgroup v2, a pod's hugepages-2Mi: 64 MiB, 16 MiB used -> 48 MiB
    (cg / "hugetlb.2MB.max").write_text(str(64 << 20))
    (cg / "hugetlb.2MB.current").write_text(str(16 << 20))
    assert budget() == 48 << 20
    (cg / "hugetlb.2MB.max").write_text("max")
    assert budget() == 90 * HUGE
    # cgroup v1
    (cg / "hugetlb.2MB.max").unlink()
    (cg / "hugetlb").mkdir()
    (cg / "hugetlb" / "hugetlb.2MB.limit_in_bytes").write_text(str(8 << 20))
    assert budget() == 8 << 20
    # another default page size: none of the pool's pages is 2 MiB
    assert budget(_meminfo(tmp_path, free=4, size_kb=1 << 20)) == 0


def _block(E: int, H: int, inter: int):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=inter, num_experts=E)
    block = torch.nn.Module()
    block.experts = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        for p in block.experts.parameters():
            p.normal_(0, 0.02)
    return block


def test_reserved_pages_first_then_thp_for_what_does_not_fit(monkeypatch):
    """gate_up 4 MiB, down 2 MiB (fp32) per block; a budget of 8 MiB takes the first block's
    two tensors (6 MiB) and, of the second, neither (4 MiB > 2 MiB left; 2 MiB down fits):
    greedy in block order, as api.memory.hugepage_expert_bytes counts it."""
    monkeypatch.setattr(pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(pages, "hugetlb_budget", lambda huge=None: 8 << 20)
    made = []

    def fake_hugetlb(t):  # the allocation a pool would give; the placement logic is the test
        out = pages.relocate(t)
        made.append(out.data_ptr())
        return out

    monkeypatch.setattr(pages, "relocate_hugetlb", fake_hugetlb)
    monkeypatch.setattr(pages, "resident_hugetlb_bytes", lambda ts: sum(t.nbytes for t in ts))
    monkeypatch.delenv(pages.ENV, raising=False)
    blocks = [_block(E=8, H=256, inter=256), _block(E=8, H=256, inter=256)]
    before = [p.detach().clone() for b in blocks for p in b.experts.parameters()]
    info = pages.place_experts(blocks)
    assert info["hugetlb_tensors"] == 3 and info["hugetlb_bytes"] == (4 + 2 + 2) << 20
    assert info["placed_tensors"] == 1 and info["placed_bytes"] == 4 << 20  # THP: the rest
    after = [p.detach() for b in blocks for p in b.experts.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # the same split as the torch-free estimate's
    from types import SimpleNamespace

    from npu_lora.api.memory import hugepage_expert_bytes

    spec = SimpleNamespace(moe=SimpleNamespace(host_dtype="float32"))
    cfg = {
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_experts": 8,
        "moe_intermediate_size": 256,
    }
    assert hugepage_expert_bytes(spec, cfg, 8 << 20) == info["hugetlb_bytes"]


@pytest.mark.parametrize("env", ["0", "thp"])
def test_the_switch_keeps_experts_off_reserved_pages(monkeypatch, env):
    monkeypatch.setattr(pages, "thp_mode", lambda: "never")
    monkeypatch.setattr(pages, "hugetlb_budget", lambda huge=None: 1 << 30)
    monkeypatch.setenv(pages.ENV, env)
    info = pages.place_experts([_block(E=8, H=256, inter=256)])
    assert info.get("hugetlb_tensors", 0) == 0 and info["placed_tensors"] == 0


@pytest.mark.skipif(hugetlb_budget() < 2 * HUGE, reason="no free 2 MiB pages in the pool here")
def test_relocate_hugetlb_on_a_real_pool():
    t = torch.randn(HUGE // 4 + 7)
    out = pages.relocate_hugetlb(t)
    assert out is not None and torch.equal(out, t) and out.data_ptr() % huge_page_bytes() == 0
    assert pages.resident_hugetlb_bytes([out]) == 2 * HUGE
