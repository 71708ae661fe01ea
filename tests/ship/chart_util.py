"""Helpers for the chart tests: render with Helm's Go engine (helm_python), parse, validate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "npu-lora-operator"
CRD_NAME = "npu-lora.io_moefinetunes.yaml"
REPO_CRD = REPO / "crds" / CRD_NAME
CHART_CRD = CHART / "crds" / CRD_NAME
RELEASE = "npu-lora"
NAMESPACE = "npu-lora"


def render(
    values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    """``{template path: rendered text}`` (NOTES.txt included)."""
    import helm_python

    with helm_python.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=name, namespace=namespace)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object of a render (NOTES.txt and empty documents skipped)."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(doc)
    return out


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def validate_k8s(obj: dict[str, Any], version: str = "1.32") -> None:
    """kubernetes_validate in strict mode, with a short failure message."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in getattr(e, "absolute_path", []) or [])
        kind = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        raise AssertionError(
            f"{kind} invalid for Kubernetes {version} at {where!r}: {str(e.message)[:500]}"
        ) from None
