"""A kopf operator against the emulator: watch, handler progress, finalizers, adoption, events."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from npu_lora_sandbox.emulator import ApiEmulator

OPERATOR = textwrap.dedent(
    """
    import kopf

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_):
        settings.watching.server_timeout = 10
        settings.watching.client_timeout = 15
        settings.persistence.finalizer = "example.com/finalizer"

    @kopf.on.create("example.com", "v1", "widgets")
    def created(spec, name, namespace, body, patch, **_):
        child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-child"},
                 "data": {"size": str(spec["size"])}}
        kopf.adopt(child, owner=body)
        import kubernetes
        kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, child)
        kopf.info(body, reason="Created", message="child created")
        patch.status["phase"] = "Ready"
        return {"child": child["metadata"]["name"]}

    @kopf.on.delete("example.com", "v1", "widgets")
    def deleted(name, **_):
        pass
    """
)


def test_kopf_operator_end_to_end(
    emulator: ApiEmulator,
    kubeconfig: Path,
    make_crd: Any,
    wait_for: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kopf_testing = pytest.importorskip("kopf.testing")
    import kubernetes

    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(
        kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig)
    )
    kubernetes.config.load_kube_config(config_file=str(kubeconfig))
    emulator.load_crd(make_crd())
    module = tmp_path / "widget_operator.py"
    module.write_text(OPERATOR)
    args = ["run", "--standalone", "--all-namespaces", "--verbose", str(module)]
    with kopf_testing.KopfRunner(args, timeout=60) as runner:
        emulator.create(
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w"},
                "spec": {"size": 2},
            }
        )
        obj = wait_for(
            lambda: (
                (w := emulator.get("example.com/v1", "Widget", "w", "default"))
                and (w.get("status") or {}).get("phase") == "Ready"
                and w
            ),
            timeout=30,
        )
        assert obj["status"]["created"] == {"child": "w-child"}
        assert "example.com/finalizer" in obj["metadata"]["finalizers"]
        child = emulator.get("v1", "ConfigMap", "w-child", "default")
        assert child["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        # kopf posts events asynchronously (after the status patch): wait for it
        wait_for(
            lambda: any(
                e["reason"] == "Created"
                for e in emulator.list(
                    "v1", "Event", "default", field_selector="involvedObject.name=w"
                )
            ),
            timeout=30,
        )
        emulator.delete("example.com/v1", "Widget", "w", "default")
        wait_for(
            lambda: emulator.get("example.com/v1", "Widget", "w", "default") is None, timeout=30
        )
        assert emulator.get("v1", "ConfigMap", "w-child", "default") is None
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None
    assert "Handler 'created' succeeded" in runner.output
