"""The admission policy has no waiver (issue 38): on every path (create, resume after an operator
restart, a spec change, an un-suspend, a retry, the precompile Job's completion) the operator
admits the spec *as it is now* before it creates or changes a child.

The handlers run in-process against the emulator over real HTTP (the spec patches go through the
CRD's schema and CEL like ``kubectl patch``); Hypothesis draws sequences of spec patches, suspend
flips, operator stops/restarts, precompile completions and a Kueue-style un-suspend. After each
step: every pod template of the run's Jobs passes an independent check of the policy (image,
hostPaths, priority class, tolerations, privileged settings), no child was created or changed
(a Job's ``suspend: true`` aside) while the spec was refused, and a refused run is ``Failed``
(``PolicyViolation``) with no unfinished Job left running.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import itertools
import logging
import posixpath
from pathlib import Path
from typing import Any

import kopf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import config as kconfig
from npu_lora.api.v1alpha1 import API_VERSION, PLURAL
from npu_lora_operator import builders, handlers, policy, precompile
from npu_lora_operator.crd import build_crd
from npu_lora_operator.kube import Kube, KubeError
from npu_lora_operator.policy import PodPolicy
from npu_lora_operator.settings import OperatorConfig

NS = "default"
WORKER_IMAGE = "reg.example.com/npu-lora-worker:1"
POLICY = PodPolicy(
    allowed_images=(WORKER_IMAGE, "reg.example.com/team/*"),
    allowed_host_paths=("/srv/cache",),
    allowed_priority_classes=("team-*",),
)
CONFIG = OperatorConfig(worker_image=WORKER_IMAGE, policy=POLICY)
LOG = logging.getLogger("test.no_waiver")

BASE: dict[str, Any] = {
    "model": {"preset": "tiny-qwen3-moe"},
    "data": {"path": "example:nsmc-mini"},
    "moe": {"placement": "host-only"},
    "training": {"steps": 5, "seqLen": 8, "batchSize": 1},
    "device": {"backend": "cpu", "cards": 0},
    "output": {"volume": {"claimName": "runs"}},
}

#: merge patches of the spec: allowed ones, and ones the policy refuses (the reported case:
#: an image, a compile-cache hostPath at /etc, a system priority class, precompile on)
GOOD_PATCHES: list[dict[str, Any]] = [
    {"image": "reg.example.com/team/worker:2"},
    {"image": None},
    {"activeDeadlineSeconds": 3600},
    {"ttlSecondsAfterFinished": 60},
    {"checkpoint": {"everySteps": 3}},
    {"device": {"precompile": True, "compileCache": {"claimName": "graphs", "hostPath": None}}},
    {"device": {"precompile": False}},
    {"device": {"compileCache": {"claimName": None, "hostPath": "/srv/cache/graphs"}}},
    {"podTemplate": {"priorityClassName": "team-batch"}},
    {"podTemplate": None},
    {"resumeFrom": "older/run"},
    {"resumeFrom": None},
]
BAD_PATCHES: list[dict[str, Any]] = [
    {"image": "evil.example.com/miner:1"},
    {
        "device": {
            "precompile": True,
            "compileCache": {"claimName": None, "hostPath": "/etc"},
        }
    },
    {"podTemplate": {"priorityClassName": "system-node-critical"}},
    {"podTemplate": {"env": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}]}},
    {
        "podTemplate": {
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
        }
    },
    {"output": {"volume": {"claimName": None, "hostPath": "/"}}},
    {"resumeFrom": "/mnt/output/../../etc"},
    {"resumeFrom": "../other-namespace/run"},
]
PATCHES = GOOD_PATCHES + BAD_PATCHES

step = st.one_of(
    st.tuples(st.just("patch"), st.integers(len(GOOD_PATCHES), len(PATCHES) - 1)),
    st.tuples(st.just("patch"), st.integers(0, len(GOOD_PATCHES) - 1)),
    st.tuples(st.just("suspend"), st.booleans()),
    st.tuples(st.just("restart"), st.none()),
    st.tuples(st.just("stop"), st.none()),
    st.tuples(st.just("compiled"), st.none()),
    st.tuples(st.just("kueue-unsuspend"), st.none()),
)


class Harness:
    """One run driven through the handlers as kopf would call them."""

    def __init__(self, emulator: Any, client: Any, name: str, spec: dict[str, Any]) -> None:
        self.emu = emulator
        self.client = client
        self.name = name
        self.state = self._new_state()
        self.up = True
        self.handled_spec: dict[str, Any] = {}
        body = emulator.create(
            {
                "apiVersion": API_VERSION,
                "kind": "MoEFinetune",
                "metadata": {"name": name, "namespace": NS},
                "spec": spec,
            }
        )
        self.uid = body["metadata"]["uid"]
        self.handled_spec = copy.deepcopy(body["spec"])
        self._call(handlers.ensure_run, body=body, name=name, namespace=NS)

    def _new_state(self) -> handlers.State:
        return handlers.new_memo(CONFIG, Kube(self.client)).state

    def body(self) -> dict[str, Any]:
        return self.emu.get(API_VERSION, "MoEFinetune", self.name, namespace=NS)

    def _call(self, handler: Any, **kw: Any) -> None:
        kw.setdefault("logger", LOG)
        # kopf records these (a refused run is Failed; a wait is retried later)
        with contextlib.suppress(kopf.PermanentError, kopf.TemporaryError):
            handler(memo=kopf.Memo(state=self.state), **kw)

    def _spec_handlers(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """What kopf calls for a spec change: the ``spec.suspend`` field handler and the
        ``spec`` update handler (with kopf's diff shape: op, field path, old, new)."""
        body = self.body()
        if old.get("suspend") != new.get("suspend"):
            self._call(
                handlers.suspend_changed,
                old=bool(old.get("suspend")),
                new=bool(new.get("suspend")),
                body=body,
                spec=body["spec"],
                name=self.name,
                namespace=NS,
            )
        keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if keys:
            diff = [("change", (k,), old.get(k), new.get(k)) for k in keys]
            self._call(
                handlers.spec_changed, diff=diff, body=self.body(), name=self.name, namespace=NS
            )
        self.handled_spec = copy.deepcopy(new)

    def apply(self, action: str, arg: Any) -> None:
        if action == "patch":
            self._patch_spec(PATCHES[arg])
        elif action == "suspend":
            self._patch_spec({"suspend": arg})
        elif action == "stop":
            self.up = False
        elif action == "restart":  # a new operator process: fresh memo; kopf resumes the run
            self.state = self._new_state()
            self.up = True
            body = self.body()
            self._call(handlers.ensure_run, body=body, name=self.name, namespace=NS)
            if body["spec"] != self.handled_spec:  # changed while it was down
                self._spec_handlers(self.handled_spec, body["spec"])
        elif action == "compiled":  # the kubelet finished the precompile Job
            cname = precompile.precompile_job_name(self.name)
            if self.emu.get("batch/v1", "Job", cname, namespace=NS) is None:
                return
            done = {"type": "Complete", "status": "True", "lastTransitionTime": _now()}
            self.emu.patch(
                "batch/v1",
                "Job",
                cname,
                {"status": {"conditions": [done], "succeeded": 1}},
                namespace=NS,
                subresource="status",
            )
            if self.up:
                job = self.emu.get("batch/v1", "Job", cname, namespace=NS)
                self._call(handlers.job_event, body=job, namespace=NS)
        elif action == "kueue-unsuspend":  # someone else resumes the training Job
            job = self.emu.get("batch/v1", "Job", builders.job_name(self.name), namespace=NS)
            if job is None or not job["spec"].get("suspend"):
                return
            self.emu.patch(
                "batch/v1",
                "Job",
                job["metadata"]["name"],
                {"spec": {"suspend": False}},
                namespace=NS,
            )
            if self.up:
                job = self.emu.get("batch/v1", "Job", job["metadata"]["name"], namespace=NS)
                self._call(handlers.job_event, body=job, namespace=NS)

    def _patch_spec(self, patch: dict[str, Any]) -> None:
        old = self.body()["spec"]
        try:  # through the API server's schema and CEL, as `kubectl patch --type merge`
            Kube(self.client).merge_patch(API_VERSION, PLURAL, self.name, NS, {"spec": patch})
        except KubeError as e:
            assert e.code == 422, e
            return
        if self.up:
            self._spec_handlers(old, self.body()["spec"])

    def children(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The run's children by (kind, name)."""
        out = {}
        for api, kind in (
            ("batch/v1", "Job"),
            ("v1", "ConfigMap"),
            ("v1", "ServiceAccount"),
            ("rbac.authorization.k8s.io/v1", "Role"),
            ("rbac.authorization.k8s.io/v1", "RoleBinding"),
            ("v1", "Service"),
        ):
            for obj in self.emu.list(api, kind, namespace=NS):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == self.uid for r in refs):
                    out[(kind, obj["metadata"]["name"])] = obj
        return out


def spec_violations(body: dict[str, Any]) -> list[policy.Violation]:
    run = builders.Run.from_body(body)
    return policy.check_spec(run.spec, POLICY, WORKER_IMAGE)


def _content(obj: dict[str, Any]) -> Any:
    """What a child holds (a Job without ``spec.suspend``; metadata and status left out)."""
    if obj["kind"] == "Job":
        spec = {k: v for k, v in obj["spec"].items() if k != "suspend"}
        return spec, obj["metadata"].get("labels"), obj["metadata"].get("annotations")
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _allowed_image(image: str) -> bool:
    return image == WORKER_IMAGE or any(
        fnmatch.fnmatchcase(image, p) for p in POLICY.allowed_images
    )


def template_violations(job: dict[str, Any]) -> list[str]:
    """An independent reading of the policy on a built pod template."""
    pod = job["spec"]["template"]["spec"]
    out = []
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if not _allowed_image(c["image"]):
            out.append(f"image {c['image']}")
        for e in c.get("env") or []:
            if e["name"].startswith("LD_"):
                out.append(f"env {e['name']}")
    for v in pod.get("volumes") or []:
        hp = (v.get("hostPath") or {}).get("path")
        if hp is not None:
            p = posixpath.normpath(hp)
            if not any(p == q or p.startswith(q + "/") for q in POLICY.allowed_host_paths):
                out.append(f"hostPath {hp}")
    pc = pod.get("priorityClassName")
    if pc is not None and not fnmatch.fnmatchcase(pc, "team-*"):
        out.append(f"priorityClassName {pc}")
    for t in pod.get("tolerations") or []:
        if str(t.get("key", "")).startswith("node-role.kubernetes.io/"):
            out.append(f"toleration {t.get('key')}")
    out += [str(v) for v in policy.check_pod_spec(pod, "pod")]
    return out


def _finished(job: dict[str, Any]) -> bool:
    return handlers._job_finished(job) is not None


def check_invariants(h: Harness, before: dict[tuple[str, str], dict[str, Any]]) -> None:
    body = h.body()
    refused = spec_violations(body)
    after = h.children()
    for key, obj in after.items():
        if obj["kind"] == "Job":
            bad = template_violations(obj)
            assert not bad, f"{key}: a pod template the policy refuses: {bad}"
        changed = key not in before or _content(before[key]) != _content(obj)
        if changed:
            assert not refused, f"{key} created or changed from a refused spec: {refused}"
    if refused and h.up:
        status = body.get("status") or {}
        assert status.get("phase") in ("Failed", "Succeeded"), status
        for key, obj in after.items():
            if obj["kind"] == "Job" and not _finished(obj):
                assert obj["spec"].get("suspend") is True, f"{key} runs for a refused spec"


@pytest.fixture
def client(emulator: Any, kubeconfig: Path) -> Any:
    emulator.load_crd(build_crd())
    c = kconfig.new_client_from_config(config_file=str(kubeconfig))
    yield c
    c.close()


_names = itertools.count()


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    start=st.sampled_from([{}, {"suspend": True}, {"device": GOOD_PATCHES[5]["device"]}]),
    steps=st.lists(step, min_size=2, max_size=10),
)
def test_no_child_is_created_or_changed_from_a_refused_spec(
    emulator: Any, client: Any, start: dict[str, Any], steps: list[tuple[str, Any]]
) -> None:
    spec = copy.deepcopy(BASE)
    for k, v in start.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    if "compileCache" in spec.get("device", {}):
        spec["device"]["compileCache"] = {"claimName": "graphs"}
    h = Harness(emulator, client, f"p{next(_names)}", spec)
    check_invariants(h, {})
    for action, arg in steps:
        before = h.children()
        h.apply(action, arg)
        check_invariants(h, before)


def _now() -> str:
    from npu_lora_operator.status import now_iso

    return now_iso()


def _failed(body: dict[str, Any]) -> dict[str, Any]:
    (cond,) = [c for c in body["status"]["conditions"] if c["type"] == "Failed"]
    return cond


def test_suspended_run_edited_while_the_operator_is_down_is_refused_on_restart(
    emulator: Any, client: Any
) -> None:
    """The reported case: a suspended run, its spec edited (image, a compile-cache hostPath at
    /etc, a system priority class, precompile on), the operator restarted."""
    h = Harness(emulator, client, "edited", {**copy.deepcopy(BASE), "suspend": True})
    job = emulator.get("batch/v1", "Job", "edited", namespace=NS)
    assert job["spec"]["suspend"] is True
    h.apply("stop", None)
    h._patch_spec(
        {
            "image": "evil.example.com/miner:1",
            "device": {"precompile": True, "compileCache": {"hostPath": "/etc"}},
            "podTemplate": {"priorityClassName": "system-node-critical"},
        }
    )
    before = h.children()
    h.apply("restart", None)
    after = h.children()
    assert set(after) == set(before), "a child was created on resume"
    assert ("Job", "edited-compile") not in after
    jobs = emulator.list("batch/v1", "Job", namespace=NS)
    assert not [j for j in jobs if template_violations(j)]
    body = h.body()
    assert body["status"]["phase"] == "Failed"
    cond = _failed(body)
    assert cond["reason"] == "PolicyViolation"
    for field in (
        "spec.image",
        "spec.device.compileCache.hostPath",
        "spec.podTemplate.priorityClassName",
    ):
        assert field in cond["message"], cond["message"]
    assert emulator.get("batch/v1", "Job", "edited", namespace=NS)["spec"]["suspend"] is True
    # un-suspending the failed run starts nothing
    h._patch_spec({"suspend": False})
    assert emulator.get("batch/v1", "Job", "edited", namespace=NS)["spec"]["suspend"] is True


def test_a_refused_spec_change_stops_the_running_job_and_changes_nothing(
    emulator: Any, client: Any
) -> None:
    h = Harness(emulator, client, "live", copy.deepcopy(BASE))
    assert not emulator.get("batch/v1", "Job", "live", namespace=NS)["spec"].get("suspend")
    cm = emulator.get("v1", "ConfigMap", "live-config", namespace=NS)["data"]
    h._patch_spec({"checkpoint": {"everySteps": 7}, "image": "evil.example.com/miner:1"})
    assert emulator.get("v1", "ConfigMap", "live-config", namespace=NS)["data"] == cm
    job = emulator.get("batch/v1", "Job", "live", namespace=NS)
    assert job["spec"]["suspend"] is True
    assert _failed(h.body())["reason"] == "PolicyViolation"
    assert "spec.image" in h.body()["status"]["message"]
    # someone else (Kueue re-admitting the workload) resumes it: suspended again on its event
    h.apply("kueue-unsuspend", None)
    assert emulator.get("batch/v1", "Job", "live", namespace=NS)["spec"]["suspend"] is True


def test_a_precompiled_run_edited_before_its_compile_finished_gets_no_training_job(
    emulator: Any, client: Any
) -> None:
    spec = copy.deepcopy(BASE)
    spec["device"] = {**spec["device"], "precompile": True, "compileCache": {"claimName": "g"}}
    h = Harness(emulator, client, "pc", spec)
    assert set(h.children()) >= {("Job", "pc-compile")}
    h.apply("stop", None)
    h._patch_spec({"podTemplate": {"env": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}]}})
    h.apply("compiled", None)  # nobody watching: the event is seen after the restart
    h.apply("restart", None)
    job = emulator.get("batch/v1", "Job", "pc-compile", namespace=NS)
    h._call(handlers.job_event, body=job, namespace=NS)
    assert emulator.get("batch/v1", "Job", "pc", namespace=NS) is None
    assert "spec.podTemplate.env" in _failed(h.body())["message"]


def test_a_finished_run_keeps_its_verdict_when_a_refused_spec_is_applied(
    emulator: Any, client: Any
) -> None:
    h = Harness(emulator, client, "done", copy.deepcopy(BASE))
    emulator.patch(
        API_VERSION,
        "MoEFinetune",
        "done",
        {"status": {"phase": "Succeeded"}},
        namespace=NS,
        subresource="status",
    )
    cm = emulator.get("v1", "ConfigMap", "done-config", namespace=NS)["data"]
    h._patch_spec({"checkpoint": {"everySteps": 9}, "image": "evil.example.com/miner:1"})
    assert h.body()["status"]["phase"] == "Succeeded"
    assert emulator.get("v1", "ConfigMap", "done-config", namespace=NS)["data"] == cm
