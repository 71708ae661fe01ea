"""Issue 12, items 1 and 2, end to end against the sandbox with the real kubectl and curl.

- A worker pod's own kubeconfig (its ServiceAccount's token) cannot read, patch or forge another
  run, read secrets, list runs or impersonate; it can read its own run.
- curl: no token is ``system:anonymous`` (``/version``, ``/healthz`` only), a bogus token is 401
  everywhere, the admin token reads secrets.
- The admission policy: a disallowed image, hostPath or serviceAccountName ends Failed with the
  reason ``PolicyViolation`` naming the field, a Warning Event, and no child object.
- Issue 28: the podTemplate allow-list end to end (a Secret through env, PYTHONPATH, a projected
  token, mountPropagation, the control plane), Secret values never in status or Events, and
  children that do not carry the run's identity (left by ``--cascade=orphan``, planted) fail the
  run (``ChildConflict``) instead of being adopted.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_harness import Cluster, OperatorProcess, manifest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]

CURL = shutil.which("curl")


def _worker_kubectl(cluster: Cluster, kubeconfig: Path, tmp_path: Path) -> Any:
    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "kubectl",
                f"--kubeconfig={kubeconfig}",
                f"--cache-dir={tmp_path / 'worker-kubectl-cache'}",
                *args,
            ],
            input=input,
            capture_output=True,
            text=True,
            timeout=30,
        )

    return run


def _denied(r: subprocess.CompletedProcess[str], what: str) -> None:
    assert r.returncode != 0, f"{what}: allowed\n{r.stdout}"
    assert "forbidden" in r.stderr.lower(), f"{what}: {r.stderr}"


def test_worker_kubeconfig_cannot_touch_other_runs_or_secrets(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    emu = cluster.emulator
    cluster.kubectl("create", "secret", "generic", "db-password", "--from-literal=password=hunter2")
    cluster.apply(manifest("victim", steps=4, suspend=True))
    cluster.apply(manifest("worker-a", steps=4))
    operator.wait(lambda: cluster.status("victim").get("phase") == "Suspended", 60, "victim")
    operator.wait(
        lambda: cluster.status("worker-a").get("phase") in ("Succeeded", "Failed"),
        240,
        "worker-a to finish",
    )
    assert cluster.status("worker-a")["phase"] == "Succeeded", cluster.status("worker-a")
    (pod,) = cluster.pods("worker-a")
    pdir = cluster.kubelet.pod_dir("default", pod["metadata"]["name"])
    kubeconfig = pdir / "kubeconfig"
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    # the pod's own ServiceAccount token: random, not the admin's, not derived from the name
    assert token != emu.admin_token and "worker-a" not in token
    assert (pdir / "serviceaccount" / "token").read_text() == token

    k = _worker_kubectl(cluster, kubeconfig, tmp_path)
    own = k("get", "mft", "worker-a", "-o", "json")
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout)["metadata"]["name"] == "worker-a"
    _denied(k("get", "mft", "victim"), "get another run")
    _denied(k("get", "mft"), "list runs")
    _denied(
        k("patch", "mft", "victim", "--type", "merge", "-p", '{"spec":{"suspend":false}}'),
        "patch another run's spec",
    )
    forged = '{"status":{"phase":"Succeeded"}}'
    _denied(
        k("patch", "mft", "victim", "--subresource=status", "--type", "merge", "-p", forged),
        "forge another run's status",
    )
    _denied(
        k("patch", "mft", "worker-a", "--type", "merge", "-p", '{"spec":{"suspend":true}}'),
        "patch its own run's spec",
    )
    _denied(k("get", "secrets"), "list secrets")
    _denied(k("get", "secret", "db-password", "-o", "yaml"), "read a secret")
    _denied(k("get", "configmap", "victim-config"), "read another run's config")
    _denied(k("delete", "mft", "victim"), "delete another run")
    r = k("get", "secrets", "--as=system:admin")
    assert r.returncode != 0 and 'cannot impersonate resource "users"' in r.stderr, r.stderr
    r = k("auth", "can-i", "get", "secrets")
    assert r.stdout.strip() == "no", (r.stdout, r.stderr)
    # nothing changed on the victim
    victim = cluster.mft("victim") or {}
    assert victim["spec"]["suspend"] is True and victim["status"]["phase"] == "Suspended"
    assert cluster.jobs("victim")[0]["spec"]["suspend"] is True

    denied = [d for d in emu.authorization_log() if not d.allowed]
    sa_user = "system:serviceaccount:default:worker-a-worker"
    assert {d.user for d in denied} == {sa_user}, denied
    assert ("", "secrets", "list") in {d.permission for d in denied}

    # a bogus token: 401, which kubectl reports as on a cluster
    bogus = tmp_path / "bogus-kubeconfig"
    cfg = yaml.safe_load(kubeconfig.read_text())
    cfg["users"][0]["user"]["token"] = "sandbox-sa-" + "x" * 43
    bogus.write_text(yaml.safe_dump(cfg))
    r = _worker_kubectl(cluster, bogus, tmp_path / "b")("get", "mft", "worker-a")
    assert r.returncode != 0, r.stdout
    assert "You must be logged in to the server" in r.stderr, r.stderr

    if CURL is None:
        pytest.skip("curl is not installed")

    def curl(path: str, token: str | None = None) -> tuple[int, dict[str, Any] | str]:
        args = [CURL, "-s", "--cacert", str(emu.tls.cert_file), "-w", "\n%{http_code}"]
        if token is not None:
            args += ["-H", f"Authorization: Bearer {token}"]
        out = subprocess.run(
            [*args, emu.url + path], capture_output=True, text=True, timeout=30
        ).stdout
        body, _, code = out.rpartition("\n")
        try:
            return int(code), json.loads(body)
        except ValueError:
            return int(code), body

    secrets = "/api/v1/namespaces/default/secrets"
    mft = "/apis/npu-lora.io/v1alpha1/namespaces/default/moefinetunes"
    # no token: system:anonymous, public info only (a real cluster's default bindings)
    assert curl("/version")[0] == 200 and curl("/healthz") == (200, "ok")
    for path in (secrets, mft, f"{mft}/victim", "/api", "/apis", "/openapi/v3"):
        code, body = curl(path)
        assert code == 403 and 'User "system:anonymous"' in body["message"], (path, body)
    # a bogus token: 401 Unauthorized (a Status) everywhere, discovery included
    for path in (secrets, "/version", "/api"):
        code, body = curl(path, "not-a-token")
        assert code == 401 and body["reason"] == "Unauthorized" and body["kind"] == "Status"
    # the worker's token: discovery yes, secrets and other runs no
    assert curl("/api", token)[0] == 200 and curl("/apis", token)[0] == 200
    assert curl(secrets, token)[0] == 403 and curl(f"{mft}/victim", token)[0] == 403
    assert curl(f"{mft}/worker-a", token)[0] == 200
    # the admin token (the user's kubeconfig)
    code, body = curl(f"{secrets}/db-password", emu.admin_token)
    assert code == 200 and body["metadata"]["name"] == "db-password"


POLICY_CASES = [
    ("bad-image", {"image": "docker.io/evil/miner:latest"}, "spec.image"),
    ("bad-hostpath", {"output": {"volume": {"hostPath": "/"}}}, "spec.output.volume.hostPath"),
    (
        "bad-sa",
        {"podTemplate": {"serviceAccountName": "default"}},
        "spec.podTemplate.serviceAccountName",
    ),
    (
        "bad-volume",
        {
            "podTemplate": {
                "volumes": [{"name": "host", "hostPath": {"path": "/etc"}}],
                "volumeMounts": [{"name": "host", "mountPath": "/host"}],
            }
        },
        "spec.podTemplate.volumes[0].hostPath",
    ),
    # issue 28: the podTemplate allow-list
    (
        "env-secret",
        {
            "podTemplate": {
                "env": [
                    {
                        "name": "T",
                        "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "p"}},
                    }
                ]
            }
        },
        "spec.podTemplate.env[0].valueFrom.secretKeyRef.name",
    ),
    (
        "env-pythonpath",
        {"podTemplate": {"env": [{"name": "PYTHONPATH", "value": "/mnt/extra/evil"}]}},
        "spec.podTemplate.env[0].name",
    ),
    (
        "projected-token",
        {
            "podTemplate": {
                "volumes": [
                    {
                        "name": "tok",
                        "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]},
                    }
                ]
            }
        },
        "spec.podTemplate.volumes[0].projected",
    ),
    (
        "propagation",
        {
            "podTemplate": {
                "volumes": [{"name": "s", "emptyDir": {"sizeLimit": "1Gi"}}],
                "volumeMounts": [
                    {"name": "s", "mountPath": "/data/s", "mountPropagation": "Bidirectional"}
                ],
            }
        },
        "spec.podTemplate.volumeMounts[0].mountPropagation",
    ),
    (
        "control-plane",
        {
            "podTemplate": {
                "tolerations": [
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                ],
                "priorityClassName": "system-node-critical",
            }
        },
        "spec.podTemplate.tolerations[0].key",
    ),
    (
        "pull-secret",
        {"podTemplate": {"imagePullSecrets": [{"name": "registry-admin"}]}},
        "spec.podTemplate.imagePullSecrets[0].name",
    ),
    (
        "tmpfs-unbounded",
        {
            "podTemplate": {
                "volumes": [{"name": "m", "emptyDir": {"medium": "Memory"}}],
                "volumeMounts": [{"name": "m", "mountPath": "/dev/shm"}],
            }
        },
        "spec.podTemplate.volumes[0].emptyDir.sizeLimit",
    ),
]


def test_admission_policy_refuses_before_any_child(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    emu = cluster.emulator
    for name, spec, _ in POLICY_CASES:
        cluster.apply(manifest(name, **spec))
    for name, _, field in POLICY_CASES:
        operator.wait(lambda n=name: cluster.status(n).get("phase") == "Failed", 60, name)
        st = cluster.status(name)
        (cond,) = [c for c in st["conditions"] if c["status"] == "True"]
        assert cond["type"] == "Failed" and cond["reason"] == "PolicyViolation", st
        assert st["message"].startswith("refused by the operator's admission policy: ")
        assert f"{field}: " in st["message"], st["message"]
        # nothing was created for the run
        assert cluster.jobs(name) == [] and cluster.pods(name) == []
        assert emu.get("v1", "ConfigMap", f"{name}-config", namespace="default") is None
        assert emu.get("v1", "ServiceAccount", f"{name}-worker", namespace="default") is None
        row = cluster.row(name)
        assert row["PHASE"] == "Failed", row

    def warnings() -> dict[str, str]:
        return {
            (e.get("involvedObject") or {}).get("name", ""): e.get("message", "")
            for e in emu.list("v1", "Event", namespace="default")
            if e.get("reason") == "PolicyViolation" and e.get("type") == "Warning"
        }

    operator.wait(lambda: set(warnings()) >= {n for n, _, _ in POLICY_CASES}, 30, "events")
    for name, _, field in POLICY_CASES:
        assert field in warnings()[name]
    described = cluster.kubectl("describe", "mft", "bad-image").stdout
    assert "PolicyViolation" in described and "spec.image" in described


def test_secret_values_never_reach_status_or_events(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    emu = cluster.emulator
    secret = "hunter2-" + "x" * 20
    emu.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "leaky", "namespace": "default"},
            "stringData": {"v": secret},
        }
    )
    pt = {
        "env": [
            {
                "name": "NPU_LORA_MEMORY_LIMIT",
                "valueFrom": {"secretKeyRef": {"name": "leaky", "key": "v"}},
            },
            {"name": "XDG_CACHE_HOME", "value": secret},
        ]
    }
    cluster.apply(manifest("leak", podTemplate=pt))
    operator.wait(lambda: cluster.status("leak").get("phase") == "Failed", 180, "leak")
    st = cluster.status("leak")
    assert secret not in json.dumps(st) and cluster.jobs("leak") == []
    events = [e.get("message", "") for e in emu.list("v1", "Event", namespace="default")]
    assert not any(secret in m for m in events)


def test_orphaned_children_are_not_adopted_by_a_recreated_run(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    emu = cluster.emulator
    # explicit resources: no memory estimate needed (it is not what this test is about)
    res = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    cluster.apply(manifest("orphan", suspend=True, resources=res))
    operator.wait(lambda: cluster.jobs("orphan"), 180, "the Job")
    old_uid = cluster.mft("orphan")["metadata"]["uid"]
    cluster.kubectl("delete", "mft", "orphan", "--cascade=orphan", "--wait=true")
    operator.wait(lambda: cluster.mft("orphan") is None, 30, "deletion")
    cm = emu.get("v1", "ConfigMap", "orphan-config", namespace="default")
    operator.wait(
        lambda: (
            not (emu.get("batch/v1", "Job", "orphan", namespace="default") or {})
            .get("metadata", {})
            .get("ownerReferences")
        ),
        30,
        "orphaning",
    )
    # re-created with a new spec: the old Job and ConfigMap (old spec) must not be adopted
    cluster.apply(manifest("orphan", steps=3, suspend=True, resources=res))
    operator.wait(lambda: cluster.status("orphan").get("phase") == "Failed", 180, "conflict")
    st = cluster.status("orphan")
    (cond,) = [c for c in st["conditions"] if c["status"] == "True"]
    assert cond["reason"] == "ChildConflict", st
    assert "default/orphan" in st["message"] and "not this run's" in st["message"]
    new_uid = cluster.mft("orphan")["metadata"]["uid"]
    assert new_uid != old_uid
    for kind, api, nm in (("Job", "batch/v1", "orphan"), ("ConfigMap", "v1", "orphan-config")):
        obj = emu.get(api, kind, nm, namespace="default")
        refs = obj["metadata"].get("ownerReferences") or []
        assert all(r.get("uid") != new_uid for r in refs), (kind, refs)
    assert emu.get("v1", "ConfigMap", "orphan-config", namespace="default")["data"] == cm["data"]


def test_planted_configmap_is_a_conflict_not_the_runs_config(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    emu = cluster.emulator
    emu.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "planted-config", "namespace": "default"},
            "data": {"config.yaml": "spec: {model: {path: /etc}}"},
        }
    )
    res = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    cluster.apply(manifest("planted", resources=res))
    operator.wait(lambda: cluster.status("planted").get("phase") == "Failed", 180, "planted")
    st = cluster.status("planted")
    assert "ConfigMap default/planted-config" in st["message"] and cluster.jobs("planted") == []
