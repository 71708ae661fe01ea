"""The built images, run with podman: the operator image (no torch, no sandbox; reconciles a run
against the sandbox's API over loopback), the worker image (the operator's Job as uid 1000 on a
read-only root with only its declared mounts; furiosa-torch and ``rngd-check --tier inventory``)
and the sandbox kubelet's podman runtime (exit codes, termination messages, OOM kills)."""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from npu_lora.api import record
from npu_lora_operator.builders import OUTPUT_MOUNT, Run, build_children, output_path
from npu_lora_operator.crd import build_crd
from npu_lora_operator.settings import OperatorConfig
from npu_lora_sandbox.kubelet import LocalKubelet
from npu_lora_sandbox.podenv import POD_KUBECONFIG, SA_PATH
from npu_lora_sandbox.podman import PodmanRuntime

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(1200)


def _manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples" / name).read_text())


def _files_owned_by_others(root: Path, uid: int) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.stat().st_uid != uid]


def run_dir(kubelet: LocalKubelet, body: dict[str, Any]) -> Path:
    """Where the sandbox keeps a run's directory, by the API's own rule: the Job's ``--out``
    (``output_path``) under the output mount, inside the output claim's directory."""
    run = Run.from_body(body)
    claim = run.spec.output.volume.claim_name
    rel = PurePosixPath(output_path(run)).relative_to(OUTPUT_MOUNT)
    return kubelet.pvc_dir(claim, run.namespace or "default") / rel


def parse_table(text: str) -> list[dict[str, str]]:
    """``kubectl get`` output as rows of ``{COLUMN: cell}`` (cells start under their header;
    empty cells are ``""``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    names = lines[0].split()
    rows = []
    for line in lines[1:]:
        ends = [*starts[1:], None]
        rows.append({n: line[s:e].strip() for n, s, e in zip(names, starts, ends, strict=True)})
    return rows


def step_columns() -> list[str]:
    """The last-step columns a single-process run fills: STEP, S/STEP and every printer column
    of the step record (worker/npu_lora/api/record.py), data-parallel ones excluded."""
    cols = [c.printer.name.upper() for c in record.RECORD if c.printer and not c.data_parallel]
    return ["STEP", "S/STEP", *cols]


def test_operator_image_has_neither_torch_nor_the_sandbox(images, podman):
    res = podman(
        "run", "--rm", "--entrypoint", "sh", images["operator"], "-c",
        "find / -xdev \\( -name 'npu_lora_sandbox*' -o -name torch -o -name 'torch-*' "
        "-o -name kmock \\) -print; python -c 'import npu_lora_operator, kopf, kubernetes'",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", res.stdout
    user = podman("image", "inspect", "--format", "{{.Config.User}}", images["operator"])
    assert user.stdout.strip() == "1000:1000"


@pytest.mark.parametrize("target", ["worker", "worker-cpu"])
def test_worker_image_runs_the_operators_job(target, images, emulator, tmp_path, podman, wait_for):
    """``npu-lora run examples/tiny-local.yaml`` as the operator's Job runs it, from the rngd
    worker image and from the cpu backend's: uid 1000, read-only root, all capabilities
    dropped, no privilege escalation, the Job's mounts only; the run directory lands in the
    output PVC (where the API's path rule puts it), written with the compiled kernel."""
    body = _manifest("tiny-local.yaml")
    body["metadata"]["namespace"] = "default"
    body["spec"]["output"] = {"volume": {"claimName": "runs"}}
    emulator.load_crd(build_crd())  # the worker reports to its MoEFinetune's status
    run = Run.from_body(emulator.create(body))
    config = OperatorConfig(worker_image=images[target], image_pull_policy="Never")
    children = build_children(run, config)
    runtime = PodmanRuntime(keep_containers=True)
    kl = LocalKubelet(emulator, root=tmp_path / "sandbox", runtime=runtime).start()
    try:
        for obj in children:
            obj["metadata"].setdefault("namespace", "default")
            emulator.create(obj)
        job = children[-1]["metadata"]["name"]

        def finished() -> dict[str, Any] | None:
            j = emulator.get("batch/v1", "Job", job, "default") or {}
            conds = {c["type"] for c in (j.get("status") or {}).get("conditions") or []}
            return j if {"Complete", "Failed"} & conds else None

        wait_for(finished, timeout=900, interval=1)
        (pod,) = emulator.list("v1", "Pod", "default", label_selector=f"job-name={job}")
        log = kl.pod_dir("default", pod["metadata"]["name"]) / "container.log"
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 0, log.read_text()[-3000:]
        assert pod["status"]["phase"] == "Succeeded"
        assert json.loads(term["message"])["steps"] == 30  # the worker's termination message

        out = run_dir(kl, body)
        assert (out / "metrics.jsonl").is_file(), sorted(out.iterdir()) if out.exists() else out
        assert _files_owned_by_others(out, 1000) == []  # written by uid 1000
        summary = json.loads((out / "summary.json").read_text())
        host = summary["machine"]["host"]  # the compiled kernel ran, not the torch fallback
        assert str(host["kernel_backend"]).startswith("cpp:"), host

        name = term["containerID"].removeprefix("podman://")
        info = json.loads(podman("inspect", name).stdout)[0]
        try:
            assert info["Config"]["User"] == "1000:1000"
            assert info["HostConfig"]["ReadonlyRootfs"] is True
            assert "no-new-privileges" in info["HostConfig"]["SecurityOpt"]
            assert info["EffectiveCaps"] in (None, [])
            assert info["Config"]["Image"] == images[target]
            container = children[-1]["spec"]["template"]["spec"]["containers"][0]
            declared = {m["mountPath"] for m in container["volumeMounts"]}
            added = {SA_PATH, POD_KUBECONFIG, container["terminationMessagePath"]}
            assert {m["Destination"] for m in info["Mounts"]} == declared | added
        finally:
            podman("rm", "--force", name)
    finally:
        kl.stop()
        for p in emulator.list("v1", "Pod", "default"):  # kept containers (keep_containers)
            uid = f"label=io.kubernetes.pod.uid={p['metadata']['uid']}"
            for cid in podman("ps", "-aq", "--filter", uid).stdout.split():
                podman("rm", "--force", cid)


def _bare_pod(name: str, image: str, code: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["python", "-c", code],
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    **container,
                }
            ],
        },
    }


def test_podman_runtime_exit_codes_messages_and_oom(images, emulator, tmp_path, wait_for):
    kl = LocalKubelet(emulator, root=tmp_path / "sandbox", runtime=PodmanRuntime()).start()
    try:
        img = images["operator"]  # small, has python
        exits = _bare_pod(
            "exits-3",
            img,
            "import os, sys; print('uid', os.getuid(), flush=True); "
            "open('/dev/termination-log', 'w').write('bye'); "
            "ok = True\ntry: open('/x', 'w')\nexcept OSError: ok = False\n"
            "print('root writable', ok); sys.exit(3)",
        )
        oom = _bare_pod(
            "oom",
            img,
            "b = b'x' * (512 * 2**20); print(len(b))",
            resources={"limits": {"memory": "64Mi", "cpu": "500m"}},
        )
        for pod in (exits, oom):
            emulator.create(copy.deepcopy(pod))

        def terminated(name: str) -> dict[str, Any] | None:
            p = emulator.get("v1", "Pod", name, "default") or {}
            st = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
            return (st.get("state") or {}).get("terminated")

        t = wait_for(lambda: terminated("exits-3"), timeout=180, interval=0.5)
        log = (kl.pod_dir("default", "exits-3") / "container.log").read_text()
        assert (t["exitCode"], t["reason"], t.get("message")) == (3, "Error", "bye"), log
        assert "uid 1000" in log and "root writable False" in log
        assert emulator.get("v1", "Pod", "exits-3", "default")["status"]["phase"] == "Failed"

        t = wait_for(lambda: terminated("oom"), timeout=180, interval=0.5)
        assert (t["exitCode"], t["reason"]) == (137, "OOMKilled"), t
    finally:
        kl.stop()


def test_sandbox_runtime_podman_reconciles_tiny_sandbox(images, tmp_path, wait_for, kubectl_for):
    """``npu-lora sandbox --runtime podman``: the operator from its image (over loopback, with a
    kubeconfig), ``kubectl apply -f examples/tiny-sandbox.yaml`` → Succeeded, the worker in its
    container as uid 1000, reporting from there: ``kubectl get mft -o wide`` shows STEP and LOSS
    while Running and every step column after; ``status.host.kernelBackend`` is the compiled
    kernel (``cpp:...``), not the torch fallback."""
    from npu_lora_sandbox.command import start_sandbox, stop_sandbox

    parts = start_sandbox(tmp_path / "sandbox", runtime="podman")
    seen: list[dict[str, str]] = []
    stop = threading.Event()
    try:
        assert "operator_image" in parts and parts["operator"].is_alive()
        kubectl = kubectl_for(parts["kubeconfig"])
        manifest = REPO / "examples" / "tiny-sandbox.yaml"
        kubectl("apply", "-f", str(manifest))

        def watch() -> None:  # the rows a user polling `kubectl get mft -o wide` sees
            while not stop.is_set():
                res = kubectl("get", "mft", "tiny-sandbox", "-o", "wide", check=False)
                seen.extend(parse_table(res.stdout))
                stop.wait(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        def phase() -> str | None:
            res = kubectl("get", "mft", "tiny-sandbox", "-o", "jsonpath={.status.phase}")
            return res.stdout if res.stdout in ("Succeeded", "Failed") else None

        try:
            got = wait_for(phase, timeout=900, interval=2)
        except AssertionError:
            print((parts["root"] / "operator.log").read_text()[-4000:])
            raise
        finally:
            stop.set()
            watcher.join(timeout=30)
        logs = kubectl("logs", "job/tiny-sandbox", check=False).stdout
        assert got == "Succeeded", logs[-3000:]

        running = [
            r for r in seen if r.get("PHASE") == "Running" and r.get("STEP") not in ("", "0")
        ]
        assert running, f"no Running row with STEP filled among {len(seen)} polls: {seen[-3:]}"
        assert all(r["LOSS"] for r in running), running[-1]
        (final,) = parse_table(kubectl("get", "mft", "tiny-sandbox", "-o", "wide").stdout)
        empty = [c for c in step_columns() if not final.get(c)]
        assert final["PHASE"] == "Succeeded" and not empty, (empty, final, logs[-2000:])

        status = json.loads(kubectl("get", "mft", "tiny-sandbox", "-o", "json").stdout)["status"]
        assert status["lastStep"] and status["host"], status
        assert str(status["host"].get("kernelBackend", "")).startswith("cpp:"), status["host"]

        body = yaml.safe_load(manifest.read_text())
        body["metadata"]["namespace"] = "default"
        out = run_dir(parts["kubelet"], body)
        assert (out / "metrics.jsonl").is_file(), sorted(out.iterdir()) if out.exists() else out
        assert _files_owned_by_others(out, 1000) == []
        pods = json.loads(kubectl("get", "pods", "-o", "json").stdout)["items"]
        (pstatus,) = [p["status"]["containerStatuses"][0] for p in pods]
        assert pstatus["image"] == parts["worker_image"]
        assert pstatus["containerID"].startswith("podman://")
    finally:
        stop.set()
        stop_sandbox(parts)


def test_worker_image_rngd_extra_imports_and_inventory_passes(images, podman):
    locked = ["run", "--rm", "--user", "1000:1000", "--read-only", "--read-only-tmpfs=false",
              "--tmpfs", "/tmp", "--cap-drop", "all", "--security-opt", "no-new-privileges",
              "--network", "none"]  # fmt: skip
    t0 = time.monotonic()
    res = podman(
        *locked, "--entrypoint", "python", images["worker"], "-c",
        "import torch, furiosa.torch, npu_lora.rngd.check; "
        "print('torch', torch.__version__, 'furiosa', furiosa.torch.is_available())",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "torch 2.10.0" in res.stdout and "furiosa True" in res.stdout, res.stdout
    res = podman(*locked, images["worker"], "rngd-check", "--tier", "inventory")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    print(res.stdout[-2000:], f"({time.monotonic() - t0:.0f} s)")
