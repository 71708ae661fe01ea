"""The one place that bounds what the operator writes to ``status.message``, conditions and
Events.

Rules: a message names fields and allowed forms; a value the user wrote is quoted only through
:func:`quote` (cut short, control characters escaped); a value that may come from a Secret or
an environment variable is never quoted at all. Every message written to the API goes through
:func:`bounded` (:data:`MAX_MESSAGE` characters), so a huge input (a 600 KB image name, a worker
that prints its environment) can neither make a status patch fail (413) nor flood Events.
"""

from __future__ import annotations

from typing import Any

#: Longest message written to status or an Event (characters). The API allows ~1 KiB in an
#: Event's note before it is truncated; a condition's message may be 32 KiB.
MAX_MESSAGE = 1024
#: Longest user value quoted in a message (characters, before escaping).
MAX_QUOTE = 64
ELLIPSIS = "…"


def bounded(text: Any, limit: int = MAX_MESSAGE, *, keep: str = "head") -> str:
    """``text`` as a str of at most ``limit`` characters: the head (default) or the tail
    (``keep="tail"``: a traceback's last line matters most) and an ellipsis where cut."""
    s = str(text if text is not None else "")
    if len(s) <= limit:
        return s
    if keep == "tail":
        return ELLIPSIS + s[-(limit - 1) :]
    return s[: limit - 1] + ELLIPSIS


def quote(value: Any, limit: int = MAX_QUOTE) -> str:
    """A user-written value (an image, a path, a name) for a message: double-quoted, control
    characters and quotes escaped, at most ``limit`` characters of it, with its length when
    cut."""
    s = str(value)
    cut = len(s) > limit
    body = s[:limit].encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{body}…" ({len(s)} characters)' if cut else f'"{body}"'
