"""The container's termination message (Kubernetes ``terminationMessagePath``).

Written at the end of a run: the final summary JSON on success, the error on failure. Kubernetes
keeps at most 4096 bytes; longer text is cut to that (a summary is shrunk to its key fields first).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MAX_BYTES = 4096
DEFAULT_PATH = "/dev/termination-log"
ENV = "NPU_LORA_TERMINATION_LOG"

#: Summary keys kept when the full summary does not fit.
_KEY_FIELDS = (
    "status",
    "name",
    "steps",
    "first_loss",
    "final_loss",
    "median",
    "tokens_per_s",
    "hot",
    "wall_s",
    "exit_code",
    "error",
)


def termination_path() -> Path | None:
    """``$NPU_LORA_TERMINATION_LOG``, else ``/dev/termination-log`` if it exists and is writable."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    p = Path(DEFAULT_PATH)
    if p.exists() and os.access(p, os.W_OK):
        return p
    return None


def _truncate(text: str, limit: int = MAX_BYTES) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", errors="ignore") + "..."


def summary_message(summary: dict[str, Any]) -> str:
    """Compact JSON of the summary, reduced to the key fields if it is over 4096 bytes."""
    text = json.dumps(summary, separators=(",", ":"), ensure_ascii=False, default=str)
    if len(text.encode("utf-8")) <= MAX_BYTES:
        return text
    small = {k: summary[k] for k in _KEY_FIELDS if k in summary}
    return _truncate(json.dumps(small, separators=(",", ":"), ensure_ascii=False, default=str))


def write_termination_message(text: str | dict[str, Any]) -> Path | None:
    """Write the message (≤ 4096 bytes); returns the path written, or None. Never raises."""
    path = termination_path()
    if path is None:
        return None
    msg = summary_message(text) if isinstance(text, dict) else _truncate(text)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(msg)
    except OSError:
        return None
    return path
