"""The worker's layers hold (``[tool.importlinter]`` in pyproject.toml, docs/architecture.md).

``lint-imports`` checks every import, also those inside functions: the layer order of
``npu_lora``'s packages, no cycle between the modules of one package, the operator without
torch / the engine / the ML stack, and the worker without the operator packages. A second test
adds an upward import to a copy of the tree and expects the check to fail, so the contracts
cannot pass by checking nothing (a wrong root, a renamed package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def _lint(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the packages under ``src`` (worker/ and operator/)."""
    env = dict(os.environ)
    paths = [str(src / "worker"), str(src / "operator")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True, no_logo=True))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_are_kept(tmp_path: Path) -> None:
    out = _lint(ROOT, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_an_upward_import_inside_a_function_breaks_the_layers(tmp_path: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "build")
    for top in ("worker", "operator"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=skip)
    variant = tmp_path / "worker/npu_lora/api/variant.py"
    variant.write_text(
        variant.read_text() + "\n\ndef _up():\n    from npu_lora.bench import harness  # noqa\n"
    )
    out = _lint(tmp_path, tmp_path)
    assert out.returncode != 0, out.stdout
    assert "npu_lora.api is not allowed to import npu_lora.bench" in out.stdout, out.stdout


def test_the_sandbox_contracts_break_on_an_engine_import_and_on_the_operators_insides(
    tmp_path: Path,
) -> None:
    """``sandbox-no-engine``: an import of the engine inside a function of the sandbox;
    ``sandbox-public-face``: a direct import of the operator's builders (its insides, not its
    public face). Each plant breaks its own contract."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "build")
    for top in ("worker", "operator"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=skip)
    table = tmp_path / "operator/npu_lora_sandbox/table.py"
    table.write_text(
        table.read_text() + "\n\ndef _engine():\n    from npu_lora.engine import build  # noqa\n"
    )
    selectors = tmp_path / "operator/npu_lora_sandbox/selectors.py"
    selectors.write_text(
        selectors.read_text()
        + "\n\ndef _inside():\n    from npu_lora_operator import builders  # noqa\n"
    )
    out = _lint(tmp_path, tmp_path)
    assert out.returncode != 0, out.stdout
    text = " ".join(out.stdout.split())
    assert "the ML stack or the engine, on any path BROKEN" in text, out.stdout
    assert "only the API and the operator's public face BROKEN" in text, out.stdout
    assert "npu_lora_sandbox.table -> npu_lora.engine" in text, out.stdout
    assert "npu_lora_sandbox.selectors -> npu_lora_operator.builders" in text, out.stdout


def _contract(contract_id: str) -> dict:
    import tomllib

    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["id"] == contract_id)


def test_the_operator_may_import_only_the_api_and_the_compile_plan_of_the_worker() -> None:
    """``operator-worker-face`` forbids every worker package and module but ``npu_lora.api``
    (the shape rules included: ``api.sizing``) and ``npu_lora.compile.plan``: the list is the
    worker's tree, so a new package is forbidden to the operator until someone says otherwise."""
    pkg = ROOT / "worker/npu_lora"
    top = {p.stem for p in pkg.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    compile_modules = {p.stem for p in (pkg / "compile").glob("*.py")}
    want = {f"npu_lora.{m}" for m in top - {"__init__", "api", "compile"}}
    want |= {f"npu_lora.compile.{m}" for m in compile_modules - {"__init__", "plan"}}
    assert set(_contract("operator-worker-face")["forbidden_modules"]) == want
    torch_free = _contract("torch-free")
    assert set(torch_free["source_modules"]) == {"npu_lora.api", "npu_lora.compile.plan"}
    assert "torch" in torch_free["forbidden_modules"]


def test_planted_imports_break_the_torch_free_and_operator_contracts(tmp_path: Path) -> None:
    """The compile plan reaching torch through a worker module (inside a function: every import
    counts), and the operator importing a worker module beyond its face, each break their
    contract in a copy of the tree."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "build")
    for top in ("worker", "operator"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=skip)
    plan = tmp_path / "worker/npu_lora/compile/plan.py"
    plan.write_text(plan.read_text() + "\n\ndef _t():\n    from npu_lora.moe import hot  # noqa\n")
    op = tmp_path / "operator/npu_lora_operator/settings.py"
    op.write_text(op.read_text() + "\n\ndef _m():\n    from npu_lora import machine  # noqa\n")
    out = _lint(tmp_path, tmp_path)
    assert out.returncode != 0, out.stdout
    text = " ".join(out.stdout.split())  # lint-imports wraps long lines
    assert "npu_lora.compile.plan is not allowed to import torch" in text, out.stdout
    assert "npu_lora_operator is not allowed to import npu_lora.machine" in text, out.stdout
    assert "npu_lora.api is not allowed" not in text, out.stdout  # only the planted ones
