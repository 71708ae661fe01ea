"""Fixtures for tests against the in-process API emulator, shared by the sandbox, operator, e2e
and image tests (each folder's conftest re-exports the ones it uses).

- ``emulator``: a started :class:`ApiEmulator` on a free port (stopped afterwards).
- ``kubeconfig``: a kubeconfig file for it.
- ``kubectl``: run the real kubectl against it: ``kubectl("get", "pods", "-o", "json")`` returns a
  ``CompletedProcess`` (text mode); ``check=True`` (default) fails the test on a non-zero exit,
  ``input=`` feeds stdin (e.g. ``kubectl("apply", "-f", "-", input=yaml_text)``).
  ``kubectl.popen(...)`` starts it in the background (e.g. ``get -w``). Skipped without kubectl.
- ``api_client``: a ``kubernetes.client.ApiClient`` bound to the emulator.
- ``kubelet``: a started :class:`LocalKubelet` with its root in ``tmp_path / "sandbox"``.
- ``wait_for(predicate, timeout=10, interval=0.05)``: poll until truthy, return the value.
- ``make_crd(...)``: a small test CRD (``widgets.example.com``, kind ``Widget``) to customise.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet

KUBECTL = shutil.which("kubectl")

WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "x-kubernetes-validations": [
                {"rule": "self.size <= self.maxSize", "message": "size must not exceed maxSize"},
                {
                    "rule": "self.size == oldSelf.size || self.mutable",
                    "message": "size is immutable unless mutable",
                },
            ],
            "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 100},
                "maxSize": {"type": "integer", "default": 10},
                "mutable": {"type": "boolean", "default": False},
                "color": {"type": "string", "enum": ["red", "green", "blue"], "default": "red"},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8, "minLength": 2},
                "rate": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
                "tags": {"type": "array", "maxItems": 3, "items": {"type": "string"}},
                "port": {"x-kubernetes-int-or-string": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "note": {"type": "string", "nullable": True},
                "training": {
                    "type": "object",
                    "properties": {"steps": {"type": "integer"}, "seqLen": {"type": "integer"}},
                    "x-kubernetes-validations": [
                        {
                            "rule": "self.steps > 0 && self.seqLen % 8 == 0",
                            "messageExpression": "'steps must be positive and seqLen a multiple of 8, got ' + string(self.seqLen)",
                        }
                    ],
                },
            },
        },
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}


def make_crd(
    *,
    group: str = "example.com",
    kind: str = "Widget",
    plural: str = "widgets",
    schema: dict[str, Any] | None = None,
    scope: str = "Namespaced",
    printer_columns: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    columns = printer_columns
    if columns is None:
        columns = [
            {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
            {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            },
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "shortNames": ["wd"],
                "categories": ["examples"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": copy.deepcopy(schema or WIDGET_SCHEMA)},
                }
            ],
        },
    }


def widget(name: str, size: int = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": size, **spec},
    }


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


@pytest.fixture
def emulator() -> Iterator[ApiEmulator]:
    emu = ApiEmulator().start()
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def kubeconfig(emulator: ApiEmulator, tmp_path: Path) -> Path:
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")


class Kubectl:
    def __init__(self, kubeconfig: Path, cache_dir: Path) -> None:
        self.base = [KUBECTL or "kubectl", f"--kubeconfig={kubeconfig}", f"--cache-dir={cache_dir}"]

    def __call__(
        self, *args: str, input: str | None = None, timeout: float = 30, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.base, *args], input=input, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*self.base, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


@pytest.fixture
def kubectl(kubeconfig: Path, tmp_path: Path) -> Kubectl:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    return Kubectl(kubeconfig, tmp_path / "kubectl-cache")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[Any]:
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def kubelet(emulator: ApiEmulator, tmp_path: Path) -> Iterator[LocalKubelet]:
    kl = LocalKubelet(emulator, root=tmp_path / "sandbox", backoff_seconds=0.05).start()
    try:
        yield kl
    finally:
        kl.stop()


@pytest.fixture(name="make_crd")
def make_crd_fixture() -> Callable[..., dict[str, Any]]:
    return make_crd


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    return wait_for
