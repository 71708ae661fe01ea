"""Helpers of the training-loop tests: tiny manifests, CLI commands (unique module name)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHARED = REPO / ".." / "shared"
STANDIN = HERE / "standin_engine.py"


def tiny_manifest(tmp_path: Path, name: str = "t", **spec_over: Any) -> Path:
    """A small MoEFinetune manifest file on the tiny preset + the shipped NSMC sample."""
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
    env = dict(os.environ)
    env.pop("NPU_LORA_RESOURCE_NAME", None)
    env.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.update(extra)
    return env


def cli_cmd(*args: str, standin: bool = False) -> list[str]:
    """``npu-lora ARGS`` as a subprocess command (real engine, or the stand-in engine)."""
    if standin:
        return [sys.executable, str(STANDIN), *args]
    return [sys.executable, "-m", "npu_lora.cli", *args]


def run_cli(*args: str, standin: bool = False, timeout: float = 300, **env: str):
    return subprocess.run(
        cli_cmd(*args, standin=standin),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**env),
        cwd=str(REPO),
    )
