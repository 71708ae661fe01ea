"""Hostile chart values (issue 38): a newline, YAML or a template in a name or path value is
either refused by values.schema.json or inserted quoted, so the rendered manifests have exactly
the structure they have with a plain value. Rendered with Helm's own Go engine (helm_python)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from chart_util import render

helm_python = pytest.importorskip("helm_python")

HOSTILE = [
    "x\n  privileged: true",
    "x\nkind: Secret",
    "{{ .Release.Name }}",
    "x: y # z",
    'x" , "y',
]

#: (values path, a plain value, extra values the key needs)
KEYS: list[tuple[str, Any, dict[str, Any]]] = [
    ("nameOverride", "plain", {}),
    ("fullnameOverride", "plain", {}),
    ("image.repository", "reg.example.com/op", {}),
    ("image.tag", "v1", {}),
    ("workerImage.repository", "reg.example.com/worker", {}),
    ("workerImage.tag", "v1", {}),
    ("serviceAccount.name", "plain", {}),
    ("liveness.path", "/healthz", {}),
    ("extraArgs.0", "--x", {}),
    ("priorityClassName", "plain", {}),
    ("imagePullSecrets.0.name", "plain", {}),
    ("watchNamespaces.0", "plain", {}),
    ("extraEnv.0.name", "PLAIN", {}),
    ("policy.allowedHostPaths.0", "/srv/models", {}),
    ("policy.allowedMountPaths.0", "/mnt/extra", {}),
    ("policy.allowedImages.0", "reg.example.com/*", {}),
    ("policy.allowedSecrets.0", "plain", {}),
    ("policy.allowedServiceAccountNames.0", "plain", {}),
    ("policy.allowedPriorityClasses.0", "team-*", {}),
    ("policy.allowedTolerationKeys.0", "example.com/*", {}),
    ("metrics.serviceMonitor.interval", "30s", {"metrics": {"serviceMonitor": {"enabled": True}}}),
    ("podAnnotations.a", "plain", {}),
    ("podLabels.a", "plain", {}),
    ("nodeSelector.a", "plain", {}),
    ("serviceAccount.annotations.a", "plain", {}),
]


def _set(values: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    values = copy.deepcopy(values)
    parts = path.split(".")
    cur: Any = values
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt_is_index = not last and parts[i + 1].isdigit()
        if part.isdigit():
            idx = int(part)
            while len(cur) <= idx:
                cur.append({} if nxt_is_index is False and not last else None)
            if last:
                cur[idx] = value
            else:
                if not isinstance(cur[idx], (dict, list)):
                    cur[idx] = [] if nxt_is_index else {}
                cur = cur[idx]
        elif last:
            cur[part] = value
        else:
            cur = cur.setdefault(part, [] if nxt_is_index else {})
    return values


def _shape(node: Any, prefix: str = "") -> set[str]:
    """Every key path of a parsed manifest (values left out, list indexes kept)."""
    out = {prefix}
    if isinstance(node, dict):
        for k, v in node.items():
            out |= _shape(v, f"{prefix}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out |= _shape(v, f"{prefix}[{i}]")
    return out


def _manifests(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (str(k), *_strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


@pytest.mark.parametrize(("path", "plain", "extra"), KEYS, ids=[k[0] for k in KEYS])
def test_hostile_values_are_refused_or_rendered_quoted(path: str, plain: Any, extra: dict) -> None:
    base = _set(extra, path, plain)
    expected = [(d.get("kind"), sorted(_shape(d))) for d in _manifests(base)]
    for hostile in HOSTILE:
        try:
            docs = _manifests(_set(extra, path, hostile))
        except helm_python.HelmValuesError as e:  # the schema refuses it, naming the key
            assert path.split(".")[0] in str(e), str(e)[:300]
            continue
        got = [(d.get("kind"), sorted(_shape(d))) for d in docs]
        assert got == expected, f"{path}={hostile!r} changed the rendered structure"
        # the value arrives whole, as one string, where it arrives at all
        assert not any(
            "privileged" in s and s != hostile and hostile not in s
            for s in (x for d in docs for x in _strings(d))
        ), path


def test_a_newline_in_a_name_or_path_is_refused_by_the_schema() -> None:
    for path in ("liveness.path", "nameOverride", "serviceAccount.name", "image.repository"):
        with pytest.raises(helm_python.HelmValuesError):
            render(_set({}, path, "ok\n  privileged: true"))
