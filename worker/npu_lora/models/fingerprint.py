"""A fingerprint of the base weights: which base model an adapter was trained on.

A run records it (``adapter/npu_lora_base.json``, ``summary.json`` ``base_fingerprint``) right
after building its model, before any adapter or checkpoint is loaded; ``npu-lora predict``,
``chat`` and ``export`` rebuild the base the same way and refuse to go on when the digest differs
(a preset rebuilt from another seed or torch version, a model directory whose files changed).

The digest is sampled, not a hash of every byte (a 30B model would take minutes): for every
base tensor in name order, its name, shape, dtype and up to ``SAMPLES`` elements at a fixed
stride (as float32) go into SHA-256. Any re-initialisation, another checkpoint or a shape change
alters it; an edit of single untouched elements might not.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

ALGORITHM = "sha256-strided-4096-v1"
SAMPLES = 4096
FILE = "npu_lora_base.json"


def base_name(name: str) -> str:
    """A parameter's name in the plain model: without peft's ``base_model.model.`` prefix and
    ``.base_layer`` infix."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def base_fingerprint(model: nn.Module) -> dict[str, Any]:
    """``{"algorithm", "digest", "tensors", "parameters"}`` of the base (non-LoRA) weights."""
    h = hashlib.sha256()
    named: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            continue
        named.setdefault(base_name(name), p)
    total = 0
    with torch.no_grad():
        for name in sorted(named):
            t = named[name]
            flat = t.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLES)
            sample = flat[::step][:SAMPLES].to("cpu", torch.float32).contiguous()
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
            h.update(sample.numpy().tobytes())
            total += t.numel()
    return {
        "algorithm": ALGORITHM,
        "digest": h.hexdigest(),
        "tensors": len(named),
        "parameters": total,
    }
