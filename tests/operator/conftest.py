"""Fixtures of tests/sandbox/conftest.py (emulator, kubeconfig, kubectl, kubelet, wait_for),
re-exported for the operator tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "sandbox" / "conftest.py"
_spec = importlib.util.spec_from_file_location("_npu_lora_sandbox_fixtures", _path)
assert _spec is not None and _spec.loader is not None
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)

emulator = _mod.emulator
kubeconfig = _mod.kubeconfig
kubectl = _mod.kubectl
kubelet = _mod.kubelet
api_client = _mod.api_client
wait_for = _mod.wait_for_fixture
