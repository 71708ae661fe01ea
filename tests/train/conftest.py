"""Fixtures of the training-loop tests (helpers live in ``train_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from testkit import isolate_worker_env
from train_helpers import HERE


@pytest.fixture
def standin(monkeypatch):
    """In-process ``npu-lora run`` builds the stand-in engine; yields the list of engines built."""
    sys.path.insert(0, str(HERE))
    try:
        import standin_engine
    finally:
        sys.path.remove(str(HERE))
    import npu_lora.commands.run as run_cmd

    built: list[Any] = []

    def factory(spec, vocab_size):
        eng = standin_engine.StandinEngine(spec, vocab_size)
        built.append(eng)
        return eng

    monkeypatch.setattr(run_cmd, "build_engine", factory)
    return built


@pytest.fixture(autouse=True)
def _no_termination_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_worker_env(monkeypatch, tmp_path)
