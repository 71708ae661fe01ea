"""Patch algorithms of the Kubernetes API: JSON merge patch, JSON patch, strategic merge patch.

- :func:`merge_patch`: RFC 7386 (``null`` deletes, lists replace).
- :func:`json_patch`: RFC 6902 (``add``/``remove``/``replace``/``move``/``copy``/``test``).
- :func:`strategic_merge_patch`: the built-in types' patch: like a merge patch, but lists with a
  known merge key (containers by ``name``, volumeMounts by ``mountPath``, conditions by ``type``,
  ...) merge item by item, ``finalizers`` merge as a set, and the ``$patch``,
  ``$setElementOrder/``, ``$deleteFromPrimitiveList/`` and ``$retainKeys`` directives are honoured
  (order directives are accepted and ignored).
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["PatchError", "json_patch", "merge_patch", "strategic_merge_patch"]


class PatchError(ValueError):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for tok in tokens[:-1]:
        if isinstance(node, dict):
            if tok not in node:
                raise PatchError(f"path component {tok!r} not found")
            node = node[tok]
        elif isinstance(node, list):
            try:
                node = node[int(tok)]
            except (ValueError, IndexError) as exc:
                raise PatchError(f"bad list index {tok!r}") from exc
        else:
            raise PatchError(f"cannot descend into {tok!r}")
    return node


def _get(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for tok in tokens:
        if isinstance(node, dict) and tok in node:
            node = node[tok]
        elif isinstance(node, list) and tok.isdigit() and int(tok) < len(node):
            node = node[int(tok)]
        else:
            raise PatchError(f"path /{'/'.join(tokens)} not found")
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            idx = int(last)
            if idx > len(parent):
                raise PatchError("index out of range")
            parent.insert(idx, value)
    else:
        raise PatchError("cannot add here")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path /{'/'.join(tokens)} not found")
        return parent.pop(last)
    if isinstance(parent, list):
        try:
            return parent.pop(int(last))
        except (ValueError, IndexError) as exc:
            raise PatchError("index out of range") from exc
    raise PatchError("cannot remove here")


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        kind = op.get("op")
        tokens = _pointer(op.get("path", ""))
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            if not tokens:
                doc = copy.deepcopy(op.get("value"))
                continue
            _get(doc, tokens)
            parent = _parent(doc, tokens)
            if isinstance(parent, list):
                parent[int(tokens[-1])] = copy.deepcopy(op.get("value"))
            else:
                parent[tokens[-1]] = copy.deepcopy(op.get("value"))
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = _remove(doc, src) if kind == "move" else copy.deepcopy(_get(doc, src))
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _get(doc, tokens) != op.get("value"):
                raise PatchError(f"test failed at {op.get('path')}")
        else:
            raise PatchError(f"unknown JSON patch op {kind!r}")
    return doc


MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
PRIMITIVE_SET_LISTS = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in (value or [])]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, MERGE_KEYS[key])
        elif (
            isinstance(value, list)
            and key in PRIMITIVE_SET_LISTS
            and isinstance(result.get(key), list)
        ):
            merged_list = list(result[key])
            for item in value:
                if item not in merged_list:
                    merged_list.append(item)
            result[key] = merged_list
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = [
                {k: v for k, v in item.items() if k != "$patch"} if isinstance(item, dict) else item
                for item in value
                if not (isinstance(item, dict) and item.get("$patch") == "delete")
            ]
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    result = copy.deepcopy(current)
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            copy.deepcopy(i)
            for i in patch
            if not (isinstance(i, dict) and i.get("$patch") == "replace")
        ]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            result.append(copy.deepcopy(item))
            continue
        idx = next(
            (
                i
                for i, cur in enumerate(result)
                if isinstance(cur, dict) and cur.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                result.pop(idx)
            continue
        if idx is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[idx] = strategic_merge_patch(result[idx], item)
    return result
