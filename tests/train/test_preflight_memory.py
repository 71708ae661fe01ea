"""The worker's memory pre-flight: its own cgroup limit against the torch-free estimate, before a
single weight (or the tokenizer) is loaded, for presets and models given by path alike."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from npu_lora.api import memory
from npu_lora.api.load import load_manifest
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR
from npu_lora.cli import main
from npu_lora.train import preflight
from train_helpers import tiny_manifest

QWEN_CONFIG = Path(preflight.__file__).parents[1] / "models" / "configs" / "qwen3-30b-a3b.json"


def _cgroup(tmp_path: Path, monkeypatch, proc: str, files: dict[str, str]) -> None:
    root = tmp_path / "cgroup"
    for rel, value in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(value + "\n")
    (tmp_path / "proc-cgroup").write_text(proc)
    monkeypatch.setattr(preflight, "CGROUP_ROOT", root)
    monkeypatch.setattr(preflight, "PROC_CGROUP", tmp_path / "proc-cgroup")
    monkeypatch.delenv("NPU_LORA_MEMORY_LIMIT", raising=False)


def test_cgroup_v2_limit_is_the_smallest_on_the_process_path(tmp_path, monkeypatch):
    _cgroup(
        tmp_path,
        monkeypatch,
        "0::/kubepods/pod1/ctr\n",
        {
            "memory.max": "max",
            "kubepods/memory.max": str(64 << 30),
            "kubepods/pod1/memory.max": str(8 << 30),
            "kubepods/pod1/ctr/memory.max": "max",
        },
    )
    limit, source = preflight.memory_limit()
    assert limit == 8 << 30 and "kubepods/pod1/memory.max" in source


def test_cgroup_v1_memory_limit_and_unlimited(tmp_path, monkeypatch):
    proc = "4:memory:/pod2\n1:cpu:/pod2\n0::/\n"
    _cgroup(tmp_path, monkeypatch, proc, {"memory/pod2/memory.limit_in_bytes": str(6 << 30)})
    assert preflight.cgroup_memory_limit() == (
        6 << 30,
        str(tmp_path / "cgroup/memory/pod2/memory.limit_in_bytes"),
    )
    _cgroup(
        tmp_path, monkeypatch, proc, {"memory/pod2/memory.limit_in_bytes": "9223372036854771712"}
    )
    assert preflight.cgroup_memory_limit() is None


def test_an_undersized_worker_fails_before_loading_naming_the_limit_field(
    tmp_path, monkeypatch, capsys
):
    """A Qwen3-30B-A3B given by path (config.json only: nothing else could be loaded) in an
    8 GiB cgroup: exit 2 at once, naming spec.resources.limits.memory and the figure to set."""
    model = tmp_path / "qwen"
    model.mkdir()
    shutil.copy(QWEN_CONFIG, model / "config.json")
    _cgroup(tmp_path, monkeypatch, "0::/pod\n", {"pod/memory.max": str(8 << 30)})
    import npu_lora.data

    def no_data(*a, **k):
        raise AssertionError("the data (and tokenizer) must not be loaded")

    monkeypatch.setattr(npu_lora.data, "prepare_data", no_data)
    cfg = tiny_manifest(tmp_path, model={"path": str(model), "preset": None})
    out = tmp_path / "run"
    t0 = time.perf_counter()
    code = main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"])
    err = capsys.readouterr().err
    assert code == EXIT_CONFIG_ERROR, err
    assert "Set spec.resources.limits.memory" in err and "pod/memory.max" in err
    spec = load_manifest(_spec_of(cfg)).spec
    cfg_w = preflight.model_widths(spec)
    widest, bf16 = (memory.estimate(spec, cfg_w, host_dtype=d) for d in ("float32", "bfloat16"))
    # auto's widest choice (what the operator's `memory: auto` sets), and the bf16 figure
    assert f"at least {memory.recommended_limit(widest) >> 30}Gi " in err
    assert f"({memory.recommended_limit(bf16) >> 30}Gi with moe.hostDtype: bfloat16)" in err
    assert not out.exists() and time.perf_counter() - t0 < 10


def _spec_of(manifest: Path) -> dict:
    import yaml

    return yaml.safe_load(manifest.read_text())["spec"]


@pytest.mark.parametrize(("dtype", "gib"), [("float32", 108.0), ("bfloat16", 54.0)])
def test_qwen3_expert_weights_by_host_dtype(dtype, gib):
    spec = load_manifest(
        {
            "model": {"preset": "qwen3-30b-a3b"},
            "data": {"path": "example:x"},
            "moe": {"hostDtype": dtype},
        }
    ).spec
    est = memory.preset_estimate(spec)
    assert est is not None and round(est.weights / memory.GiB, 1) == gib
    assert est.host_dtype == dtype


def test_auto_host_dtype_is_sized_as_its_widest_choice_without_the_cpu():
    spec = load_manifest({"model": {"preset": "qwen3-30b-a3b"}, "data": {"path": "example:x"}}).spec
    assert spec.moe.host_dtype == "auto"
    assert memory.preset_estimate(spec).host_dtype == memory.AUTO_HOST_DTYPE == "float32"
