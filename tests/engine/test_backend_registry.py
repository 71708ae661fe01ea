"""Backends are registered in one place (``npu_lora.api.backends``): a new backend is one module
and one registry line, and every list of backend names derives from the registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from npu_lora.api import backends as registry

FAKE_MODULE = '''
from npu_lora.backends.cpu import CpuBackend


class FakeBackend(CpuBackend):
    """A stand-in accelerator: the host computes, under another name."""

    name = "fake"
    made = []

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        FakeBackend.made.append(index)
'''


def test_a_new_backend_is_one_module_and_one_registry_line(tmp_path, monkeypatch, tiny):
    """A module written now and registered with one line is accepted by the engine factory
    (``build_engine(spec, backend=name)``), by ``get_backend`` and by the CLI choices; the
    engine trains on it."""
    from npu_lora.backends import backend_available, get_backend
    from npu_lora.engine import build_engine

    (tmp_path / "npu_lora_fake_backend.py").write_text(FAKE_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "fake" not in registry.names()
    registry.register(registry.BackendEntry("fake", "npu_lora_fake_backend:FakeBackend"))
    try:
        assert "fake" in registry.choices() and backend_available("fake")
        assert get_backend("fake", index=3).name == "fake"
        eng = build_engine(tiny.spec(), backend="fake")
        assert type(eng.backend).__name__ == "FakeBackend" and eng.backend.name == "fake"
        assert eng.hotset.device_gather  # the registry entry's default
        prof = eng.forward_backward(tiny.batch())
        assert prof.loss > 0 and prof.device_calls["head"] == 1
        assert get_backend("auto").name != "fake"  # auto keeps the registry's order
    finally:
        registry.unregister("fake")
    with pytest.raises(ValueError, match="unknown device backend 'fake'"):
        get_backend("fake")


def test_registry_drives_the_api_the_plan_and_the_operator():
    from npu_lora.api.v1alpha1 import DeviceSpec
    from npu_lora.backends import BACKENDS, backend_class
    from npu_lora.compile.plan import PLAN_BACKENDS

    schema = DeviceSpec.model_json_schema()["properties"]["backend"]
    assert schema["enum"] == list(registry.choices()) == list(BACKENDS)
    assert set(PLAN_BACKENDS) == set(registry.names())
    for name in registry.names():
        assert backend_class(name).name == name  # each entry names its own class
    assert registry.accelerators() == ("furiosa", "cuda")
    with pytest.raises(ValueError, match="cards must be at least 1"):
        DeviceSpec(backend="cuda", cards=0)
    from npu_lora.backends import CpuBackend

    assert CpuBackend().device_gather and not registry.entry("furiosa").device_gather
    assert CpuBackend(index=2).device == torch.device("cpu")  # one host: no card index


def test_no_other_module_lists_backend_names():
    """The names are listed once: no module but the registry holds a literal list of two or
    more of them (``("cpu", "cuda", "furiosa")`` and the like)."""
    import npu_lora
    import npu_lora_operator

    names = "|".join(registry.names())
    pair = re.compile(rf"""["']({names})["']\s*,\s*["']({names})["']""")
    roots = [Path(npu_lora.__file__).parent, Path(npu_lora_operator.__file__).parent]
    offenders = [
        f"{p.name}:{n}"
        for root in roots
        for p in root.rglob("*.py")
        if p.name != "backends.py" or p.parent.name != "api"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pair.search(line)
    ]
    assert not offenders, offenders
