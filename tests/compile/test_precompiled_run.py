"""A precompiled run compiles nothing: `npu-lora run` with every key of its plan in the cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from npu_lora.api.load import load_manifest
from npu_lora.compile import cache
from npu_lora.compile.plan import compile_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_helpers import tiny_manifest


def test_precompiled_run_compiles_nothing(tmp_path, monkeypatch):
    from npu_lora.cli import main

    cfg = tiny_manifest(
        tmp_path, moe={"placement": "host-only"}, training={"steps": 2, "seqLen": 64}
    )
    root = tmp_path / "graphs"
    plan = compile_plan(load_manifest(cfg).spec, backend="cpu")
    for k in plan.keys:  # what the precompile pods would have published
        cache.publish(root, k, lambda tmp: {"precompiled": True})
    monkeypatch.setenv(cache.ENV_ROOT, str(root))
    import npu_lora.compile.precompile as pc

    def refuse(*a, **k):
        raise AssertionError("the run compiled a graph")

    monkeypatch.setattr(pc, "compile_entry", refuse)
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    rec = json.loads((out / "summary.json").read_text())["compile"]
    assert rec["total"] == len(plan.entries) == rec["hits"]
    assert (rec["misses"], rec["compiled"]) == (0, 0)
    assert [g["name"] for g in rec["graphs"]] == [e.name for e in plan.entries]
    assert all(g["hit"] and g["outcome"] == "hit" for g in rec["graphs"])
