"""Specs for the compile-plan tests."""

from __future__ import annotations

from typing import Any

from npu_lora.api.v1alpha1 import MoEFinetuneSpec

QWEN_CONFIG = "/work/shared/data/qwen3-30b-a3b/config.json"


def spec_doc(**over: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:jsonl-mini"},
        "moe": {"placement": "hot"},
        "training": {"seqLen": 32, "batchSize": 1, "steps": 10},
        "device": {"backend": "cpu"},
    }
    for key, val in over.items():
        doc.setdefault(key, {}).update(val)
    return doc


def make_spec(**over: dict[str, Any]) -> MoEFinetuneSpec:
    return MoEFinetuneSpec.model_validate(spec_doc(**over))
