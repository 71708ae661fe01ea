"""The bench's configuration and inputs: ``BenchConfig``, the engine's spec, the fixed batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

DEFAULT_VARIANTS = ("host-only", "host-only+keep_graph", "hot", "hot+keep_graph")
DEFAULT_PEERS = ("peer@grouped_mm", "peer@eager")


@dataclass
class BenchConfig:
    preset: str | None = "tiny-qwen3-moe"
    config: str | None = None  # a MoEFinetune manifest / bare spec (overrides preset)
    layers: int | None = None
    seq_len: int = 128
    batch: int = 1
    hot_fraction: float = 0.25
    hot_warmup_steps: int = 2  # host-only steps counting routing before the hot set is chosen
    warmup: int = 1  # unmeasured steps per variant
    steps_per_round: int = 1
    rounds: int = 6
    host_dtype: str = "float32"
    backend: str = "cpu"
    threads: int | None = None
    experts_impl: str = "grouped_mm"
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    baseline: str | None = None  # default: the first variant
    peers: bool = True
    peer_impls: list[str] = field(default_factory=lambda: ["grouped_mm", "eager"])
    limits: bool = True
    memory: bool = True
    layer_probe: bool = True  # one layer's host MoE in the engine vs the kernel alone (host_layer)
    answer_tokens: int = 8  # label positions per sequence (at its end)
    peak_rss: bool = False  # each host-only/peer variant's peak RSS in a process of its own
    seed: int = 0
    out: str = "bench-out"
    title: str | None = None


# ----------------------------------------------------------------------------- engine set-up


def build_spec(cfg: BenchConfig, *, placement: str) -> Any:
    """The ``MoEFinetuneSpec`` the engine is built from (manifest or preset + bench overrides)."""
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec

    if cfg.config:
        from npu_lora.api.load import load_manifest

        base = load_manifest(cfg.config).spec.model_dump(
            by_alias=True, exclude_none=True, mode="json"
        )
    else:
        base = {
            "model": {"preset": cfg.preset or "tiny-qwen3-moe"},
            "data": {"path": "example:bench"},
        }
    if cfg.layers is not None:
        base["model"]["layers"] = cfg.layers
    base.setdefault("moe", {}).update(
        placement=placement,
        keepGraph=True,
        hotFraction=cfg.hot_fraction,
        warmupSteps=cfg.hot_warmup_steps,
        hostDtype=cfg.host_dtype,
    )
    if cfg.threads:
        base["moe"]["hostThreads"] = cfg.threads
    base.setdefault("training", {}).update(seqLen=cfg.seq_len, batchSize=cfg.batch, seed=cfg.seed)
    base.setdefault("device", {})["backend"] = cfg.backend
    return MoEFinetuneSpec.model_validate(base)


def make_batches(
    n: int, *, batch: int, seq_len: int, vocab: int, answer_tokens: int, seed: int
) -> list[dict]:
    """``n`` fixed random batches; labels (= ids) on the last ``answer_tokens`` positions."""
    g = torch.Generator().manual_seed(seed)
    out = []
    a = max(1, min(answer_tokens, seq_len - 1))
    for _ in range(n):
        ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, -a:] = ids[:, -a:]
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out
