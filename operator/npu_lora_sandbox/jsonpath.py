"""A small Kubernetes-flavoured JSONPath evaluator (printer columns, field selectors).

Supports ``{...}`` wrappers, ``.field`` (``\\.`` escapes a dot inside a key), ``['key']``,
``[0]``/``[-1]``, slices ``[a:b]``, ``[*]``, ``..field`` (recursive descent) and filters
``[?(@.a.b == "x")]`` with ``== != < <= > >=`` or bare existence ``[?(@.a)]``.
:func:`find` returns every match (an empty list when nothing matches: missing keys are allowed).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["find", "parse"]

_FILTER = re.compile(
    r"^\?\((?P<lhs>@[^=!<>]*?)\s*(?:(?P<op>==|!=|<=|>=|<|>)\s*(?P<rhs>.+?))?\s*\)$"
)

Step = tuple[str, Any]


def parse(expr: str) -> list[Step]:
    expr = expr.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1].strip()
    if expr.startswith("$"):
        expr = expr[1:]
    steps: list[Step] = []
    i = 0
    n = len(expr)
    while i < n:
        c = expr[i]
        if c == ".":
            if i + 1 < n and expr[i + 1] == ".":
                steps.append(("recurse", None))
                i += 2
                continue
            i += 1
            key = []
            while i < n and expr[i] not in ".[":
                if expr[i] == "\\" and i + 1 < n:
                    key.append(expr[i + 1])
                    i += 2
                    continue
                key.append(expr[i])
                i += 1
            name = "".join(key)
            if name == "*":
                steps.append(("wild", None))
            elif name:
                steps.append(("field", name))
        elif c == "[":
            depth = 0
            j = i
            quote = ""
            while j < n:
                ch = expr[j]
                if quote:
                    if ch == quote:
                        quote = ""
                elif ch in "'\"":
                    quote = ch
                elif ch == "[":
                    depth += 1
                elif ch == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            inner = expr[i + 1 : j].strip()
            i = j + 1
            steps.append(_bracket(inner))
        else:
            # A bare leading field name ("status.phase").
            j = i
            while j < n and expr[j] not in ".[":
                j += 1
            steps.append(("field", expr[i:j]))
            i = j
    return steps


def _bracket(inner: str) -> Step:
    if inner == "*":
        return ("wild", None)
    if inner.startswith("?"):
        m = _FILTER.match(inner)
        if not m:
            raise ValueError(f"unsupported JSONPath filter: [{inner}]")
        lhs = parse(m.group("lhs")[1:])
        rhs = m.group("rhs")
        rhs_val: Any = None
        if rhs is not None:
            rhs = rhs.strip()
            if rhs[:1] in "'\"":
                rhs_val = rhs[1:-1]
            else:
                try:
                    rhs_val = json.loads(rhs)
                except ValueError:
                    rhs_val = rhs
        return ("filter", (lhs, m.group("op"), rhs_val))
    if inner[:1] in "'\"":
        return ("field", inner[1:-1])
    if ":" in inner:
        parts = [p.strip() for p in inner.split(":")]
        start = int(parts[0]) if parts[0] else None
        end = int(parts[1]) if len(parts) > 1 and parts[1] else None
        step = int(parts[2]) if len(parts) > 2 and parts[2] else None
        return ("slice", (start, end, step))
    if "," in inner:
        return ("union", [p.strip().strip("'\"") for p in inner.split(",")])
    return ("index", int(inner))


def _compare(left: Any, op: str | None, right: Any) -> bool:
    if op is None:
        return True
    try:
        if op == "==":
            return bool(left == right or str(left) == str(right))
        if op == "!=":
            return bool(left != right and str(left) != str(right))
        if isinstance(left, str) != isinstance(right, str):
            left, right = float(left), float(right)
        if op == "<":
            return bool(left < right)
        if op == "<=":
            return bool(left <= right)
        if op == ">":
            return bool(left > right)
        if op == ">=":
            return bool(left >= right)
    except (TypeError, ValueError):
        return False
    return False


def _apply(steps: list[Step], nodes: list[Any]) -> list[Any]:
    for kind, arg in steps:
        out: list[Any] = []
        for node in nodes:
            if kind == "field":
                if isinstance(node, dict) and arg in node:
                    out.append(node[arg])
            elif kind == "wild":
                if isinstance(node, dict):
                    out.extend(node.values())
                elif isinstance(node, list):
                    out.extend(node)
            elif kind == "index":
                if isinstance(node, list) and -len(node) <= arg < len(node):
                    out.append(node[arg])
            elif kind == "slice":
                if isinstance(node, list):
                    out.extend(node[slice(*arg)])
            elif kind == "union":
                for key in arg:
                    if isinstance(node, dict) and key in node:
                        out.append(node[key])
                    elif isinstance(node, list) and key.lstrip("-").isdigit():
                        idx = int(key)
                        if -len(node) <= idx < len(node):
                            out.append(node[idx])
            elif kind == "filter":
                lhs, op, rhs = arg
                items = (
                    node
                    if isinstance(node, list)
                    else list(node.values())
                    if isinstance(node, dict)
                    else []
                )
                for item in items:
                    vals = _apply(lhs, [item])
                    if vals and _compare(vals[0], op, rhs):
                        out.append(item)
            elif kind == "recurse":
                out.extend(_descend(node))
        nodes = out
    return nodes


def _descend(node: Any) -> list[Any]:
    out = [node]
    if isinstance(node, dict):
        for v in node.values():
            out.extend(_descend(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_descend(v))
    return out


_cache: dict[str, list[Step]] = {}


def find(obj: Any, expr: str) -> list[Any]:
    """All values at ``expr`` in ``obj`` (``[]`` when absent)."""
    steps = _cache.get(expr)
    if steps is None:
        steps = parse(expr)
        _cache[expr] = steps
    return _apply(steps, [obj])
