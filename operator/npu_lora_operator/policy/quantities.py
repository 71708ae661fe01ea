"""Kubernetes memory quantities (``16Gi``, ``500M``) as bytes, and bytes as whole GiB."""

from __future__ import annotations

import math
import re

GiB = 1 << 30
#: the quantity forms the policy accepts (a plain number of bytes, or with a binary/decimal suffix)
QUANTITY_RE = re.compile(r"[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?")
_SUFFIX = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def quantity_bytes(text: str) -> int | None:
    """A memory quantity (``16Gi``, ``500M``, ``1073741824``) in bytes, None if not one."""
    s = str(text).strip()
    suffix = next((x for x in sorted(_SUFFIX, key=len, reverse=True) if s.endswith(x)), "")
    num, mult = (s[: -len(suffix)], _SUFFIX[suffix]) if suffix else (s, 1)
    try:
        value = float(num)
    except ValueError:
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return int(value * mult)


def gib(n_bytes: int) -> str:
    return f"{max(1, math.ceil(n_bytes / GiB))}Gi"
