"""Matching helpers every part of the policy uses: globs, path prefixes, DNS names, label
keys, unknown fields, relative sub-paths."""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

from npu_lora_operator.messages import bounded
from npu_lora_operator.policy.config import Violation

DNS1123_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
#: a label/taint key: an optional DNS-subdomain prefix and a name of at most 63 characters
LABEL_KEY_RE = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$"
)
#: a label value (also a toleration's value): empty or a name of at most 63 characters
LABEL_VALUE_RE = re.compile(rf"^({_NAME})?$")
#: node labels that place a pod on the control plane: never allowed unless listed exactly
CONTROL_PLANE_KEYS = (
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
    "node-role.kubernetes.io/etcd",
)


def matches(value: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def under(path: str, prefixes: Iterable[str]) -> bool:
    """``path`` (normalised, absolute) is a prefix's directory or below it."""
    if not path.startswith("/"):
        return False
    p = posixpath.normpath(path)
    for prefix in prefixes:
        q = posixpath.normpath(prefix)
        if q == "/" or p == q or p.startswith(q + "/"):
            return True
    return False


def label_value(value: Any) -> bool:
    return isinstance(value, str) and LABEL_VALUE_RE.match(value) is not None


def allowed_text(patterns: Iterable[str], what: str) -> str:
    items = list(patterns)
    return f"allowed: {', '.join(items)}" if items else f"no {what} is allowed"


def allowed_name(name: Any, patterns: Iterable[str]) -> bool:
    return isinstance(name, str) and DNS1123_RE.match(name) is not None and matches(name, patterns)


def key_allowed(key: Any, patterns: Iterable[str]) -> bool:
    """A label key against a glob allow-list; control-plane keys and the system prefixes only
    when listed exactly (a glob like ``*`` does not reach them)."""
    if not isinstance(key, str) or not key or len(key) > 317 or not LABEL_KEY_RE.match(key):
        return False
    if key in CONTROL_PLANE_KEYS or key.startswith("node-role.kubernetes.io/"):
        return key in patterns
    return matches(key, patterns)


def unknown_keys(item: Mapping[str, Any], known: set[str], where: str) -> list[Violation]:
    extra = sorted(str(k) for k in item if k not in known)
    if not extra:
        return []
    return [
        Violation(
            f"{where}.{bounded(extra[0], 64)}",
            f"unknown field (allowed: {', '.join(sorted(known))})",
        )
    ]


def check_sub_path(where: str, sub: Any) -> list[Violation]:
    if not isinstance(sub, str):
        return [Violation(where, "expected a relative path")]
    if sub.startswith("/") or "\\" in sub or "\x00" in sub:
        return [Violation(where, "must be a relative path (no leading '/')")]
    if ".." in sub.split("/"):
        return [Violation(where, "must not contain '..' (it may not climb out of the volume)")]
    return []
