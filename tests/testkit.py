"""Helpers shared by more than one test folder (one helper for each fact). Importable from every
test module: ``tests/conftest.py`` puts this folder on ``sys.path``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_manifest(tmp_path: Path, name: str = "t", **spec_over: Any) -> Path:
    """A small MoEFinetune manifest file (``tmp_path/<name>.yaml``) on the tiny preset and the
    shipped NSMC sample; ``spec_over``: sections merged into the spec."""
    spec: dict[str, Any] = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:nsmc-mini"},
        "moe": {"placement": "hot", "warmupSteps": 2},
        "training": {"steps": 12, "seqLen": 64, "batchSize": 2, "learningRate": 5e-3},
        "device": {"backend": "cpu", "cards": 0},
        "checkpoint": {"everySteps": 5},
    }
    for section, values in spec_over.items():
        spec.setdefault(section, {}).update(values)
    doc = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": name},
        "spec": spec,
    }
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return p


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment for an ``npu-lora`` subprocess: offline, unbuffered, not
    inside a MoEFinetune."""
    env = dict(os.environ)
    env.pop("NPU_LORA_RESOURCE_NAME", None)
    env.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.update(extra)
    return env


def run_cli(
    *args: str,
    argv0: list[str] | None = None,
    stdin: str | None = None,
    timeout: float = 300,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``npu-lora ARGS`` in a subprocess from the repository root (``argv0``: another entry
    point, e.g. the stand-in engine's); stdin a pipe (``stdin``, else empty)."""
    return subprocess.run(
        [*(argv0 or [sys.executable, "-m", "npu_lora.cli"]), *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**env),
        cwd=str(REPO),
    )


def isolate_worker_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An in-process run writes its termination message under ``tmp_path`` and does not think
    it runs inside a MoEFinetune."""
    monkeypatch.setenv("NPU_LORA_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.delenv("NPU_LORA_RESOURCE_NAME", raising=False)
