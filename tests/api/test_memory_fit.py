"""``memory: auto``'s estimate is what a run holds: the processes' measured runtime is a term of
it (per rank, plus the launcher; a Hugging Face tokenizer by its vocabulary), the limit is the
estimate × HEADROOM rounded up to a GiB, and the tiny 4K chat example's peak RSS is within 15 %
of its estimate (experiments/2026-12-05-memory-fit.md)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from npu_lora.api import memory
from npu_lora.api.load import load_manifest
from testkit import REPO, run_cli

TINY_4K = REPO / "examples" / "tiny-chat-4k.yaml"


def _spec(*sets: str):
    """The tiny 4K example's spec with ``--set`` overrides."""
    return load_manifest(TINY_4K, list(sets)).spec


def test_the_estimate_counts_the_runtime_and_the_limit_is_estimate_times_headroom():
    spec = _spec()
    est = memory.preset_estimate(spec)
    assert est is not None and est.runtime == memory.RUNTIME_BYTES  # a preset: byte-level
    parts = (est.weights, est.trainable, est.activations, est.data, est.runtime, est.transient)
    assert est.total == sum(parts)
    limit = memory.recommended_limit(est)
    assert limit == est.limit == math.ceil(est.total * memory.HEADROOM / memory.GiB) * memory.GiB
    assert limit == 1 * memory.GiB  # tiny widths: no fixed allowance dominates any more
    text = est.with_limit()
    assert "runtime" in text and f"limit {limit // memory.GiB} GiB" in text


def test_ranks_in_a_worker_multiply_their_own_terms_and_share_the_experts():
    one = memory.preset_estimate(_spec())
    two = memory.preset_estimate(_spec("distributed.ranksPerWorker=2"))
    assert two.ranks == 2
    assert two.runtime == 2 * memory.RUNTIME_BYTES + memory.LAUNCHER_BYTES
    assert (two.activations, two.trainable, two.data) == (
        2 * one.activations,
        2 * one.trainable,
        2 * one.data,
    )
    cfg = memory.text_config(memory.preset_config("tiny-qwen3-moe"))
    experts = memory._expert_weight_bytes(two.host_dtype, 2, 8, 64, cfg["moe_intermediate_size"])
    # cpu backend: the experts once, the rest (attention, embeddings, head) in every rank
    assert two.weights - experts == 2 * (one.weights - experts) > 0


def test_a_hugging_face_tokenizer_is_sized_by_its_vocabulary():
    path_model = SimpleNamespace(model=SimpleNamespace(path="/m", tokenizer=None))
    preset = SimpleNamespace(model=SimpleNamespace(path=None, tokenizer=None))
    assert memory.tokenizer_bytes(path_model, 151_936) == 151_936 * memory.TOKENIZER_BYTES_PER_TOKEN
    assert memory.tokenizer_bytes(preset, 151_936) == 0  # byte-level: in RUNTIME_BYTES


def test_the_load_transient_is_one_expert_tensor_and_a_copy_per_sharing_worker():
    """Qwen3-30B-A3B widths: one layer's ``gate_up_proj`` (E × 2I × H, host dtype) for the copy
    into huge pages (measured: an int8 run peaked 384 MiB above its other terms); with 2 ranks
    sharing the experts, one more copy of them (each other rank builds its own first)."""
    cfg = memory.text_config(memory.preset_config("qwen3-30b-a3b"), 2)
    one = memory.estimate(_spec("model.preset=qwen3-30b-a3b", "model.layers=2"), cfg, 0, "int8")
    assert one.transient == 128 * 2 * 768 * 2048 == 384 * memory.MiB
    two = memory.estimate(
        _spec("model.preset=qwen3-30b-a3b", "model.layers=2", "distributed.ranksPerWorker=2"),
        cfg,
        0,
        "int8",
    )
    assert two.transient == one.transient + memory._expert_weight_bytes("int8", 2, 128, 2048, 768)


def test_kept_graphs_fit_the_limit_with_the_runtime_counted_once():
    spec = _spec()
    cfg = memory.text_config(memory.preset_config("tiny-qwen3-moe"))
    full = memory.estimate(spec, cfg, kept_layers=2)
    assert memory.kept_graph_layers(spec, cfg, int(full.total * memory.HEADROOM)) == 2
    assert memory.kept_graph_layers(spec, cfg, int(full.runtime * memory.HEADROOM)) == 0


@pytest.mark.slow
def test_tiny_chat_4k_peak_rss_is_within_15_percent_of_its_estimate(tmp_path):
    """The issue-40 criterion, in a fresh process: examples/tiny-chat-4k.yaml (S=4,096, packed
    chat rows, cpu backend), 2 of its 6 steps; summary.json ``memory``: the estimate the run
    computed and its peak RSS (getrusage)."""
    out = tmp_path / "run"
    r = run_cli(
        "run", str(TINY_4K), "--out", str(out), "--steps", "2", "-q", "--no-plot", timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    mem, facts = summary["memory"], summary["machine"]
    ratio = mem["peak_rss_bytes"] / mem["estimate_bytes"]
    # on a failure: which part grew (the load's peak against the steps') and on which CPU
    why = {
        "ratio": round(ratio, 4),
        "peak_MiB": mem["peak_rss_bytes"] >> 20,
        "start_peak_MiB": mem["start_peak_rss_bytes"] >> 20,
        "terms_MiB": {k: v >> 20 for k, v in mem["terms"].items()},
        "cpu": facts.get("cpu_model"),
        "isa": facts.get("cpu_capabilities", {}).get("isa"),
        "host": facts.get("host"),
        "torch_threads": facts.get("torch_threads"),
    }
    assert 0.85 <= ratio <= 1.15, why
    assert mem["start_peak_rss_bytes"] <= mem["peak_rss_bytes"], why
    assert mem["auto_limit_bytes"] >= mem["peak_rss_bytes"], why
