"""The sandbox's admin credentials stay out of its pods (issue 28): the admin and operator
kubeconfigs live in ``<root>/admin/`` (0700), which no pod is given; a pod's environment and
files name neither that directory nor the admin token, and a pod whose environment would is not
started. What file modes cannot do for pods of the same OS user is in docs/security.md."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_lora_sandbox.command import install_operator_identity, start_sandbox, stop_sandbox
from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet

#: a pod that prints its environment and every file it was given (its working directory and
#: each mounted directory), so the test can look for the admin's credentials in all of it
_DUMP = """
import json, os
seen = {}
roots = [os.getcwd(), *json.loads(os.environ["NPU_LORA_PATH_MAP"]).values()]
for root in roots:
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            try:
                seen[p] = open(p, errors="replace").read()
            except OSError:
                seen[p] = ""
print("DUMP" + json.dumps({"env": dict(os.environ), "files": seen}))
"""


def _job(name: str, code: str, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11",
                            "command": ["python", "-c", code],
                            "env": env or [],
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                        }
                    ],
                    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
                },
            },
        },
    }


def _terminated(emu: ApiEmulator, job: str) -> dict[str, Any] | None:
    for pod in emu.list("v1", "Pod", "default", label_selector=f"job-name={job}"):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if term:
                return dict(term)
    return None


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[dict[str, Any]]:
    parts = start_sandbox(tmp_path / "root", operator=False)
    install_operator_identity(parts["emulator"], parts["kubelet"].private_dir / "operator-kc")
    try:
        yield parts
    finally:
        stop_sandbox(parts)


def test_admin_credentials_live_in_a_private_directory(sandbox: dict[str, Any]) -> None:
    kubelet: LocalKubelet = sandbox["kubelet"]
    root: Path = sandbox["root"]
    assert sandbox["kubeconfig"] == kubelet.kubeconfig == root / "admin" / "kubeconfig"
    assert stat.S_IMODE(kubelet.private_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(kubelet.kubeconfig.stat().st_mode) == 0o600
    assert sandbox["emulator"].admin_token in kubelet.kubeconfig.read_text()
    # nothing with credentials at the root, beside the pods' and claims' directories
    assert not (root / "kubeconfig").exists() and not (root / "operator-kubeconfig").exists()


def test_a_pods_environment_and_files_never_reach_the_admin_credentials(
    sandbox: dict[str, Any], wait_for: Any
) -> None:
    emu: ApiEmulator = sandbox["emulator"]
    kubelet: LocalKubelet = sandbox["kubelet"]
    emu.create(_job("dump", _DUMP))
    term = wait_for(lambda: _terminated(emu, "dump"), timeout=60)
    assert term["exitCode"] == 0, term
    (pod,) = emu.list("v1", "Pod", "default", label_selector="job-name=dump")
    log = (kubelet.pod_dir("default", pod["metadata"]["name"]) / "container.log").read_text()
    dump = json.loads(log.split("DUMP", 1)[1])
    text = json.dumps(dump)
    assert emu.admin_token not in text
    assert str(kubelet.private_dir) not in text and "operator-kc" not in text
    # it got its own identity: a kubeconfig in its pod directory with its ServiceAccount's token
    kc = Path(dump["env"]["KUBECONFIG"])
    assert kc.parent == kubelet.pod_dir("default", pod["metadata"]["name"])
    assert emu.service_account_token("default", "default") in dump["files"][str(kc)]
    assert all(not Path(p).is_relative_to(kubelet.private_dir) for p in dump["files"])


@pytest.mark.parametrize("what", ["path", "dir", "token", "resolved"])
def test_a_pod_whose_environment_names_the_admin_credentials_does_not_start(
    sandbox: dict[str, Any], wait_for: Any, what: str
) -> None:
    emu: ApiEmulator = sandbox["emulator"]
    kubelet: LocalKubelet = sandbox["kubelet"]
    value = {
        "path": str(kubelet.kubeconfig),
        "dir": f"{kubelet.private_dir}/",
        "token": f"Bearer {emu.admin_token}",
        # the same file by another spelling of the root: still the private state
        "resolved": str(kubelet.private_dir.resolve() / "kubeconfig"),
    }[what]
    emu.create(_job("leak", "print('started')", env=[{"name": "X", "value": value}]))
    term = wait_for(lambda: _terminated(emu, "leak"), timeout=30)
    assert term["reason"] == "StartError" and "private state" in term["message"], term
    assert emu.admin_token not in term["message"]


def test_a_kubeconfig_written_elsewhere_is_private_too(tmp_path: Path, wait_for: Any) -> None:
    kc = tmp_path / "elsewhere" / "admin.kubeconfig"
    kc.parent.mkdir()
    parts = start_sandbox(tmp_path / "root", kubeconfig=kc, operator=False)
    try:
        emu: ApiEmulator = parts["emulator"]
        assert parts["kubeconfig"] == kc and emu.admin_token in kc.read_text()
        # the kubelet keeps no admin kubeconfig of its own when pods have their identities
        assert not parts["kubelet"].kubeconfig.exists()
        for name, job in (
            ("by-env", _job("by-env", "print(1)", env=[{"name": "K", "value": str(kc)}])),
            ("by-host-path", _job("by-host-path", "print(1)")),
        ):
            if name == "by-host-path":
                spec = job["spec"]["template"]["spec"]
                spec["volumes"] = [{"name": "scratch", "hostPath": {"path": str(kc.parent)}}]
            emu.create(job)
            term = wait_for(lambda n=name: _terminated(emu, n), timeout=30)
            assert term["reason"] == "StartError", (name, term)
    finally:
        stop_sandbox(parts)
