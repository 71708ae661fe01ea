"""The emulator fixtures (:mod:`sandbox_fixtures`) for the sandbox tests."""

from __future__ import annotations

from sandbox_fixtures import (
    api_client,
    emulator,
    kubeconfig,
    kubectl,
    kubelet,
    make_crd_fixture,
    wait_for_fixture,
)

__all__ = [
    "api_client",
    "emulator",
    "kubeconfig",
    "kubectl",
    "kubelet",
    "make_crd_fixture",
    "wait_for_fixture",
]
