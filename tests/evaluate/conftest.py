"""Fixtures of the evaluation tests (tiny model, CPU backend; as tests/engine)."""

from __future__ import annotations

import warnings

import pytest
import torch
from npu_lora.api.v1alpha1 import MoEFinetuneSpec

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")


def make_spec(**over) -> MoEFinetuneSpec:
    doc = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:jsonl-mini"},
        # pinned: these tests compare against fp32 stock blocks (the defaults are auto/stream)
        "moe": {
            "placement": "host-only",
            "keepGraph": True,
            "hostDtype": "float32",
            "expertsKernel": "grouped_mm",
        },
        "training": {"seqLen": 32, "batchSize": 2, "steps": 10},
        "device": {"backend": "cpu"},
    }
    for key, val in over.items():
        doc.setdefault(key, {}).update(val)
    return MoEFinetuneSpec.model_validate(doc)


def make_batch(B: int = 2, S: int = 32, vocab: int = 512, seed: int = 0, answer: int = 10) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, S), generator=g)
    labels = torch.full_like(ids, -100)
    am = torch.ones_like(ids)
    for b in range(B):
        pad = 3 * b  # right padding on the later rows
        end = S - pad
        labels[b, end - answer : end] = ids[b, end - answer : end]
        am[b, end:] = 0
    return {"input_ids": ids, "attention_mask": am, "labels": labels}


def randomize_lora(model: torch.nn.Module, seed: int = 1) -> None:
    """Non-zero LoRA B (peft initialises it to 0) so adapter gradients are non-trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


@pytest.fixture
def deterministic():
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(prev)


@pytest.fixture
def tiny():
    """Helpers: ``tiny.spec(**overrides)``, ``tiny.batch(...)``, ``tiny.randomize_lora(model)``."""

    class _T:
        spec = staticmethod(make_spec)
        batch = staticmethod(make_batch)
        randomize_lora = staticmethod(randomize_lora)

    return _T
