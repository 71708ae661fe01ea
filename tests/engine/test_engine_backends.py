"""Backend selection, call counting, and the furiosa import guard."""

from __future__ import annotations

import sys

import pytest
import torch
from npu_lora.backends import CpuBackend, get_backend


def test_cpu_and_auto():
    be = get_backend("cpu")
    assert be.name == "cpu" and be.device == torch.device("cpu")
    auto = get_backend("auto")
    if not torch.cuda.is_available():
        assert auto.name in ("cpu", "furiosa")
    with pytest.raises(ValueError):
        get_backend("tpu")


def test_call_counting():
    be = CpuBackend()
    assert be.call("attention", lambda a: a + 1, torch.ones(2), layer=0).tolist() == [2, 2]
    be.call("attention", torch.neg, torch.ones(1), layer=1)
    be.call("head", torch.neg, torch.ones(1))
    assert be.calls_by_name == {"attention": 2, "head": 1}
    assert be.calls_per_layer(2) == 1.0
    be.reset_counts()
    assert be.calls_per_layer(2) == 0.0


def test_package_imports_without_furiosa(monkeypatch):
    """furiosa-torch absent (made unimportable): the engine imports without pulling it in,
    ``auto`` falls back, and an explicit ``furiosa`` backend fails with a clear error."""
    import npu_lora.backends as b
    import npu_lora.engine  # noqa: F401

    if "furiosa.torch" not in sys.modules:  # not autoloaded by torch in this venv
        assert "furiosa" not in sys.modules
    monkeypatch.setitem(sys.modules, "furiosa", None)
    monkeypatch.setitem(sys.modules, "furiosa.torch", None)
    assert not b.furiosa_available()
    assert b.get_backend("auto").name in ("cpu", "cuda")
    with pytest.raises(RuntimeError, match="furiosa-torch"):
        b.get_backend("furiosa")


def test_only_backends_furiosa_imports_furiosa():
    """In the engine core, ``backends/furiosa.py`` is the only module importing furiosa."""
    from pathlib import Path

    import npu_lora

    root = Path(npu_lora.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for folder in ("engine", "moe", "models", "device", "backends")
        for p in (root / folder).rglob("*.py")
        if p.name != "furiosa.py"
        and any(
            line.lstrip().startswith(("import furiosa", "from furiosa"))
            for line in p.read_text().splitlines()
        )
    ]
    assert offenders == []
