"""Shared fixtures for the RNGD tooling tests (stand-in graphs, the real device graphs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
STANDINS_PATH = HERE / "standins.py"


def load_standins() -> ModuleType:
    """tests/rngd/standins.py, whatever pytest's import mode."""
    name = "npu_lora_rngd_test_standins"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, STANDINS_PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def standins() -> ModuleType:
    return load_standins()
