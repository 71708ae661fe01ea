"""Label and field selectors of list/watch requests."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .resources import ApiError

# SELF (_SET_REQ, _split_selector, parse_label_selector, _dotted, parse_field_selector, _truthy)


_SET_REQ = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(text: str | None) -> Callable[[dict[str, str]], bool]:
    if not text:
        return lambda labels: True
    reqs: list[Callable[[dict[str, str]], bool]] = []
    for part in _split_selector(text):
        part = part.strip()
        if "!=" in part:
            k, v = (s.strip() for s in part.split("!=", 1))
            reqs.append(lambda lb, k=k, v=v: lb.get(k) != v)
        elif "==" in part or ("=" in part and "(" not in part):
            k, v = (s.strip() for s in re.split(r"==?", part, maxsplit=1))
            reqs.append(lambda lb, k=k, v=v: lb.get(k) == v)
        else:
            m = _SET_REQ.match(part)
            if not m:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
            neg, k, op, vals = m.groups()
            values = {x.strip() for x in (vals or "").split(",") if x.strip()}
            if op == "in":
                reqs.append(lambda lb, k=k, vs=values: lb.get(k) in vs)
            elif op == "notin":
                reqs.append(lambda lb, k=k, vs=values: lb.get(k) not in vs)
            elif neg:
                reqs.append(lambda lb, k=k: k not in lb)
            else:
                reqs.append(lambda lb, k=k: k in lb)
    return lambda labels: all(r(labels) for r in reqs)


def _dotted(obj: Any, path: str) -> str:
    node = obj
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


def parse_field_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    if not text:
        return lambda obj: True
    reqs: list[Callable[[dict[str, Any]], bool]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(lambda o, k=k.strip(), v=v.strip(): _dotted(o, k) != v)
        else:
            k, v = re.split(r"==?", part, maxsplit=1)
            reqs.append(lambda o, k=k.strip(), v=v.strip(): _dotted(o, k) == v)
    return lambda obj: all(r(obj) for r in reqs)


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")
