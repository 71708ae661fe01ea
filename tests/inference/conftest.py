"""One tiny finished run shared by the adapter (inference) tests (trained once per session, 4 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from adapter_helpers import tiny_manifest
from testkit import isolate_worker_env


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``npu-lora run`` on the tiny preset, 4 steps (in-process); returns the run directory."""
    from npu_lora.cli import main

    root = tmp_path_factory.mktemp("adapter-run")
    run_dir = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        isolate_worker_env(mp, root)
        rc = main(
            [
                "run",
                str(tiny_manifest(root / "tiny.yaml")),
                "--out",
                str(run_dir),
                "-q",
                "--no-plot",
                "--no-tensorboard",
            ]
        )
    assert rc == 0
    return run_dir


@pytest.fixture(autouse=True)
def _no_termination_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_worker_env(monkeypatch, tmp_path)
