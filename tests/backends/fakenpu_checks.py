"""``fakenpu`` followed end to end, on a copy of the tree that ``test_fakenpu.py`` made with one
module (``npu_lora/backends/fakenpu.py``) and one register line added (the file is not named
``test_*``: the suite runs it only there).

Nothing else names the backend. Each test checks one consumer of the registry: the CRD, the
policy, the operator's Job, the compile plan and the precompile step, the sandbox's node, the
engine (a tiny ``npu-lora run`` on it)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_lora.api import backends as registry

BACKEND = "fakenpu"
RESOURCE = "fakenpu.example/card"
FAMILY_LABEL = "fakenpu.example/family"


def body(name: str = "f1", **device: Any) -> dict[str, Any]:
    return {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:nsmc-mini"},
            "device": {"backend": BACKEND, "cards": 1, **device},
        },
    }


def test_the_tree_registers_it_from_its_own_module() -> None:
    from npu_lora.backends import backend_class

    assert BACKEND in registry.names() and registry.entry(BACKEND).host
    assert backend_class(BACKEND).__module__ == "npu_lora.backends.fakenpu"


def test_the_api_models_and_the_cli_take_it() -> None:
    from npu_lora.api.v1alpha1 import DeviceSpec
    from npu_lora.cli import main

    assert DeviceSpec(backend=BACKEND, cards=1).backend == BACKEND
    with pytest.raises(ValueError, match="cards must be at least 1"):
        DeviceSpec(backend=BACKEND, cards=0)
    with pytest.raises(SystemExit):  # argparse's choices come from the registry too
        main(["compile-plan", "x.yaml", "--backend", "nonesuch"])


def test_the_crd_accepts_it_and_keeps_its_rules() -> None:
    from npu_lora_operator.crd import build_crd
    from npu_lora_sandbox.emulator import ApiEmulator, ApiError

    crd = build_crd()
    device = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["device"]
    assert BACKEND in device["properties"]["backend"]["enum"]
    assert "fakenpu-1" in device["properties"]["product"]["enum"]
    emu = ApiEmulator().start()
    try:
        emu.load_crd(crd)
        emu.create(body("ok", product="fakenpu-1"))  # the schema and its CEL rules accept it
        with pytest.raises(ApiError, match=f"cards must be at least 1 with backend .*{BACKEND}"):
            emu.create(body("nocards", cards=0))  # an accelerator: the card rule covers it
        with pytest.raises(ApiError, match="Unsupported value"):
            emu.create(body("nope", backend="nonesuch"))
    finally:
        emu.stop()


def test_the_policy_defaults_and_the_operator_use_its_node_keys_and_resources() -> None:
    from npu_lora_operator import builders
    from npu_lora_operator.policy import PodPolicy, check_pod_template

    p = PodPolicy()
    assert "fakenpu.example/*" in p.allowed_node_selector_keys
    assert "fakenpu.example/card" in p.allowed_toleration_keys
    pt = {
        "nodeSelector": {"fakenpu.example/zone": "a"},
        "tolerations": [{"key": RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
    }
    assert check_pod_template(pt, p) == []
    run = builders.Run.from_body(body(product="fakenpu-1"))
    assert builders.accelerator_resources(run) == {RESOURCE: 1}
    assert builders.node_requirements(run) == [
        {"key": FAMILY_LABEL, "operator": "In", "values": ["fakenpu"]},
        {"key": "fakenpu.example/product", "operator": "In", "values": ["fakenpu-1"]},
    ]
    cfg = builders.OperatorConfig(worker_image="reg/worker:1", worker_command=("npu-lora",))
    cached = builders.Run.from_body(body(compileCache={"claimName": "cache"}))
    job = builders.build_job(cached, cfg)
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"][RESOURCE] == "1"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NPU_LORA_COMPILE_CACHE"] == "/mnt/cache/fakenpu-cache/npu-lora"
    assert {"name": "compile-cache", "mountPath": "/mnt/cache/fakenpu-cache"} in c["volumeMounts"]


def test_precompile_compiles_its_graph_with_its_compiler_device_and_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec
    from npu_lora.compile import cache
    from npu_lora.compile.plan import compile_plan
    from npu_lora.compile.precompile import compile_entry

    spec = MoEFinetuneSpec.model_validate(
        {**body()["spec"], "training": {"seqLen": 16, "batchSize": 1}}
    )
    plan = compile_plan(spec)
    assert plan.backend == BACKEND and "inductor" in plan.compiler
    entry = min(plan.entries, key=lambda e: ("backward" in e.directions, e.index))
    out = compile_entry(plan, entry, tmp_path / "graphs")
    assert out["outcome"] == "published", out
    doc = cache.read_entry(tmp_path / "graphs", entry.key)
    assert doc is not None and doc["backend"] == BACKEND
    assert doc["how"]["compiler_call"].endswith(" on cpu")  # its compile_device
    monkeypatch.delenv(cache.ENV_ROOT, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with_cache = MoEFinetuneSpec.model_validate(
        {
            **body()["spec"],
            "device": {**body()["spec"]["device"], "compileCache": {"claimName": "c"}},
        }
    )
    assert cache.cache_root(with_cache) == tmp_path / "xdg" / "fakenpu-cache" / "npu-lora"


def test_the_sandbox_node_offers_its_cards_and_schedules_its_job(tmp_path: Path) -> None:
    from npu_lora_operator import builders
    from npu_lora_sandbox.emulator import ApiEmulator
    from npu_lora_sandbox.kubelet import LocalKubelet
    from sandbox_fixtures import wait_for

    emu = ApiEmulator().start()
    kl = LocalKubelet(emu, root=tmp_path / "sandbox", backoff_seconds=0.05).start()
    try:
        node = emu.get("v1", "Node", kl.node_name)
        assert node["status"]["allocatable"][RESOURCE] == "2"  # its sandbox_cards
        assert node["metadata"]["labels"][FAMILY_LABEL] == "fakenpu"
        run = builders.Run.from_body(body(cards=2))
        cfg = builders.OperatorConfig(worker_image="reg/worker:1", worker_command=("npu-lora",))
        job = copy.deepcopy(builders.build_job(run, cfg))
        pod = job["spec"]["template"]["spec"]
        assert pod["affinity"]["nodeAffinity"]  # the family label, from its node facts
        pod["volumes"] = [v for v in pod.get("volumes", []) if "configMap" not in v]
        (c,) = pod["containers"]
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] != "config"]
        # not sys.executable: a venv under /tmp (a CI clone) is shadowed by the pod's /tmp volume
        c["command"] = ["/bin/sh", "-c", "echo on fakenpu"]
        emu.create(job)
        name = job["metadata"]["name"]

        def complete() -> bool:
            j = emu.get("batch/v1", "Job", name, "default") or {}
            conds = (j.get("status") or {}).get("conditions") or []
            return any(x["type"] == "Complete" and x["status"] == "True" for x in conds)

        wait_for(complete, timeout=60)
        too_many = copy.deepcopy(job)
        too_many["metadata"] = {"name": "toomany", "namespace": "default"}
        too_many["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][RESOURCE] = "3"
        too_many["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"][RESOURCE] = (
            "3"
        )
        emu.create(too_many)

        def unschedulable() -> list[dict[str, Any]]:
            pods = emu.list("v1", "Pod", "default", label_selector="job-name=toomany")
            return [
                x
                for p in pods
                for x in p["status"].get("conditions") or []
                if x["type"] == "PodScheduled" and x["status"] == "False"
            ]

        assert f"Insufficient {RESOURCE}" in wait_for(unschedulable, timeout=30)[0]["message"]
    finally:
        kl.stop()
        emu.stop()


def test_the_engine_trains_on_it_through_the_cli(tmp_path: Path) -> None:
    from npu_lora import cli
    from npu_lora.backends.fakenpu import FakeNpuBackend

    manifest = tmp_path / "f.yaml"
    doc = body()
    doc["spec"]["training"] = {"steps": 2, "seqLen": 32, "batchSize": 2}
    doc["spec"]["moe"] = {"placement": "host-only"}
    manifest.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out = tmp_path / "run"
    rc = cli.main(["run", str(manifest), "--out", str(out), "-q", "--no-plot", "--no-tensorboard"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert FakeNpuBackend.made  # the registry's implementation drove the run
    assert BACKEND in json.dumps(summary)
