"""The test tree mirrors the source: every folder under tests/ is named after a source package
(a worker package, the operator or the sandbox) or is one of the few kinds of test that span
packages; shared helpers live in one module each (docs/development.md)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
#: folders that test a product or a machine rather than one package
KINDS = {
    "e2e": "the operator, the sandbox and the worker together, through kubectl",
    "ship": "the chart, the Dockerfile, the examples and RBAC as shipped",
    "images": "the built container images (podman)",
    "gpu": "the CUDA backend on a GPU machine",
    "experiments": "the lab notebook's scripts and budget",
}
#: the source packages a test folder may be named after
OPERATOR_PACKAGES = {"operator": "npu_lora_operator", "sandbox": "npu_lora_sandbox"}


def _folders() -> list[str]:
    return sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__")


def test_every_test_folder_is_a_source_package_or_a_kind() -> None:
    worker = {
        p.name for p in (REPO / "worker" / "npu_lora").iterdir() if (p / "__init__.py").exists()
    }
    for name in _folders():
        ok = name in worker or name in KINDS
        ok = ok or (REPO / "operator" / OPERATOR_PACKAGES.get(name, "-") / "__init__.py").exists()
        assert ok, f"tests/{name}: no source package of that name and not one of {sorted(KINDS)}"


def test_the_largest_packages_have_their_own_folder() -> None:
    for name in ("api", "moe", "engine", "train", "bench", "inference", "operator", "sandbox"):
        assert (TESTS / name).is_dir(), name


def test_helper_modules_have_unique_names() -> None:
    """Folders without ``__init__.py`` share one ``sys.path``: a helper module name used twice
    would import the wrong file."""
    seen: dict[str, Path] = {}
    for p in TESTS.rglob("*.py"):
        if p.name.startswith(("test_", "conftest")) or (p.parent / "__init__.py").exists():
            continue
        assert p.stem not in seen, (p, seen[p.stem])
        seen[p.stem] = p
