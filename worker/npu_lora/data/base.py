"""What every data reader and row format shares: :class:`DataError`, :class:`Example`, the
file suffixes ``datasets`` reads, and how a value is echoed in an error. Its own module so
that :mod:`~npu_lora.data.readers` can dispatch to :mod:`~npu_lora.data.formats` and
:mod:`~npu_lora.data.hf` without those importing it back (no import cycle)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from npu_lora.api.load import SpecError

#: File suffixes read with Hugging Face ``datasets`` (a directory: ``load_from_disk``).
DATASETS_SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".json": "json"}


class DataError(SpecError):
    """Invalid data file or data settings (exit code 2, like any other spec error)."""


@dataclass(frozen=True)
class Example:
    """One training example.

    ``kind == "text"``: ``text`` is trained on in full. ``kind == "classify"``: ``text`` is the
    document, ``label`` the class (0/1), the template and answer words make the prompt.
    ``kind == "prompt"``: ``text`` is the prompt, ``completion`` the answer (loss on it only).
    ``kind == "chat"``: ``messages`` (``{"role", "content"}`` dicts), loss on assistant turns.
    ``kind == "alpaca"``: ``text`` is the alpaca prompt layout, ``completion`` the output, and
    ``messages`` the same as a user/assistant conversation (used when the tokenizer has a chat
    template of its own).
    """

    kind: Literal["text", "classify", "prompt", "chat", "alpaca"]
    text: str
    label: int | None = None
    completion: str | None = None
    source: str = ""  # "file:line", for error messages
    messages: tuple[dict[str, str], ...] | None = None


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _echo(value: str) -> str:
    """A field value in an error: only when short and plain (a label typo), never free text."""
    v = value.strip()
    return repr(v) if len(v) <= 8 and _WORD.fullmatch(v) else f"a value of {len(value)} characters"


def _echo_keys(obj: dict[str, object]) -> str:
    keys = sorted(k for k in obj if _WORD.fullmatch(k))[:8]
    more = len(obj) - len(keys)
    return repr(keys) + (f" and {more} more" if more else "")
