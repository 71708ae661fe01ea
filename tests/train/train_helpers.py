"""Helpers of the training-loop tests: CLI commands, in-process runs, run identities (unique
module name; the manifest and environment helpers are :mod:`testkit`'s)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import testkit
from testkit import REPO, cli_env, tiny_manifest

HERE = Path(__file__).resolve().parent
SHARED = REPO / ".." / "shared"
STANDIN = HERE / "standin_engine.py"


def cli_cmd(*args: str, standin: bool = False) -> list[str]:
    """``npu-lora ARGS`` as a subprocess command (real engine, or the stand-in engine)."""
    if standin:
        return [sys.executable, str(STANDIN), *args]
    return [sys.executable, "-m", "npu_lora.cli", *args]


def run_cli(*args: str, standin: bool = False, timeout: float = 300, **env: str):
    """``npu-lora ARGS`` in a subprocess (real engine, or the stand-in engine)."""
    argv0 = [sys.executable, str(STANDIN)] if standin else None
    return testkit.run_cli(*args, argv0=argv0, timeout=timeout, **env)


def run_in_process(cfg: Path, out: Path, *extra: str) -> int:
    """``npu-lora run CFG --out OUT`` in this process, quiet, no plot."""
    from npu_lora.cli import main

    return main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot", *extra])


def as_run(monkeypatch: Any, namespace: str, uid: str) -> None:
    """Act as the worker of the MoEFinetune ``namespace``/``uid``."""
    monkeypatch.setenv("NPU_LORA_RESOURCE_NAMESPACE", namespace)
    monkeypatch.setenv("NPU_LORA_RESOURCE_UID", uid)


def snapshot(d: Path) -> dict[str, int]:
    """Every file under ``d`` with its modification time (to show nothing was touched)."""
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}


def records(run_dir: Path) -> list[dict]:
    """The run's step records (``metrics.jsonl``)."""
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]


def adapter_tensors(run_dir: Path) -> dict[str, Any]:
    """The run's saved LoRA adapter (``adapter/adapter_model.safetensors``)."""
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest elementwise difference between two state dicts of the same keys."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


__all__ = ["REPO", "SHARED", "STANDIN", "cli_cmd", "cli_env", "run_cli", "tiny_manifest"]
