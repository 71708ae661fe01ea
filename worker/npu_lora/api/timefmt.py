"""RFC 3339 timestamps in UTC: the one formatter for status fields, records and files."""

from __future__ import annotations

import time


def rfc3339(t: float | None = None, *, millis: bool = False) -> str:
    """``2026-12-03T21:30:00Z`` for ``t`` (seconds since the epoch; now when None);
    ``millis`` adds ``.mmm`` (step and eval records)."""
    t = time.time() if t is None else t
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return base + (f".{int(t % 1 * 1000):03d}Z" if millis else "Z")
