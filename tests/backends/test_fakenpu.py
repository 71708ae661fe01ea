"""A new backend is one module and one register line: ``fakenpu`` followed end to end.

A copy of the tree gets :mod:`fakenpu` as ``npu_lora/backends/fakenpu.py`` and :data:`REGISTER`
appended to ``npu_lora/api/backends.py``, nothing else; :mod:`fakenpu_checks` then runs on that
copy, in a process of its own, and follows the backend through the CRD, the policy, the
operator's Job, precompile, the sandbox's node and the engine (a tiny ``npu-lora run``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: the one register line (as the three in ``npu_lora/api/backends.py``)
REGISTER = """register(BackendEntry("fakenpu", "npu_lora.backends.fakenpu:FakeNpuBackend", cards=True, resource="fakenpu.example/card", summary="a test-only NPU the host stands in for", host=True, compile_device="cpu", cache_folder="fakenpu-cache", node_keys=("fakenpu.example/*",), taint_keys=("fakenpu.example/card",), sandbox_cards=2, node=NodeFacts(family_label="fakenpu.example/family", family="fakenpu", product_label="fakenpu.example/product", products=("fakenpu-1",))))  # fmt: skip
"""


def tree_with_fakenpu(dest: Path) -> Path:
    """A copy of worker/ and operator/ with the fakenpu module and its register line."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "build", "*.egg-info")
    for top in ("worker", "operator"):
        shutil.copytree(ROOT / top, dest / top, ignore=skip)
    shutil.copy(HERE / "fakenpu.py", dest / "worker/npu_lora/backends/fakenpu.py")
    reg = dest / "worker/npu_lora/api/backends.py"
    reg.write_text(reg.read_text(encoding="utf-8") + REGISTER, encoding="utf-8")
    return dest


@pytest.mark.slow
def test_a_new_backend_is_one_module_and_one_register_line_end_to_end(tmp_path: Path) -> None:
    tree = tree_with_fakenpu(tmp_path / "tree")
    env = dict(os.environ)
    paths = [str(tree / "worker"), str(tree / "operator"), str(ROOT / "tests")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("NPU_LORA_COMPILE_CACHE", None)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(HERE / "fakenpu_checks.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "7 passed" in out.stdout, out.stdout[-3000:]


def test_the_checks_fail_without_the_register_line(tmp_path: Path) -> None:
    """The end-to-end checks cannot pass on a tree without fakenpu (the first one, cheap)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{HERE / 'fakenpu_checks.py'}::test_the_tree_registers_it_from_its_own_module",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1 and "1 failed" in out.stdout, out.stdout[-3000:]
