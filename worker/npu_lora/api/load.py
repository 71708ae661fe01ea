"""Load a MoEFinetune manifest (or a bare spec) from YAML, apply ``--set`` overrides, validate.

Errors are :class:`SpecError` whose message names each bad field by its YAML path
(``spec.lora.r``), what was wrong and what is allowed. Nothing here writes files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from npu_lora.api.v1alpha1 import API_VERSION, KIND, MoEFinetune, MoEFinetuneSpec


class SpecError(ValueError):
    """An invalid manifest, field or override. ``str()`` is the user-facing message."""


def _fmt_loc(prefix: str, loc: tuple[Any, ...]) -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
        else:
            parts.append(str(item))
    return ".".join(parts) or "<root>"


def format_validation_error(err: ValidationError, prefix: str = "spec") -> str:
    lines = []
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        where = _fmt_loc(prefix, loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (not part of the MoEFinetune schema; check the spelling)"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        elif "input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], dict):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{where}: {msg}")
    return "\n".join(lines)


def parse_value(text: str) -> Any:
    """``--set`` value: YAML scalar/flow syntax (``3``, ``true``, ``[q_proj, v_proj]``, ``null``)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c=value`` in ``doc`` (creating maps). Keys are YAML (camelCase) names.

    A leading ``spec.`` is optional.
    """
    keys = [k for k in dotted.split(".") if k]
    if not keys:
        raise SpecError(f"--set {dotted!r}: empty field path")
    if keys[0] == "spec":
        keys = keys[1:]
    cur = doc
    for i, k in enumerate(keys[:-1]):
        nxt = cur.get(k)
        if nxt is None:
            nxt = cur[k] = {}
        if not isinstance(nxt, dict):
            where = "spec." + ".".join(keys[: i + 1])
            raise SpecError(f"--set {dotted}: {where} is not a mapping (it is {nxt!r})")
        cur = nxt
    cur[keys[-1]] = value


def load_manifest(
    source: str | Path | dict[str, Any],
    overrides: list[str] | None = None,
    *,
    default_name: str | None = None,
) -> MoEFinetune:
    """Read a MoEFinetune manifest or a bare spec and validate it.

    ``overrides`` are ``dotted.path=value`` strings applied to the spec before validation.
    """
    if isinstance(source, dict):
        doc: Any = json.loads(json.dumps(source))
        origin = "<dict>"
    else:
        path = Path(source)
        origin = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecError(f"{origin}: no such file") from None
        except OSError as e:
            raise SpecError(f"{origin}: cannot read: {e.strerror}") from None
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as e:
            raise SpecError(f"{origin}: not valid YAML: {e}") from None
        if len(docs) != 1:
            raise SpecError(f"{origin}: expected one YAML document, found {len(docs)}")
        doc = docs[0]
        if default_name is None:
            default_name = path.stem
    if not isinstance(doc, dict):
        raise SpecError(f"{origin}: expected a mapping at the top level")

    if "kind" in doc or "apiVersion" in doc:
        if doc.get("kind") != KIND:
            raise SpecError(f"kind: expected {KIND!r}, got {doc.get('kind')!r}")
        if doc.get("apiVersion") != API_VERSION:
            raise SpecError(f"apiVersion: expected {API_VERSION!r}, got {doc.get('apiVersion')!r}")
        manifest = doc
        if not isinstance(manifest.get("spec"), dict):
            raise SpecError("spec: missing or not a mapping")
    else:
        manifest = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {}, "spec": doc}
    manifest.setdefault("metadata", {})
    manifest.pop("status", None)
    if not manifest["metadata"].get("name") and default_name:
        manifest["metadata"]["name"] = default_name

    for item in overrides or []:
        if "=" not in item:
            raise SpecError(f"--set {item!r}: expected dotted.path=value")
        key, _, raw = item.partition("=")
        apply_set(manifest["spec"], key.strip(), parse_value(raw))

    try:
        spec = MoEFinetuneSpec.model_validate(manifest["spec"])
    except ValidationError as e:
        raise SpecError(f"{origin}: invalid MoEFinetune:\n{format_validation_error(e)}") from None
    try:
        return MoEFinetune.model_validate({**manifest, "spec": spec})
    except ValidationError as e:
        raise SpecError(
            f"{origin}: invalid MoEFinetune:\n{format_validation_error(e, prefix='')}"
        ) from None
