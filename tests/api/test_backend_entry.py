"""The registry owns its backend: what each entry carries and who reads it (node keys, resources,
CPU-likeness, compile device, compiler, cache folder, sandbox capacity)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from npu_lora.api import backends as registry

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "charts/npu-lora-operator/values.yaml"


def test_each_entry_names_its_compile_device_cache_folder_and_cpu_likeness() -> None:
    furiosa, cuda, cpu = (registry.entry(n) for n in ("furiosa", "cuda", "cpu"))
    assert (furiosa.compiler, furiosa.cache_dir) == ("furiosa-torch", "furiosa")
    assert (cuda.compiler, cuda.compile_device, cuda.cache_dir) == ("inductor", "cuda", "cuda")
    assert (cpu.compiler, cpu.compile_device, cpu.cache_dir) == ("inductor", "cpu", "cpu")
    assert [n for n in registry.names() if registry.is_host(n)] == ["cpu"]
    assert not registry.is_host(registry.AUTO) and not registry.is_host("nonesuch")


def test_resources_are_the_card_and_its_partitions() -> None:
    assert registry.entry("furiosa").resources() == (
        "furiosa.ai/rngd",
        "furiosa.ai/rngd-1core.6gb",
        "furiosa.ai/rngd-2core.12gb",
        "furiosa.ai/rngd-4core.24gb",
    )
    assert registry.entry("cuda").resources() == ("nvidia.com/gpu",)
    assert registry.entry("cpu").resources() == ()


@pytest.mark.parametrize(
    ("backend", "cards", "want"),
    [("auto", 1, "furiosa"), ("auto", 0, "cpu"), ("cuda", 1, "cuda"), ("cpu", 0, "cpu")],
)
def test_resolve_is_what_a_cluster_run_runs_as(backend: str, cards: int, want: str) -> None:
    assert registry.resolve(backend, cards).name == want


def test_resolve_agrees_with_the_compile_plan() -> None:
    from types import SimpleNamespace

    from npu_lora.compile.plan import resolve_backend

    for backend in registry.choices():
        for cards in (0, 1):
            spec = SimpleNamespace(device=SimpleNamespace(backend=backend, cards=cards))
            assert registry.resolve(backend, cards).name == resolve_backend(spec)


def test_the_policy_defaults_take_the_backends_node_and_taint_keys() -> None:
    from npu_lora_operator.policy import PodPolicy

    p = PodPolicy()
    assert p.allowed_node_selector_keys[:2] == ("furiosa.ai/*", "nvidia.com/*")
    assert p.allowed_toleration_keys == ("furiosa.ai/*", "nvidia.com/gpu", "npu-lora.io/*")
    extra = dataclasses.replace(registry.entry("cpu"), name="x", node_keys=("x.example/*",))
    registry.register(extra)
    try:
        assert "x.example/*" in registry.node_keys()
    finally:
        registry.unregister("x")


def test_the_charts_policy_values_are_the_operators_defaults() -> None:
    """values.yaml repeats the defaults the registry gives the policy: a new backend's node or
    taint keys must be added there too (this names the ones missing)."""
    from npu_lora_operator.policy import PodPolicy

    policy = yaml.safe_load(VALUES.read_text(encoding="utf-8"))["policy"]
    p = PodPolicy()
    for key, want in (
        ("allowedTolerationKeys", p.allowed_toleration_keys),
        ("allowedNodeSelectorKeys", p.allowed_node_selector_keys),
    ):
        missing = [k for k in want if k not in policy[key]]
        assert not missing, f"charts/npu-lora-operator/values.yaml policy.{key} lacks {missing}"
        assert tuple(policy[key]) == want, f"policy.{key}: {policy[key]} != {list(want)}"


def test_the_sandbox_node_offers_the_cards_each_entry_asks_for() -> None:
    labels, capacity = registry.example_node()
    assert capacity["furiosa.ai/rngd"] == "8" and capacity["furiosa.ai/rngd-1core.6gb"] == "64"
    assert "nvidia.com/gpu" not in capacity  # cuda's sandbox_cards: 0
    assert labels["furiosa.ai/npu.family"] == "rngd"
    registry.register(dataclasses.replace(registry.entry("cuda"), name="gpu2", sandbox_cards=3))
    try:
        assert registry.example_node()[1]["nvidia.com/gpu"] == "3"
    finally:
        registry.unregister("gpu2")


def test_precompile_refuses_an_inductor_backend_without_a_compile_device(tmp_path: Path) -> None:
    from npu_lora.compile import precompile

    entry = dataclasses.replace(registry.entry("cpu"), name="nodevice", compile_device=None)
    with pytest.raises(ValueError, match=r"nodevice: compiler inductor needs .*compile_device"):
        precompile._inductor(object(), ["forward"], tmp_path, entry)


def test_precompile_refuses_a_compiler_it_does_not_know() -> None:
    from npu_lora.compile import precompile

    assert precompile.compiler_of("cpu") is precompile.COMPILERS["inductor"]
    assert precompile.compiler_of("furiosa") is precompile.COMPILERS["furiosa-torch"]
    registry.register(dataclasses.replace(registry.entry("cpu"), name="odd", compiler="tvm"))
    try:
        with pytest.raises(ValueError, match="odd: compiler 'tvm' is not one the precompile"):
            precompile.compiler_of("odd")
    finally:
        registry.unregister("odd")


def test_the_worker_cache_root_takes_the_backends_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec
    from npu_lora.compile import cache

    monkeypatch.delenv(cache.ENV_ROOT, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for device, folder in (
        ({"backend": "furiosa", "cards": 1}, "furiosa"),
        ({"backend": "cpu"}, "cpu"),
        ({"backend": "auto", "cards": 1}, "furiosa"),
    ):
        spec = MoEFinetuneSpec.model_validate(
            {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": {"path": "example:jsonl-mini"},
                "device": {**device, "compileCache": {"claimName": "c"}},
            }
        )
        assert cache.cache_root(spec) == tmp_path / folder / "npu-lora"
