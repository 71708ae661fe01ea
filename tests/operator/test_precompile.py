"""spec.device.precompile: the Indexed precompile Job (pure builder), its status, torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest
from npu_lora.api import backends as registry
from npu_lora_operator import builders
from npu_lora_operator.precompile import (
    build_precompile_job,
    compile_status,
    plan_size,
    precompile_job_name,
    wants_precompile,
)
from npu_lora_operator.settings import OperatorConfig

CACHE = {"claimName": "graph-cache"}


def run_of(**device) -> builders.Run:
    body = {
        "metadata": {"name": "r1", "namespace": "ns", "uid": "u1"},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:jsonl-mini"},
            "moe": {"placement": "hot"},
            "training": {"seqLen": 32, "steps": 10},
            "device": device,
        },
    }
    return builders.Run.from_body(body)


@pytest.mark.parametrize(
    ("device", "want"),
    [
        ({"backend": "furiosa", "compileCache": CACHE}, True),  # auto: on for furiosa
        ({"backend": "cpu", "compileCache": CACHE}, False),  # auto: off elsewhere
        ({"backend": "cpu", "compileCache": CACHE, "precompile": True}, True),
        ({"backend": "furiosa", "compileCache": CACHE, "precompile": False}, False),
        ({"backend": "furiosa"}, False),  # nowhere to compile into
    ],
)
def test_wants_precompile(device, want):
    assert wants_precompile(run_of(**device)) is want


def test_precompile_job_is_indexed_cpu_only_on_the_shared_cache():
    run = run_of(backend="furiosa", compileCache=CACHE, cards=1)
    n = plan_size(run)
    assert n == 11  # embed, attention, head_n1..32 (6), hot_experts_b8..32 (3) on furiosa
    job = build_precompile_job(run, OperatorConfig(), n)
    spec = job["spec"]
    assert job["metadata"]["name"] == precompile_job_name("r1") == "r1-compile"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == n
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][-2:] == ["precompile", builders.CONFIG_PATH]
    res = c["resources"]
    for resource in registry.entry("furiosa").resources():  # CPU only: no card, no partition
        assert resource not in res.get("requests", {})
        assert resource not in res.get("limits", {})
    assert "nodeSelector" not in pod
    env = {e["name"]: e["value"] for e in c["env"]}
    # the registry's cache folder: furiosa-torch keeps its own cache at $XDG_CACHE_HOME/furiosa
    graphs = "/mnt/cache/furiosa/npu-lora"
    assert env["NPU_LORA_COMPILE_CACHE"] == graphs == builders.graph_cache(run.spec)
    assert env["XDG_CACHE_HOME"] == builders.CACHE_ROOT
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["compile-cache"]["persistentVolumeClaim"]["claimName"] == "graph-cache"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["compile-cache"]["mountPath"] == "/mnt/cache/furiosa"
    assert "readOnly" not in mounts["compile-cache"]
    assert spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"][0] == 1
    # the training Job mounts the same volume at the same place: it finds the entries
    train = builders.build_job(run, OperatorConfig())
    tc = train["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "compile-cache", "mountPath": "/mnt/cache/furiosa"} in tc["volumeMounts"]
    assert {"name": "XDG_CACHE_HOME", "value": builders.CACHE_ROOT} in tc["env"]
    assert {"name": "NPU_LORA_COMPILE_CACHE", "value": graphs} in tc["env"]


@pytest.mark.parametrize(
    ("device", "folder"),
    [
        ({"backend": "furiosa", "cards": 1}, "furiosa"),
        ({"backend": "cpu"}, "cpu"),
        ({"backend": "cuda", "cards": 1}, "cuda"),
        ({"backend": "auto", "cards": 1}, "furiosa"),  # auto resolves as the cluster would
        ({"backend": "auto", "cards": 0}, "cpu"),
    ],
)
def test_the_compile_cache_folder_is_the_backends_own(device, folder):
    run = run_of(compileCache=CACHE, **device)
    assert builders.cache_mount(run.spec) == f"/mnt/cache/{folder}"
    tc = builders.build_job(run, OperatorConfig())["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "compile-cache", "mountPath": f"/mnt/cache/{folder}"} in tc["volumeMounts"]


def test_precompile_job_parallelism_is_capped_and_needs_a_cache():
    run = run_of(backend="furiosa", compileCache=CACHE)
    job = build_precompile_job(run, OperatorConfig(), 40, max_parallel=8)
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (40, 8)
    with pytest.raises(ValueError, match="compileCache"):
        build_precompile_job(run_of(backend="furiosa"), OperatorConfig(), 3)
    with pytest.raises(ValueError):
        build_precompile_job(run, OperatorConfig(), 0)


def test_plan_size_is_none_for_a_model_on_a_volume():
    body = {
        "metadata": {"name": "r", "namespace": "n", "uid": "u"},
        "spec": {
            "model": {"path": ".", "volume": {"claimName": "m"}},
            "data": {"path": "example:x"},
            "device": {"backend": "furiosa", "compileCache": CACHE},
        },
    }
    assert plan_size(builders.Run.from_body(body)) is None


def test_compile_status():
    assert compile_status(None, 11, 0.0, "j") == {
        "done": 0,
        "total": 11,
        "etaSeconds": None,
        "jobName": "j",
    }
    assert compile_status({"succeeded": 4}, 12, 100.0, "j")["etaSeconds"] == 200.0
    assert compile_status({"succeeded": 12}, 12, 300.0, "j")["etaSeconds"] == 0.0


def test_precompile_builders_are_torch_free():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from npu_lora_operator import builders, precompile, settings\n"
        "body = {'metadata': {'name': 'r', 'namespace': 'n', 'uid': 'u'}, 'spec': {"
        "'model': {'preset': 'qwen3-30b-a3b'}, 'data': {'path': 'example:x'},"
        "'device': {'backend': 'furiosa', 'compileCache': {'claimName': 'c'}}}}\n"
        "run = builders.Run.from_body(body)\n"
        "n = precompile.plan_size(run)\n"
        "precompile.build_precompile_job(run, settings.OperatorConfig(), n)\n"
        "print(n)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "15"  # Qwen3-30B-A3B, seqLen 128: see docs/compile.md


def test_operator_precompile_pods_and_the_training_pod_plan_the_same_keys(tmp_path, monkeypatch):
    """The ConfigMap's worker config (what both pods read) gives the keys of the run's spec, and
    `npu-lora precompile` reads it with the index from JOB_COMPLETION_INDEX."""
    import yaml
    from npu_lora.api.load import load_manifest
    from npu_lora.compile.plan import compile_plan

    run = run_of(backend="furiosa", compileCache=CACHE, precompile=True)
    cm = builders.build_configmap(run)
    f = tmp_path / "config.yaml"
    f.write_text(cm["data"][builders.CONFIG_KEY])
    worker_spec = load_manifest(f).spec
    assert worker_spec.device.compile_cache == run.spec.device.compile_cache  # precompile needs it
    assert worker_spec.device.precompile_enabled
    assert compile_plan(worker_spec).keys == compile_plan(run.spec).keys
    assert len(compile_plan(worker_spec).keys) == plan_size(run)
    assert yaml.safe_load(f.read_text())["spec"]["device"]["precompile"] is True


def test_a_stored_run_in_the_old_string_form_fails_naming_the_new_form():
    """An object stored before the field became a boolean: the operator's parse refuses it
    (the run fails InvalidSpec with this message) instead of guessing."""
    with pytest.raises(ValueError, match="write precompile: true without quotes"):
        run_of(backend="furiosa", compileCache=CACHE, precompile="true")
