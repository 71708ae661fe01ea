"""Generation with the KV cache: transformers ``generate`` on the run's peft model.

The model is the engine's: its decoder layers' MoE blocks are the engine's ``HostMLP`` (experts on
the host), attention, norms, embeddings, head and LoRA are the modules the engine put on the
device. ``generate`` runs the Hugging Face layer code around them with a ``DynamicCache``, so
each new token costs one position, not the whole prefix.
"""

from __future__ import annotations

from typing import Any

import torch


def end_ids(tok: Any) -> list[int]:
    """Token ids that end a reply: eos, and ``<|im_end|>`` when it is one token of the vocabulary
    (a Qwen tokenizer whose eos is ``<|endoftext|>`` still ends a chat turn there)."""
    ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    unk = getattr(tok, "unk_token_id", None)
    if isinstance(im_end, int) and im_end >= 0 and im_end != unk and im_end not in ids:
        ids.append(im_end)
    return ids


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
        "eos_token_id": end_ids(tok),
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
