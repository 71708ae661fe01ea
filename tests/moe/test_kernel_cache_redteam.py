"""A kernel cache's ``kernel.json`` edited or planted by hand (red-team pass, issue 38): without
a compiler the loader looks through every build's record; one that is not what a build writes
is skipped (the torch path), never a traceback in the run."""

from __future__ import annotations

import json

import pytest
from npu_lora.moe import kernels

#: kernel.json documents a build never writes
PLANTED = [{"key": "x"}, {"key": ["a"]}, {"key": 5}, "[" * 100_000 + "]" * 100_000]


@pytest.mark.parametrize("doc", PLANTED)
def test_without_a_compiler_a_planted_record_is_skipped(monkeypatch, tmp_path, doc):
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("NPU_LORA_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("NPU_LORA_STREAM_EXT", raising=False)
    monkeypatch.setattr(kernels, "compiler_id", lambda: "none")
    root = tmp_path / "kernels"
    d = root / f"{kernels.PREFIX}_0000000000000000"
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    assert kernels._published_without_compiler(root, kernels.key_parts()) is None
    assert kernels.status()["state"] == "not built"
