"""The emulator fixtures (:mod:`sandbox_fixtures`) for the operator tests."""

from __future__ import annotations

from sandbox_fixtures import (
    api_client,
    emulator,
    kubeconfig,
    kubectl,
    kubelet,
    wait_for_fixture,
)

__all__ = ["api_client", "emulator", "kubeconfig", "kubectl", "kubelet", "wait_for_fixture"]
