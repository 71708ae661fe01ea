"""A new backend is one module and one register line: ``fakenpu`` (:mod:`fakenpu_backend`,
:mod:`fakenpu_plugin`) followed through the CRD, the policy, the operator, precompile, the
sandbox and the engine (:mod:`fakenpu_checks`, run in its own process: the API models take the
registry's names when they are first imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_a_new_backend_is_one_module_and_one_register_line_end_to_end(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("NPU_LORA_COMPILE_CACHE", None)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "fakenpu_plugin",
            "-p",
            "no:cacheprovider",
            str(HERE / "fakenpu_checks.py"),
        ],
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "6 passed" in out.stdout, out.stdout[-3000:]


def test_without_the_plugin_the_backend_is_unknown() -> None:
    from npu_lora.api import backends as registry

    assert "fakenpu" not in registry.names()
    with pytest.raises(ValueError, match="unknown device backend 'fakenpu'"):
        registry.entry("fakenpu")
