"""Benchmark records for the bench tests."""

from __future__ import annotations

from typing import Any


def step(variant: str, rnd: int, step_s: float = 1.0, **kw: Any) -> dict[str, Any]:
    """One ``kind: step`` record of ``variant`` in round ``rnd``."""
    return {"kind": "step", "variant": variant, "round": rnd, "step_s": step_s, **kw}
