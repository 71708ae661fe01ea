"""What the podman runtime makes of a pod: the pod environment of :mod:`npu_lora_sandbox.podenv`
without path rewriting, and the ``podman run`` arguments of the operator's real Job.

No podman needed: :func:`npu_lora_sandbox.podman.podman_run_args` is a pure function
(tests/images runs the containers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_lora_operator.builders import Run, build_children
from npu_lora_operator.settings import OperatorConfig
from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet
from npu_lora_sandbox.podenv import POD_KUBECONFIG, SA_PATH
from npu_lora_sandbox.podman import PodmanRuntime, _prepare_volumes, podman_run_args

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/npu-lora-worker:0.1.0"


def _pod_of(job: dict[str, Any], name: str = "tiny-sandbox-abcde") -> dict[str, Any]:
    tpl = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": "pod-uid-1", "labels": {}},
        "spec": tpl["spec"],
    }


@pytest.fixture
def job_pod(emulator: ApiEmulator, tmp_path: Path) -> tuple[LocalKubelet, dict[str, Any]]:
    body = yaml.safe_load((REPO / "examples" / "tiny-sandbox.yaml").read_text())
    body["metadata"].update(namespace="default", uid="run-uid-1")
    run = Run.from_body(body)
    config = OperatorConfig(worker_image=IMAGE, image_pull_policy="Never")
    children = build_children(run, config)
    for obj in children[:-1]:  # ConfigMap, ServiceAccount, Role, RoleBinding
        obj.setdefault("metadata", {}).setdefault("namespace", "default")
        emulator.create(obj)
    kl = LocalKubelet(emulator, root=tmp_path / "sandbox", runtime=PodmanRuntime())
    (kl.root / "pvc").mkdir(parents=True)
    return kl, _pod_of(children[-1])


def _launch(kl: LocalKubelet, pod: dict[str, Any]) -> Any:
    pdir = kl.pod_dir("default", pod["metadata"]["name"])
    pdir.mkdir(parents=True)
    launch, _tm = kl._prepare(pod, pod["spec"]["containers"][0], pdir, pdir / "container.log")
    return launch


def _pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_job_pod_becomes_a_locked_down_container(job_pod):
    kl, pod = job_pod
    launch = _launch(kl, pod)
    container = pod["spec"]["containers"][0]
    args = podman_run_args(launch, "sbx-test")

    assert _pairs(args, "--user") == ["1000:1000"]
    assert _pairs(args, "--group-add") == ["1000"]  # fsGroup
    assert "--read-only" in args and "--read-only-tmpfs=false" in args
    assert _pairs(args, "--cap-drop") == ["all"]
    assert "no-new-privileges" in _pairs(args, "--security-opt")
    assert "--privileged" not in args
    assert "--network=host" in args

    # only the Job's mounts, plus what a kubelet adds (service account, termination log) and the
    # sandbox's kubeconfig; read-only where the Job or Kubernetes says so
    volumes = {v.split(":")[1]: v for v in _pairs(args, "--volume")}
    declared = {m["mountPath"] for m in container["volumeMounts"]}
    assert set(volumes) == declared | {SA_PATH, POD_KUBECONFIG, container["terminationMessagePath"]}
    ro = {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")}
    assert ro and all(volumes[p].endswith(":ro") for p in ro | {SA_PATH, POD_KUBECONFIG})
    assert not volumes["/mnt/output"].endswith(":ro") and not volumes["/tmp"].endswith(":ro")
    assert volumes["/mnt/output"].split(":")[0] == str(kl.pvc_dir("runs"))

    # container paths, not rewritten; nothing of this process's environment
    env = dict(e.split("=", 1) for e in _pairs(args, "--env"))
    assert env["KUBECONFIG"] == POD_KUBECONFIG
    assert env["HOME"] == "/tmp" and env["NPU_LORA_SANDBOX"] == "1"
    assert "VIRTUAL_ENV" not in env and "PATH" not in env and "NPU_LORA_PATH_MAP" not in env
    assert env["NPU_LORA_TERMINATION_LOG"] == container["terminationMessagePath"]

    # the Job's command replaces the image's entrypoint (container paths: /mnt/output/...)
    i = args.index(IMAGE)
    assert args[i - 2 : i] == ["--entrypoint", json.dumps(container["command"])]
    assert args[i + 1 :] == []
    assert container["command"][-2] == "--out"
    assert container["command"][-1] == "/mnt/output/tiny-sandbox"


def test_limits_user_and_image_entrypoint(job_pod):
    kl, pod = job_pod
    c = pod["spec"]["containers"][0]
    c["resources"] = {"limits": {"memory": "256Mi", "cpu": "500m"}}
    c["securityContext"] = {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
    pod["spec"]["securityContext"] = {"runAsUser": 1234, "supplementalGroups": [5, 6]}
    del c["command"]
    c["args"] = ["--help"]
    args = podman_run_args(_launch(kl, pod), "sbx-test")
    assert _pairs(args, "--memory") == [str(256 * 2**20)]
    assert _pairs(args, "--memory-swap") == [str(256 * 2**20)]
    assert _pairs(args, "--cpus") == ["0.5"]
    assert _pairs(args, "--user") == ["1234"]
    assert _pairs(args, "--group-add") == ["5", "6"]
    assert _pairs(args, "--cap-add") == ["net_bind_service"]
    assert "--read-only" not in args and "--security-opt" not in args
    assert "--entrypoint" not in args and args[-2:] == [IMAGE, "--help"]


def test_run_as_non_root_with_uid_0_does_not_start(job_pod):
    kl, pod = job_pod
    pod["spec"]["containers"][0]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 0}
    with pytest.raises(OSError, match="runAsNonRoot"):
        podman_run_args(_launch(kl, pod), "sbx-test")


def test_volumes_prepared_like_a_kubelet(job_pod, tmp_path):
    kl, pod = job_pod
    launch = _launch(kl, pod)
    tm = pod["spec"]["containers"][0]["terminationMessagePath"]
    _prepare_volumes(launch, {tm})
    assert launch.mounts["/tmp"].stat().st_mode & 0o7777 == 0o1777
    assert launch.mounts[tm].stat().st_mode & 0o777 == 0o666
    out = launch.mounts["/mnt/output"].stat()
    assert out.st_gid == 1000 and out.st_mode & 0o2070 == 0o2070  # fsGroup, setgid, g+rwx
    for f in launch.mounts["/etc/npu-lora"].iterdir():
        assert f.stat().st_mode & 0o777 == 0o644


def test_credentials_readable_by_the_pods_user_as_a_kubelet_projects_them(job_pod):
    """The token directory and the kubeconfig belong to the pod's runAsUser (uid 1000 here) and
    are group-readable by its fsGroup, never world-readable: the worker reports its status from
    inside its container (issue 41: a root-owned 0600 kubeconfig left every column empty)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("chown to the pod's uid needs root (as the podman sandbox runs)")
    kl, pod = job_pod
    launch = _launch(kl, pod)
    sc = pod["spec"]["securityContext"]
    _prepare_volumes(launch, set())
    sa, kc = launch.mounts[SA_PATH], launch.mounts[POD_KUBECONFIG]
    for p in [sa, kc, *sa.iterdir()]:
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (sc["runAsUser"], sc["fsGroup"]), p
        assert st.st_mode & 0o007 == 0, f"{p}: world-accessible"
        assert st.st_mode & 0o740 == 0o740 if p.is_dir() else st.st_mode & 0o777 == 0o640
    # without fsGroup: the user's alone
    pod["spec"]["securityContext"] = {k: v for k, v in sc.items() if k != "fsGroup"}
    _prepare_volumes(launch, set())
    assert kc.stat().st_mode & 0o777 == 0o600 and kc.stat().st_uid == sc["runAsUser"]


def test_unknown_runtime_and_missing_podman_are_named(tmp_path):
    from npu_lora_sandbox.command import start_sandbox
    from npu_lora_sandbox.podman import podman_available

    with pytest.raises(ValueError, match=r"runtime: 'docker' is not one of 'subprocess', 'podman'"):
        start_sandbox(tmp_path, runtime="docker")
    assert podman_available("no-such-podman-here") == "no-such-podman-here not found on PATH"
