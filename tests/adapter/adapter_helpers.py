"""Helpers of the adapter tests (unique module name)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def tiny_manifest(path: Path, steps: int = 4) -> Path:
    doc = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "adapter-test"},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:nsmc-mini"},
            "moe": {"placement": "host-only"},
            "training": {"steps": steps, "seqLen": 64, "batchSize": 2, "learningRate": 1e-2},
            "device": {"backend": "cpu", "cards": 0},
            "checkpoint": {"everySteps": steps},
        },
    }
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return path


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NPU_LORA_RESOURCE_NAME", None)
    env.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


def nsmc_rows(path: Path, n: int) -> Path:
    """The first ``n`` rows of the shipped NSMC sample."""
    src = REPO / "worker" / "npu_lora" / "data" / "examples" / "nsmc-mini.tsv"
    lines = src.read_text(encoding="utf-8").splitlines()[: n + 1]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_cli(*args: str, stdin: str | None = None, timeout: float = 300):
    """``npu-lora ARGS`` in a subprocess (stdin a pipe)."""
    return subprocess.run(
        [sys.executable, "-m", "npu_lora.cli", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        cwd=str(REPO),
    )
