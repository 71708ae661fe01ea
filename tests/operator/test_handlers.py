"""The handlers' API logic in-process against the emulator (no kopf loop): idempotent creation,
adoption, status writes that leave the worker's subtree alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes import config as kconfig
from npu_lora_operator import builders, handlers
from npu_lora_operator.crd import build_crd
from npu_lora_operator.kube import Kube
from npu_lora_operator.settings import OperatorConfig

MFT = ("npu-lora.io/v1alpha1", "MoEFinetune")


@pytest.fixture
def env(emulator: Any, kubeconfig: Path) -> Any:
    emulator.load_crd(build_crd())
    client = kconfig.new_client_from_config(config_file=str(kubeconfig))
    memo = handlers.new_memo(OperatorConfig(worker_image="w:1"), Kube(client))
    body = emulator.create(
        {
            "apiVersion": "npu-lora.io/v1alpha1",
            "kind": "MoEFinetune",
            "metadata": {"name": "r1", "namespace": "default"},
            "spec": {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": {"path": "example:nsmc-mini"},
                "training": {"steps": 5},
            },
        }
    )
    yield emulator, body, memo.state
    client.close()


def test_create_is_idempotent(env: Any) -> None:
    emu, body, state = env
    run = builders.Run.from_body(body)
    children = builders.build_children(run, state.config)
    created = [handlers.ensure_object(state.kube, c, run)[1] for c in children]
    assert created == [True] * 5
    again = [handlers.ensure_object(state.kube, c, run)[1] for c in children]
    assert again == [False] * 5
    assert len(emu.list("batch/v1", "Job", namespace="default")) == 1
    job = emu.get("batch/v1", "Job", "r1", namespace="default")
    assert job["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]


def test_orphan_is_a_conflict_predecessor_is_waited_for(env: Any) -> None:
    emu, body, state = env
    run = builders.Run.from_body(body)
    cm = builders.build_configmap(run)
    # left by `kubectl delete --cascade=orphan` (or planted): never adopted
    orphan = {**cm, "metadata": {k: v for k, v in cm["metadata"].items() if k != "ownerReferences"}}
    emu.create(orphan)
    with pytest.raises(handlers.ChildConflict, match="ConfigMap default/r1-config exists"):
        handlers.ensure_object(state.kube, cm, run)

    job = builders.build_job(run, state.config)
    foreign = {
        **job,
        "metadata": {
            **job["metadata"],
            "ownerReferences": [{**job["metadata"]["ownerReferences"][0], "uid": "someone-else"}],
        },
    }
    emu.create(foreign)
    with pytest.raises(kopf.TemporaryError):
        handlers.ensure_object(state.kube, job, run)
    # ... but not forever: then a conflict naming the object
    with pytest.raises(handlers.ChildConflict, match="Job default/r1"):
        handlers.ensure_object(state.kube, job, run, retry=handlers.MAX_PREDECESSOR_RETRIES)


def test_planted_configmap_fails_the_run_and_is_not_used(env: Any) -> None:
    emu, body, state = env
    emu.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "r1-config", "namespace": "default"},
            "data": {"config.yaml": "planted: true"},
        }
    )
    with pytest.raises(kopf.PermanentError):
        handlers.ensure_run(
            body=body, name="r1", namespace="default", logger=_log(), memo=_memo(state)
        )
    mft = emu.get(*MFT, "r1", namespace="default")
    assert mft["status"]["phase"] == "Failed"
    (cond,) = [c for c in mft["status"]["conditions"] if c["type"] == "Failed"]
    assert cond["reason"] == "ChildConflict" and "ConfigMap default/r1-config" in cond["message"]
    assert emu.list("batch/v1", "Job", namespace="default") == []
    cm = emu.get("v1", "ConfigMap", "r1-config", namespace="default")
    assert cm["data"] == {"config.yaml": "planted: true"} and not cm["metadata"].get(
        "ownerReferences"
    )


def test_own_configmap_with_other_data_is_rewritten(env: Any) -> None:
    emu, body, state = env
    run = builders.Run.from_body(body)
    cm = builders.build_configmap(run)
    emu.create({**cm, "data": {"config.yaml": "tampered: true", "extra": "x"}})
    obj, created = handlers.ensure_object(state.kube, cm, run)
    assert not created and obj["data"] == cm["data"]


def test_crafted_name_equal_to_another_runs_job_name_fails_once(env: Any) -> None:
    emu, _, state = env
    long = "a" * 60
    spec = {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "example:nsmc-mini"}}
    first = emu.create(
        {**_mft(long, spec)},
    )
    r1 = builders.Run.from_body(first)
    for child in builders.build_children(r1, state.config):
        handlers.ensure_object(state.kube, child, r1)
    crafted = builders.job_name(long)
    assert crafted != long and len(crafted) <= 52
    second = emu.create(_mft(crafted, spec))
    with pytest.raises(kopf.PermanentError):
        handlers.ensure_run(
            body=second, name=crafted, namespace="default", logger=_log(), memo=_memo(state)
        )
    mft = emu.get(*MFT, crafted, namespace="default")
    assert (
        mft["status"]["phase"] == "Failed" and f"Job default/{crafted}" in mft["status"]["message"]
    )
    # the crafted run's suspend never touches the other run's Job
    handlers.suspend_changed(
        old=False,
        new=True,
        body=mft,
        spec=mft["spec"],
        name=crafted,
        namespace="default",
        logger=_log(),
        memo=_memo(state),
    )
    assert not emu.get("batch/v1", "Job", crafted, namespace="default")["spec"].get("suspend")


def _mft(name: str, spec: dict) -> dict:
    return {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def _log() -> Any:
    import logging

    return logging.getLogger("test")


def _memo(state: Any) -> Any:
    return kopf.Memo(state=state)


def test_reconcile_writes_only_operator_keys(env: Any) -> None:
    emu, body, state = env
    run = builders.Run.from_body(body)
    emu.patch(
        *MFT,
        "r1",
        {"status": {"progress": {"step": 2, "totalSteps": 5}}},
        namespace="default",
        subresource="status",
    )
    st = handlers.reconcile_status(state, "default", "r1")
    assert st is not None and st["phase"] == "Pending"
    for child in builders.build_children(run, state.config):
        handlers.ensure_object(state.kube, child, run)
    st = handlers.reconcile_status(state, "default", "r1")
    assert st["jobName"] == "r1"
    obj = emu.get(*MFT, "r1", namespace="default")
    assert obj["status"]["progress"] == {"step": 2, "totalSteps": 5, "percent": 0.0}
    assert obj["status"]["observedGeneration"] == 1
    # nothing changed: no write
    rv = obj["metadata"]["resourceVersion"]
    handlers.reconcile_status(state, "default", "r1")
    assert emu.get(*MFT, "r1", namespace="default")["metadata"]["resourceVersion"] == rv


def test_terminal_phase_kept_when_job_is_gone(env: Any) -> None:
    emu, _, state = env
    emu.patch(
        *MFT,
        "r1",
        {"status": {"phase": "Succeeded", "jobName": "r1"}},
        namespace="default",
        subresource="status",
    )
    st = handlers.reconcile_status(state, "default", "r1")
    assert st["phase"] == "Succeeded"  # the Job was removed by its TTL: keep the verdict


def test_run_name_of() -> None:
    assert handlers.run_name_of({"metadata": {"annotations": {"npu-lora.io/run-name": "a"}}}) == "a"
    assert (
        handlers.run_name_of(
            {"metadata": {"ownerReferences": [{"kind": "MoEFinetune", "name": "b"}]}}
        )
        == "b"
    )
    assert handlers.run_name_of({"metadata": {"labels": {"npu-lora.io/run": "c"}}}) == "c"


def test_settings() -> None:
    s = handlers.build_settings()
    assert s.persistence.finalizer.startswith("npu-lora.io/")
    assert s.peering.standalone is True
    assert s.scanning.disabled is True


def test_rejected_child_fails_the_run(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from npu_lora_operator.kube import KubeError

    emu, body, state = env
    kube = state.kube
    real_create = kube.create

    def create(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Job":
            raise KubeError(422, "Invalid", 'Job.batch "r1" is invalid: spec.template: bad')
        return real_create(obj)

    monkeypatch.setattr(kube, "create", create)
    with pytest.raises(kopf.PermanentError):
        handlers.ensure_run(
            body=body,
            name="r1",
            namespace="default",
            logger=logging.getLogger("t"),
            memo=kopf.Memo(state=state),
        )
    st = emu.get(*MFT, "r1", namespace="default")["status"]
    assert st["phase"] == "Failed"
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert "spec.template: bad" in st["message"]
    # a later reconcile keeps the verdict (there is no Job)
    assert handlers.reconcile_status(state, "default", "r1")["phase"] == "Failed"


PRECOMPILED = {
    "model": {"preset": "tiny-qwen3-moe"},
    "data": {"path": "example:nsmc-mini"},
    "moe": {"placement": "host-only"},
    "training": {"steps": 5, "seqLen": 8, "batchSize": 1},
    "device": {"backend": "cpu", "precompile": True, "compileCache": {"claimName": "graphs"}},
}


def _ensure(state: Any, body: dict, retry: int = 0) -> None:
    handlers.ensure_run(
        body=body,
        name=body["metadata"]["name"],
        namespace="default",
        logger=_log(),
        memo=_memo(state),
        retry=retry,
    )


def _job_status(emu: Any, name: str, status: dict) -> None:
    emu.patch(
        "batch/v1", "Job", name, {"status": status}, namespace="default", subresource="status"
    )


def test_precompiled_run_compiles_first_then_creates_the_training_job(env: Any) -> None:
    emu, _, state = env
    body = emu.create(_mft("pc", PRECOMPILED))
    _ensure(state, body)  # returns: the precompile Job's completion event goes on
    jobs = {j["metadata"]["name"]: j for j in emu.list("batch/v1", "Job", namespace="default")}
    assert list(jobs) == ["pc-compile"]  # no training Job, no card requested
    cjob = jobs["pc-compile"]
    assert cjob["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert cjob["spec"]["completions"] == 6
    s = emu.get(*MFT, "pc", namespace="default")["status"]
    assert s["phase"] == "Compiling"
    assert s["compile"] == {"done": 0, "total": 6, "jobName": "pc-compile"}  # no ETA yet

    _job_status(emu, "pc-compile", {"succeeded": 3, "active": 3, "startTime": st_now()})
    _ensure(state, body)  # resumed (operator restart): adopts, never duplicates
    handlers.job_event(
        body=_job(emu, "pc-compile"), namespace="default", memo=_memo(state), logger=_log()
    )
    assert len(emu.list("batch/v1", "Job", namespace="default")) == 1
    assert emu.get(*MFT, "pc", namespace="default")["status"]["compile"]["done"] == 3

    done = {"type": "Complete", "status": "True", "lastTransitionTime": st_now()}
    _job_status(emu, "pc-compile", {"succeeded": 6, "active": 0, "conditions": [done]})
    handlers.job_event(
        body=_job(emu, "pc-compile"), namespace="default", memo=_memo(state), logger=_log()
    )
    names = sorted(j["metadata"]["name"] for j in emu.list("batch/v1", "Job", namespace="default"))
    assert names == ["pc", "pc-compile"]
    s = emu.get(*MFT, "pc", namespace="default")["status"]
    assert s["jobName"] == "pc" and s["phase"] == "Pending"
    assert s["compile"] == {"done": 6, "total": 6, "etaSeconds": 0.0, "jobName": "pc-compile"}
    # a later event of the finished precompile Job changes nothing
    handlers.job_event(
        body=_job(emu, "pc-compile"), namespace="default", memo=_memo(state), logger=_log()
    )
    assert len(emu.list("batch/v1", "Job", namespace="default")) == 2


def _job(emu: Any, name: str) -> dict:
    return emu.get("batch/v1", "Job", name, namespace="default")


def test_failed_compile_fails_the_run_before_any_training_job(env: Any) -> None:
    emu, _, state = env
    body = emu.create(_mft("pf", PRECOMPILED))
    _ensure(state, body)
    cjob = emu.get("batch/v1", "Job", "pf-compile", namespace="default")
    emu.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "pf-compile-2-abc",
                "namespace": "default",
                "labels": {builders.RUN_LABEL: "pf"},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": "pf-compile",
                        "uid": cjob["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"containers": [{"name": "worker", "image": "w:1"}]},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "worker",
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "message": "compile of graph 2 head_n1 failed: LoweringException: boom",
                            }
                        },
                    }
                ],
            },
        },
        keep_status=True,
    )
    failed = {"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}
    _job_status(emu, "pf-compile", {"failed": 1, "conditions": [failed]})
    handlers.job_event(
        body=_job(emu, "pf-compile"), namespace="default", memo=_memo(state), logger=_log()
    )
    with pytest.raises(kopf.PermanentError, match="head_n1"):  # resumed: gives up at once
        _ensure(state, {**body, "status": {}})
    s = emu.get(*MFT, "pf", namespace="default")["status"]
    assert s["phase"] == "Failed"
    (cond,) = [c for c in s["conditions"] if c["type"] == "Failed"]
    assert cond["reason"] == "CompileFailed"
    assert "compile of graph 2 head_n1 failed: LoweringException: boom" in cond["message"]
    assert emu.get("batch/v1", "Job", "pf", namespace="default") is None
    _ensure(state, emu.get(*MFT, "pf", namespace="default"))  # terminal: nothing more


def test_precompile_off_creates_the_training_job_at_once(env: Any) -> None:
    emu, _, state = env
    spec = {**PRECOMPILED, "device": {**PRECOMPILED["device"], "precompile": False}}
    body = emu.create(_mft("po", spec))
    _ensure(state, body)
    names = [j["metadata"]["name"] for j in emu.list("batch/v1", "Job", namespace="default")]
    assert names == ["po"]
    assert "compile" not in emu.get(*MFT, "po", namespace="default")["status"]


def st_now() -> str:
    from npu_lora_operator.status import now_iso

    return now_iso()
