"""Smoke tests of the built images (marker ``images``): skipped, with the reason, unless podman
can run containers here and the images exist (``scripts/build-images.sh`` builds them) and were
built from this tree's sources (their ``io.npu-lora.source-digest`` label, scripts/source_digest.py).
In CI (``CI=true``, or ``NPU_LORA_REQUIRE_IMAGES=1``) they fail instead of skipping: ``.ci/run``
builds the images first, so a missing or stale image there is a failure, not a reason to skip.

- ``images``: ``{"operator": ..., "worker": ..., "worker-cpu": ...}`` image names (session).
- ``podman``: run ``podman ARGS`` with the project's containers.conf (``CompletedProcess``, text).
- ``kubectl_for(kubeconfig)``: the real kubectl against another API (e.g. a started sandbox).
- the sandbox fixtures of tests/sandbox/conftest.py (``emulator``, ``kubeconfig``, ``kubectl``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sandbox_fixtures

emulator = sandbox_fixtures.emulator
kubeconfig = sandbox_fixtures.kubeconfig
kubectl = sandbox_fixtures.kubectl
wait_for = sandbox_fixtures.wait_for

_dpath = Path(__file__).resolve().parents[2] / "scripts" / "source_digest.py"
_dspec = importlib.util.spec_from_file_location("_npu_lora_source_digest", _dpath)
assert _dspec is not None and _dspec.loader is not None
_digest = importlib.util.module_from_spec(_dspec)
_dspec.loader.exec_module(_digest)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/images/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.images)


def _podman(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    from npu_lora_sandbox.podman import podman_env

    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_env()
    )


def images_required() -> bool:
    """In CI the images must be there (``.ci/run`` builds them before the tests)."""
    return (
        os.environ.get("CI", "").lower() == "true"
        or os.environ.get("NPU_LORA_REQUIRE_IMAGES") == "1"
    )


def _unusable(why: str) -> None:
    if images_required():
        pytest.fail(f"{why} (CI builds the images first: scripts/build-images.sh in .ci/run)")
    pytest.skip(why)


def image_names(version: str) -> dict[str, str]:
    """The tags scripts/build-images.sh gives each Dockerfile target."""
    return {
        "operator": f"localhost/npu-lora-operator:{version}",
        "worker": f"localhost/npu-lora-worker:{version}",
        "worker-cpu": f"localhost/npu-lora-worker:{version}-cpu",
    }


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    from npu_lora import __version__
    from npu_lora_sandbox.podman import podman_available

    why = podman_available()
    if why:
        _unusable(f"podman cannot run containers here: {why}")
    out = image_names(__version__)
    missing = [i for i in out.values() if _podman("image", "exists", i).returncode != 0]
    if missing:
        _unusable(f"images not built: {', '.join(missing)} (scripts/build-images.sh)")
    want = _digest.source_digest(Path(__file__).resolve().parents[2])
    for image in out.values():
        got = _podman(
            "image", "inspect", "--format", f'{{{{index .Labels "{_digest.LABEL}"}}}}', image
        ).stdout.strip()
        if got != want:
            _unusable(
                f"{image} was built from other sources (label {_digest.LABEL}={got or 'none'}, "
                f"this tree {want}): rerun scripts/build-images.sh"
            )
    return out


@pytest.fixture(name="podman")
def podman_fixture() -> Callable[..., subprocess.CompletedProcess[str]]:
    return _podman


@pytest.fixture
def kubectl_for(tmp_path: Path) -> Callable[[Path], Any]:
    """``kubectl_for(kubeconfig)``: the real kubectl against that kubeconfig."""
    if sandbox_fixtures.KUBECTL is None:
        pytest.skip("kubectl is not installed")
    return lambda kc: sandbox_fixtures.Kubectl(kc, tmp_path / "kubectl-cache")


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    return wait_for


REPO = Path(__file__).resolve().parents[2]


def _untracked() -> set[str]:
    res = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
    )
    lines = res.stdout.splitlines() if res.returncode == 0 else []
    return {line[3:] for line in lines if line.startswith("?? ")}


@pytest.fixture(autouse=True, scope="module")
def leaves_the_working_tree_clean() -> Any:
    """The image smoke tests write nothing into the checkout (an OOM test once left an empty
    ``oom`` file in the repository root)."""
    before = _untracked()
    yield
    left = sorted(_untracked() - before)
    assert not left, f"the image tests left files in the working tree: {left}"
