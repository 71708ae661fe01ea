"""Generation with the KV cache: transformers ``generate`` on the run's peft model.

The model is the engine's: its decoder layers' MoE blocks are the engine's ``HostMLP`` (experts on
the host), attention, norms, embeddings, head and LoRA are the modules the engine put on the
device. ``generate`` runs the Hugging Face layer code around them with a ``DynamicCache``, so
each new token costs one position, not the whole prefix.
"""

from __future__ import annotations

from typing import Any

import torch


def generate(
    run: Any,
    input_ids: list[int],
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    streamer: Any = None,
    stop_strings: list[str] | None = None,
) -> list[int]:
    """The new token ids after ``input_ids`` (greedy when ``temperature == 0``)."""
    tok = run.tokenizer
    model = run.model
    device = run.engine.backend.device
    ids = torch.tensor([input_ids], dtype=torch.long, device=device)
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "use_cache": True,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "streamer": streamer,
    }
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=None)
        if seed is not None:
            torch.manual_seed(seed)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if stop_strings:
        kwargs.update(stop_strings=stop_strings, tokenizer=tok)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    return out[0, len(input_ids) :].tolist()
