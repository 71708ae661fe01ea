"""Chat rows → token ids and assistant-only labels, with the tokenizer's own chat template.

Reused, not rewritten:

- ``trl.chat_template_utils.get_training_chat_template(tok)``: the tokenizer's template patched
  with ``{% generation %}`` markers around assistant turns (TRL ships the patched Qwen3 family,
  Llama, Gemma, DeepSeek, ... templates; ``None`` when the template already has the markers);
- ``tok.apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)``
  (transformers): renders and tokenises, and marks the tokens inside the generation blocks.

Written here: the fallback template for a tokenizer without one (:data:`CHATML_TEMPLATE`, the
offline byte-level tokenizer of the presets), and trimming each assistant span after its
end-of-turn token (the Qwen3 template's generation block also holds the ``"\\n"`` after
``<|im_end|>``, which generation never produces: it stops at ``<|im_end|>``).
"""

from __future__ import annotations

from typing import Any

from npu_lora.data.base import DataError

IGNORE_INDEX = -100

#: ChatML with generation markers: the fallback for a tokenizer that has no chat template.
#: Loss on ``content<|im_end|>`` of each assistant turn.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def has_native_template(tok: Any) -> bool:
    """The tokenizer brings a chat template of its own (else :data:`CHATML_TEMPLATE` is used)."""
    return bool(getattr(tok, "chat_template", None))


def training_chat_template(tok: Any) -> str:
    """The template to render training rows with: with generation markers (see module doc)."""
    native = getattr(tok, "chat_template", None)
    if not native:
        return CHATML_TEMPLATE
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if isinstance(native, dict):
        native = native.get("default") or next(iter(native.values()))
    try:
        patched = get_training_chat_template(tok)
    except ValueError:
        if has_generation_markers(native):  # not prefix-preserving, but masks still work
            return native
        raise DataError(
            "spec.data.format: the tokenizer's chat template has no {% generation %} markers "
            "and TRL has no training version of it, so assistant tokens cannot be found; add "
            "the markers to chat_template in tokenizer_config.json (see docs/data.md)"
        ) from None
    return patched if patched is not None else native


def _end_ids(tok: Any) -> set[int]:
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    im_end = (
        tok.convert_tokens_to_ids("<|im_end|>") if hasattr(tok, "convert_tokens_to_ids") else None
    )
    if isinstance(im_end, int) and im_end != getattr(tok, "unk_token_id", None):
        ids.add(im_end)
    return ids


def encode_chat(
    messages: list[dict[str, str]] | tuple[dict[str, str], ...], tok: Any, template: str
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one conversation, unpadded and untruncated; labels are the
    ids inside assistant generation blocks (up to and including the end-of-turn token), -100
    elsewhere."""
    out = tok.apply_chat_template(
        list(messages),
        chat_template=template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids = list(out["input_ids"])
    mask = list(out["assistant_masks"])
    if not any(mask):
        raise DataError(
            "spec.data.format: the chat template marked no assistant token (its "
            "{% generation %} blocks are empty); see docs/data.md"
        )
    ends = _end_ids(tok)
    # trim each assistant span after its last end-of-turn token
    i, n = 0, len(ids)
    while i < n:
        if not mask[i]:
            i += 1
            continue
        j = i
        while j < n and mask[j]:
            j += 1
        last_end = max((k for k in range(i, j) if ids[k] in ends), default=None)
        if last_end is not None:
            for k in range(last_end + 1, j):
                mask[k] = 0
        i = j
    labels = [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]
    return ids, labels
