"""e2e fixtures: the API emulator + local kubelet in-process, the real kopf operator as a
subprocess (``npu-lora operator``), the real kubectl. Helpers live in ``e2e_harness.py``.

- ``cluster``: emulator, kubelet (root ``tmp_path/sandbox``), kubeconfig, kubectl, the CRD applied
  with ``kubectl apply -f crds/...``.
- ``operator``: an :class:`OperatorProcess` (started; ``kill()``, ``start()``, ``log()``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import CRD_FILE, Cluster, OperatorProcess, sandbox_fixtures, wait_until

emulator = sandbox_fixtures.emulator
kubeconfig = sandbox_fixtures.kubeconfig
kubectl = sandbox_fixtures.kubectl


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def cluster(emulator: Any, kubeconfig: Path, kubectl: Any, tmp_path: Path) -> Iterator[Cluster]:
    from npu_lora_sandbox.kubelet import LocalKubelet

    kubectl("apply", "-f", str(CRD_FILE))
    wait_until(lambda: kubectl("get", "mft", check=False).returncode == 0, timeout=10)
    kl = LocalKubelet(emulator, root=tmp_path / "sandbox", backoff_seconds=0.2).start()
    try:
        yield Cluster(emulator, kl, kubeconfig, kubectl)
    finally:
        kl.stop()


@pytest.fixture
def operator(cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster.kubeconfig, tmp_path).start()
    try:
        yield op
    finally:
        op.stop()
