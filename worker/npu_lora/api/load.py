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

from npu_lora.api import limits
from npu_lora.api.v1alpha1 import (
    API_VERSION,
    KIND,
    NAME_RULE_MESSAGE,
    MoEFinetune,
    MoEFinetuneSpec,
    dns_label_name,
    is_dns_label,
)


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
            msg = f"{msg} (got {limits.short_repr(e.get('input'))})"
        elif "input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], dict):
            msg = f"{msg} (got {limits.short_repr(e['input'])})"
        lines.append(f"{where}: {msg}")
    return "\n".join(lines)


def parse_value(text: str) -> Any:
    """``--set`` value: YAML scalar/flow syntax (``3``, ``true``, ``[q_proj, v_proj]``, ``null``)."""
    if text.strip() in ("null", "~", "Null", "NULL"):
        return None
    try:
        docs = limits.load_yaml_documents(text)
    except (yaml.YAMLError, limits.ManifestLimitError):
        return text
    return docs[0] if len(docs) == 1 else text


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


def check_metadata(meta: dict[str, Any], origin: str) -> None:
    """``metadata.name``/``namespace``, when set, are DNS-1123 labels (what Kubernetes needs for
    the run's Job, ServiceAccount and ConfigMap names; the CRD states the same rule in CEL)."""
    for key in ("name", "namespace"):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not is_dns_label(value):
            raise SpecError(
                f"{origin}: metadata.{key}: {NAME_RULE_MESSAGE} (got {limits.short_repr(value)})"
            )
    uid = meta.get("uid")
    if uid is not None and not isinstance(uid, str):
        raise SpecError(f"{origin}: metadata.uid: expected a string")


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
            text = limits.read_manifest_text(path)
            docs = limits.load_yaml_documents(text)
        except FileNotFoundError:
            raise SpecError(f"{origin}: no such file") from None
        except OSError as e:
            raise SpecError(f"{origin}: cannot read: {e.strerror}") from None
        except limits.ManifestLimitError as e:
            raise SpecError(f"{origin}: {e}") from None
        except yaml.YAMLError as e:
            raise SpecError(f"{origin}: not valid YAML: {e}") from None
        except (RecursionError, MemoryError, OverflowError, ValueError) as e:  # belt and braces
            raise SpecError(f"{origin}: not a usable YAML manifest ({type(e).__name__})") from None
        if len(docs) != 1:
            raise SpecError(f"{origin}: expected one YAML document, found {len(docs)}")
        doc = docs[0]
        if default_name is None:
            default_name = dns_label_name(path.stem)
    if not isinstance(doc, dict):
        raise SpecError(f"{origin}: expected a mapping at the top level")

    if "kind" in doc or "apiVersion" in doc:
        if doc.get("kind") != KIND:
            raise SpecError(f"{origin}: kind: expected {KIND!r}, got {doc.get('kind')!r}")
        if doc.get("apiVersion") != API_VERSION:
            raise SpecError(
                f"{origin}: apiVersion: expected {API_VERSION!r}, got {doc.get('apiVersion')!r}"
            )
        manifest = doc
        if not isinstance(manifest.get("spec"), dict):
            raise SpecError(f"{origin}: spec: missing or not a mapping")
    else:
        manifest = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {}, "spec": doc}
    if not isinstance(manifest.setdefault("metadata", {}), dict):
        raise SpecError(f"{origin}: metadata: expected a mapping")
    manifest.pop("status", None)
    check_metadata(manifest["metadata"], origin)
    if not manifest["metadata"].get("name") and default_name:
        manifest["metadata"]["name"] = default_name

    for item in overrides or []:
        if "=" not in item:
            raise SpecError(f"--set {item!r}: expected dotted.path=value")
        key, _, raw = item.partition("=")
        apply_set(manifest["spec"], key.strip(), parse_value(raw))

    bad = limits.nonfinite_paths(manifest["spec"], "spec")
    if bad:
        raise SpecError(
            f"{origin}: invalid MoEFinetune:\n"
            + "\n".join(f"{p}: must be a finite number (got NaN or infinity)" for p in bad)
        )
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
