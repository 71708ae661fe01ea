"""Helpers of the adapter tests (unique module name)."""

from __future__ import annotations

from pathlib import Path

import testkit
from testkit import REPO


def tiny_manifest(path: Path, steps: int = 4) -> Path:
    """The adapter tests' run: host-only, ``steps`` steps, a checkpoint at the end."""
    return testkit.tiny_manifest(
        path.parent,
        path.stem,
        moe={"placement": "host-only", "warmupSteps": 4},
        training={"steps": steps, "learningRate": 1e-2},
        checkpoint={"everySteps": steps},
    )


def nsmc_rows(path: Path, n: int) -> Path:
    """The first ``n`` rows of the shipped NSMC sample."""
    src = REPO / "worker" / "npu_lora" / "data" / "examples" / "nsmc-mini.tsv"
    lines = src.read_text(encoding="utf-8").splitlines()[: n + 1]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_cli(*args: str, stdin: str | None = None, timeout: float = 300):
    """``npu-lora ARGS`` in a subprocess (stdin a pipe)."""
    return testkit.run_cli(*args, stdin=stdin, timeout=timeout)
