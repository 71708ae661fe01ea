"""Row formats: one row (a dict, from a JSONL line or a ``datasets`` row) → one :class:`Example`.

Shared by the JSONL reader and the Hugging Face ``datasets`` reader (:mod:`npu_lora.data.hf`),
so a bad row gets the same message from either: ``spec.data.path: FILE:LINE: FIELD: problem``
(for ``datasets`` files ``FILE:row N``, N the 0-based row index).

Formats (``spec.data.format``):

- ``jsonl``: ``{"text": str}`` (loss on every token) or ``{"prompt": str, "completion": str}``
  (loss on the completion);
- ``chat``: ``{"messages": [{"role": ..., "content": ...}, ...]}`` or the sharegpt spelling
  ``{"conversations": [{"from": ..., "value": ...}, ...]}`` (``human`` → user, ``gpt`` →
  assistant); converted with TRL's ``maybe_convert_to_chatml``;
- ``alpaca``: ``{"instruction": str, "input": str (optional), "output": str}``;
- ``nsmc`` (columns of a ``datasets`` file): ``document`` and ``label`` (0/1).

Standard library only at import (TRL is imported inside :func:`chat_row`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from npu_lora.data.base import DataError, Example, _echo, _echo_keys

RowFormat = Literal["nsmc", "jsonl", "chat", "alpaca"]

ROLES = ("system", "user", "assistant", "tool")
#: sharegpt role names → chat roles (``from`` values as written by ShareGPT / LLaMA-Factory).
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "observation": "tool",
}

#: Alpaca prompt layout for tokenizers without a chat template of their own (the byte-level
#: preset tokenizer). ``{input_block}`` is ``"### Input:\n{input}\n\n"``, or empty without input.
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"


def _has(row: dict[str, Any], key: str) -> bool:
    """``key`` is set (a column of a ``datasets`` file is None in rows that lack it)."""
    return row.get(key) is not None


def detect_row_format(row: dict[str, Any]) -> RowFormat:
    """``format: auto`` for row data: by the first row's fields."""
    if _has(row, "messages") or _has(row, "conversations"):
        return "chat"
    if _has(row, "instruction") and _has(row, "output"):
        return "alpaca"
    if _has(row, "document") and _has(row, "label"):
        return "nsmc"
    return "jsonl"


def row_to_example(row: Any, fmt: RowFormat, where: str) -> Example:
    """Validate ``row`` for ``fmt`` and make its :class:`Example` (raises :class:`DataError`)."""
    if not isinstance(row, dict):
        raise DataError(f"spec.data.path: {where}: expected a JSON object")
    if fmt == "chat":
        return chat_row(row, where)
    if fmt == "alpaca":
        return alpaca_row(row, where)
    if fmt == "nsmc":
        return nsmc_row(row, where)
    return jsonl_row(row, where)


def jsonl_row(obj: dict[str, Any], where: str) -> Example:
    if _has(obj, "prompt") or _has(obj, "completion"):
        p, c = obj.get("prompt"), obj.get("completion")
        if not isinstance(p, str) or not isinstance(c, str) or not c:
            raise DataError(
                f"spec.data.path: {where}: 'prompt' and 'completion' must both be "
                "strings (completion non-empty)"
            )
        return Example("prompt", p, completion=c, source=where)
    if _has(obj, "text"):
        t = obj["text"]
        if not isinstance(t, str) or not t:
            raise DataError(f"spec.data.path: {where}: 'text' must be a non-empty string")
        return Example("text", t, source=where)
    raise DataError(
        f"spec.data.path: {where}: expected a 'text' field or 'prompt' + "
        f"'completion' fields, got keys {_echo_keys(obj)}"
    )


def nsmc_row(obj: dict[str, Any], where: str) -> Example:
    doc, label = obj.get("document"), obj.get("label")
    if not isinstance(doc, str):
        raise DataError(f"spec.data.path: {where}: document: must be a string")
    if isinstance(label, str) and label.strip() in ("0", "1"):
        label = int(label.strip())
    if label not in (0, 1) or isinstance(label, bool):
        shown = _echo(label) if isinstance(label, str) else repr(label)[:16]
        raise DataError(f"spec.data.path: {where}: label: must be 0 or 1 (got {shown})")
    return Example("classify", doc, label=int(label), source=where)


def _text_field(obj: dict[str, Any], key: str, where: str, *, required: bool) -> str:
    v = obj.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and not v.strip()):
        what = "a non-empty string" if required else "a string"
        if key not in obj:
            got = "missing"
        elif isinstance(v, str):
            got = "got an empty string"
        else:
            got = f"got {type(v).__name__}"
        raise DataError(f"spec.data.path: {where}: {key}: must be {what} ({got})")
    return v


def alpaca_row(obj: dict[str, Any], where: str) -> Example:
    instruction = _text_field(obj, "instruction", where, required=True)
    inp = _text_field(obj, "input", where, required=False)
    output = _text_field(obj, "output", where, required=True)
    input_block = f"### Input:\n{inp}\n\n" if inp.strip() else ""
    prompt = ALPACA_PROMPT.format(instruction=instruction, input_block=input_block)
    user = f"{instruction}\n\n{inp}" if inp.strip() else instruction
    messages = ({"role": "user", "content": user}, {"role": "assistant", "content": output})
    return Example("alpaca", prompt, completion=output, messages=messages, source=where)


def chat_row(obj: dict[str, Any], where: str) -> Example:
    """Validate a ``messages`` / ``conversations`` row in the spelling the file uses (errors name
    that spelling's fields), then convert with TRL's ``maybe_convert_to_chatml``."""
    sharegpt = not _has(obj, "messages") and _has(obj, "conversations")
    key, role_key, content_key = (
        ("conversations", "from", "value") if sharegpt else ("messages", "role", "content")
    )
    msgs = obj.get(key)
    if isinstance(msgs, str):  # a CSV column holding JSON
        try:
            msgs = json.loads(msgs)
        except json.JSONDecodeError as e:
            raise DataError(f"spec.data.path: {where}: {key}: not valid JSON: {e.msg}") from None
    if msgs is None:
        raise DataError(
            f"spec.data.path: {where}: expected a 'messages' (or 'conversations') list, "
            f"got keys {_echo_keys(obj)}"
        )
    if not isinstance(msgs, list) or not msgs:
        raise DataError(f"spec.data.path: {where}: {key}: must be a non-empty list of messages")
    allowed = SHAREGPT_ROLES if sharegpt else {r: r for r in ROLES}
    out: list[dict[str, str]] = []
    for i, m in enumerate(msgs):
        field = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise DataError(f"spec.data.path: {where}: {field}: must be an object")
        role = m.get(role_key)
        if role not in allowed:
            if isinstance(role, str):
                got = _echo(role)
            else:
                got = "missing" if role is None else type(role).__name__
            raise DataError(
                f"spec.data.path: {where}: {field}.{role_key}: must be one of "
                f"{', '.join(allowed)} (got {got})"
            )
        content = m.get(content_key)
        if not isinstance(content, str):
            got = "missing" if content_key not in m else type(content).__name__
            raise DataError(
                f"spec.data.path: {where}: {field}.{content_key}: must be a string (got {got})"
            )
        out.append({role_key: role, content_key: content})
    from trl.data_utils import maybe_convert_to_chatml

    converted = maybe_convert_to_chatml({key: out})["messages"]
    messages = tuple(
        {"role": SHAREGPT_ROLES[m["role"]], "content": m["content"]} for m in converted
    )
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise DataError(
            f"spec.data.path: {where}: {key}: needs at least one non-empty assistant message "
            "(the loss is taken on assistant turns only)"
        )
    return Example("chat", "", messages=messages, source=where)
