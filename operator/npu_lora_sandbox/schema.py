"""OpenAPI v3 structural-schema handling for the API emulator: pruning, defaulting, validation, CEL.

What a real kube-apiserver does to a custom resource on create/update, in its order:

1. :func:`prune` drops fields the schema does not know (unless ``x-kubernetes-preserve-unknown-fields``)
   and returns their paths (``fieldValidation=Strict`` turns them into a 400).
2. :func:`apply_defaults` fills ``default`` values of absent properties (structural defaulting).
3. :func:`validate` checks types, formats (loosely), bounds, lengths, item counts, enums, patterns,
   ``required``, ``nullable``, ``x-kubernetes-int-or-string`` and the ``x-kubernetes-validations``
   CEL rules (with ``oldSelf`` transition rules evaluated only on update, where an old value exists).

CEL runs on cel-python with part of Kubernetes' string library added (``lowerAscii``,
``upperAscii``, ``trim``, ``split``, ``join``, ``replace``, ``indexOf``, ``lastIndexOf``,
``substring``, ``charAt``). Rules that cel-python cannot run (other Kubernetes library functions
such as ``isURL``/``quantity``, optional syntax ``.?x``, int-vs-double comparisons that Kubernetes
allows) are skipped with a logged warning rather than rejecting objects a real apiserver accepts.

Errors are :class:`Cause` objects whose text matches the apiserver's ``field.Error`` strings, e.g.
``spec.lora.r: Invalid value: 0: spec.lora.r in body should be greater than or equal to 1``;
:func:`invalid_message` joins them like the apiserver's ``StatusError`` message.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Cause",
    "apply_defaults",
    "format_value",
    "invalid_message",
    "prune",
    "validate",
]

log = logging.getLogger(__name__)

_REASON_PREFIX = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueRequired": "Required value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "FieldValueTypeInvalid": "Invalid value",
}


def format_value(value: Any) -> str:
    """Format a value the way Go's ``field.Error`` does (%#v-ish): strings quoted, numbers bare."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return repr(value)
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass
class Cause:
    """One field error: ``field`` (dotted path), ``reason`` (a ``FieldValue*`` constant), ``body``."""

    field: str
    reason: str
    body: str  # what follows "<field>: "

    def __str__(self) -> str:
        return f"{self.field}: {self.body}" if self.field else self.body

    def as_status_cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.body, "field": self.field}


def _invalid(path: str, value: Any, detail: str) -> Cause:
    return Cause(path, "FieldValueInvalid", f"Invalid value: {format_value(value)}: {detail}")


def invalid_message(kind_group: str, name: str, causes: list[Cause]) -> str:
    """``MoEFinetune.npu-lora.io "x" is invalid: <cause>`` (several causes in ``[a, b]``)."""
    if len(causes) == 1:
        return f'{kind_group} "{name}" is invalid: {causes[0]}'
    return f'{kind_group} "{name}" is invalid: [{", ".join(str(c) for c in causes)}]'


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --------------------------------------------------------------------------------------------
# Pruning and defaulting
# --------------------------------------------------------------------------------------------


def _props_schema(schema: dict[str, Any], key: str) -> dict[str, Any] | None:
    props = schema.get("properties")
    if props is not None and key in props:
        return props[key]
    add = schema.get("additionalProperties")
    if isinstance(add, dict):
        return add
    if add is True:
        return {"x-kubernetes-preserve-unknown-fields": True}
    return None


_ROOT_KEYS = ("apiVersion", "kind", "metadata")


def prune(value: Any, schema: dict[str, Any], path: str = "", *, root: bool = True) -> list[str]:
    """Remove unknown fields in place; return the dotted paths of what was removed."""
    removed: list[str] = []
    if isinstance(value, dict):
        if schema.get("type") not in (None, "object") and not schema.get(
            "x-kubernetes-int-or-string"
        ):
            return removed
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        for key in list(value):
            if (root or schema.get("x-kubernetes-embedded-resource")) and key in _ROOT_KEYS:
                continue
            sub = _props_schema(schema, key)
            if sub is None:
                if preserve:
                    continue
                del value[key]
                removed.append(_join(path, key))
                continue
            removed += prune(value[key], sub, _join(path, key), root=False)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                removed += prune(item, items, f"{path}[{i}]", root=False)
    return removed


def apply_defaults(value: Any, schema: dict[str, Any]) -> None:
    """Structural defaulting in place: absent properties with a ``default`` get a copy of it."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if (key not in value and "default" in sub) or (
                key in value and value[key] is None and "default" in sub and not sub.get("nullable")
            ):
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            sub = props.get(key)
            if sub is None:
                add = schema.get("additionalProperties")
                sub = add if isinstance(add, dict) else None
            if sub is not None:
                apply_defaults(item, sub)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for item in value:
                apply_defaults(item, items)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, typ: str) -> bool:
    actual = _json_type(value)
    if typ == actual:
        return True
    if typ == "number" and actual == "integer":
        return True
    return bool(typ == "integer" and isinstance(value, float) and value.is_integer())


_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_FORMATS = {
    "date-time": _DATE_TIME,
    "date": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
    "uuid": re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$"),
}


def _num(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def validate(
    value: Any,
    schema: dict[str, Any],
    *,
    old: Any = None,
    has_old: bool = False,
    path: str = "",
) -> list[Cause]:
    """Validate ``value`` against ``schema``; ``old``/``has_old`` enable CEL transition rules."""
    causes: list[Cause] = []
    _validate(value, schema, old, has_old, path, causes)
    return causes


def _validate(
    value: Any, schema: dict[str, Any], old: Any, has_old: bool, path: str, causes: list[Cause]
) -> None:
    shown = path or "<root>"
    if value is None:
        if schema.get("nullable"):
            return
        typ = schema.get("type")
        if typ:
            causes.append(_invalid(path, "null", f'{shown} in body must be of type {typ}: "null"'))
        return
    wrong_type = _type_error(value, schema, path, shown)
    if wrong_type is not None:
        causes.append(wrong_type)
        return

    n_before = len(causes)
    if isinstance(value, int | float) and not isinstance(value, bool):
        _validate_number(value, schema, path, shown, causes)
    if isinstance(value, str):
        _validate_string(value, schema, path, shown, causes)
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(format_value(v) for v in schema["enum"])
        causes.append(
            Cause(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {format_value(value)}: supported values: {supported}",
            )
        )
    if isinstance(value, list):
        _validate_array(value, schema, old, has_old, path, shown, causes)
    if isinstance(value, dict):
        _validate_object(value, schema, old, has_old, path, causes)
    for sub in schema.get("allOf") or []:
        _validate(value, sub, old, has_old, path, causes)
    _validate_combinators(value, schema, path, shown, causes)
    # CEL rules run only where the value is otherwise valid (like the apiserver's cost-free path).
    if schema.get("x-kubernetes-validations") and len(causes) == n_before:
        _validate_cel(value, schema, old, has_old, path, causes)


def _type_error(value: Any, schema: dict[str, Any], path: str, shown: str) -> Cause | None:
    """The cause when a (non-null) value has the wrong JSON type (int-or-string honoured)."""
    typ = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            return _invalid(
                path,
                _json_type(value),
                f'{shown} in body must be of type integer,string: "{_json_type(value)}"',
            )
        return None
    if typ and not _type_ok(value, typ):
        actual = _json_type(value)
        return _invalid(path, actual, f'{shown} in body must be of type {typ}: "{actual}"')
    return None


def _validate_combinators(
    value: Any, schema: dict[str, Any], path: str, shown: str, causes: list[Cause]
) -> None:
    """``anyOf``, ``oneOf`` and ``not`` (``allOf`` recurses in :func:`_validate`)."""
    any_of = schema.get("anyOf")
    if any_of and all(validate(value, s, path=path) for s in any_of):
        causes.append(_invalid(path, value, f"{shown} in body must be of type anyOf"))
    if schema.get("oneOf"):
        matches = sum(1 for s in schema["oneOf"] if not validate(value, s, path=path))
        if matches != 1:
            causes.append(
                _invalid(
                    path, value, f"{shown} in body must validate one and only one schema (oneOf)"
                )
            )
    if isinstance(schema.get("not"), dict) and not validate(value, schema["not"], path=path):
        causes.append(
            _invalid(path, value, f"{shown} in body should not validate the given schema")
        )


def _validate_number(
    value: float, schema: dict[str, Any], path: str, shown: str, causes: list[Cause]
) -> None:
    if "minimum" in schema:
        lo = schema["minimum"]
        if schema.get("exclusiveMinimum") is True:
            if not value > lo:
                causes.append(
                    _invalid(path, value, f"{shown} in body should be greater than {_num(lo)}")
                )
        elif not value >= lo:
            causes.append(
                _invalid(
                    path, value, f"{shown} in body should be greater than or equal to {_num(lo)}"
                )
            )
    if "maximum" in schema:
        hi = schema["maximum"]
        if schema.get("exclusiveMaximum") is True:
            if not value < hi:
                causes.append(
                    _invalid(path, value, f"{shown} in body should be less than {_num(hi)}")
                )
        elif not value <= hi:
            causes.append(
                _invalid(path, value, f"{shown} in body should be less than or equal to {_num(hi)}")
            )
    mult = schema.get("multipleOf")
    if mult and not math.isclose(value / mult, round(value / mult)):
        causes.append(
            _invalid(path, value, f"{shown} in body should be a multiple of {_num(mult)}")
        )
    fmt = schema.get("format")
    if fmt == "int32" and isinstance(value, int) and not -(2**31) <= value < 2**31:
        causes.append(_invalid(path, value, f"{shown} in body must be of type int32"))


def _validate_string(
    value: str, schema: dict[str, Any], path: str, shown: str, causes: list[Cause]
) -> None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        causes.append(
            Cause(
                path,
                "FieldValueTooLong",
                f"Too long: may not be more than {schema['maxLength']} bytes",
            )
        )
    if "minLength" in schema and len(value) < schema["minLength"]:
        causes.append(
            _invalid(
                path, value, f"{shown} in body should be at least {schema['minLength']} chars long"
            )
        )
    pattern = schema.get("pattern")
    if pattern and not re.search(pattern, value):
        causes.append(_invalid(path, value, f"{shown} in body should match '{pattern}'"))
    fmt = schema.get("format")
    rx = _FORMATS.get(fmt or "")
    if rx is not None and not rx.match(value):
        causes.append(
            _invalid(path, value, f"{shown} in body must be of type {fmt}: {json.dumps(value)}")
        )


def _validate_array(
    value: list[Any],
    schema: dict[str, Any],
    old: Any,
    has_old: bool,
    path: str,
    shown: str,
    causes: list[Cause],
) -> None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        causes.append(
            Cause(
                path,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
            )
        )
    if "minItems" in schema and len(value) < schema["minItems"]:
        causes.append(
            _invalid(
                path, len(value), f"{shown} in body should have at least {schema['minItems']} items"
            )
        )
    if schema.get("uniqueItems") or schema.get("x-kubernetes-list-type") == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                causes.append(
                    Cause(
                        f"{path}[{i}]",
                        "FieldValueDuplicate",
                        f"Duplicate value: {format_value(item)}",
                    )
                )
            seen.append(item)
    items = schema.get("items")
    if not isinstance(items, dict):
        return
    keys = schema.get("x-kubernetes-list-map-keys") or []
    old_by_key: dict[tuple[Any, ...], Any] = {}
    if has_old and isinstance(old, list) and schema.get("x-kubernetes-list-type") == "map" and keys:
        for item in old:
            if isinstance(item, dict):
                old_by_key[tuple(item.get(k) for k in keys)] = item
    for i, item in enumerate(value):
        o_has, o_val = False, None
        if old_by_key and isinstance(item, dict):
            k = tuple(item.get(k) for k in keys)
            if k in old_by_key:
                o_has, o_val = True, old_by_key[k]
        _validate(item, items, o_val, o_has, f"{path}[{i}]", causes)


def _validate_object(
    value: dict[str, Any],
    schema: dict[str, Any],
    old: Any,
    has_old: bool,
    path: str,
    causes: list[Cause],
) -> None:
    for req in schema.get("required") or []:
        if req not in value:
            causes.append(Cause(_join(path, req), "FieldValueRequired", "Required value"))
    props = schema.get("properties") or {}
    add = schema.get("additionalProperties")
    old_map = old if has_old and isinstance(old, dict) else None
    for key, item in value.items():
        if not path and key in ("apiVersion", "kind", "metadata"):
            continue
        sub = props.get(key)
        if sub is None and isinstance(add, dict):
            sub = add
        if sub is None:
            continue
        o_has = old_map is not None and key in old_map
        _validate(item, sub, old_map.get(key) if o_has else None, o_has, _join(path, key), causes)
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        causes.append(
            Cause(
                path,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxProperties']} items",
            )
        )


# --------------------------------------------------------------------------------------------
# CEL (x-kubernetes-validations) through cel-python
# --------------------------------------------------------------------------------------------

_OLD_SELF = re.compile(r"\boldSelf\b")
_programs: dict[str, Any] = {}


def _program(expr: str) -> Any:
    prog = _programs.get(expr)
    if prog is None:
        import celpy  # local: cel-python is an optional dependency (operator extra)

        env = celpy.Environment()
        prog = env.program(env.compile(expr), functions=_k8s_functions())
        _programs[expr] = prog
    return prog


def _k8s_functions() -> dict[str, Any]:
    """A part of the Kubernetes CEL string library (cel-go ``ext.Strings``) for cel-python."""
    from celpy import celtypes

    S, L, I = celtypes.StringType, celtypes.ListType, celtypes.IntType  # noqa: E741

    def split(s: str, sep: str, n: int = -1) -> Any:
        parts = s.split(sep) if n < 0 else s.split(sep, max(int(n) - 1, 0)) if n else []
        return L([S(p) for p in parts])

    def substring(s: str, start: int, end: int | None = None) -> Any:
        return S(s[int(start) :] if end is None else s[int(start) : int(end)])

    return {
        "lowerAscii": lambda s: S(str(s).lower()),
        "upperAscii": lambda s: S(str(s).upper()),
        "trim": lambda s: S(str(s).strip()),
        "split": split,
        "join": lambda lst, sep=S(""): S(str(sep).join(str(x) for x in lst)),
        "replace": lambda s, old, new, n=-1: S(str(s).replace(str(old), str(new), int(n))),
        "indexOf": lambda s, sub: I(str(s).find(str(sub))),
        "lastIndexOf": lambda s, sub: I(str(s).rfind(str(sub))),
        "substring": substring,
        "charAt": lambda s, i: S(str(s)[int(i)] if int(i) < len(str(s)) else ""),
    }


# Errors that come from cel-python's gaps (functions of the Kubernetes CEL libraries it lacks,
# cross-type numeric comparisons that Kubernetes allows), not from the object: such rules are
# skipped with a warning instead of rejecting objects a real apiserver would accept.
_UNSUPPORTED = ("undeclared reference", "no matching overload", "unexpected token", "CELParseError")
_warned: set[str] = set()


def to_cel(value: Any, schema: dict[str, Any] | None) -> Any:
    """Convert a JSON value to celpy types, using the schema for number/integer distinctions."""
    from celpy import celtypes

    schema = schema or {}
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int | float):
        if schema.get("type") == "number" or isinstance(value, float):
            return celtypes.DoubleType(float(value))
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        return celtypes.ListType([to_cel(v, items) for v in value])
    if isinstance(value, dict):
        out = celtypes.MapType()
        for k, v in value.items():
            sub = _props_schema(schema, k) if schema else None
            out[celtypes.StringType(k)] = to_cel(v, sub)
        return out
    return value


def _cel_eval(expr: str, activation: dict[str, Any]) -> Any:
    import celpy

    result = _program(expr).evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def _type_name(value: Any, schema: dict[str, Any]) -> str:
    typ = schema.get("type")
    if typ:
        return str(typ)
    return _json_type(value)


def _validate_cel(
    value: Any, schema: dict[str, Any], old: Any, has_old: bool, path: str, causes: list[Cause]
) -> None:
    self_cel = None
    old_cel = None
    for rule in schema.get("x-kubernetes-validations") or []:
        expr = rule.get("rule", "")
        transition = bool(_OLD_SELF.search(expr))
        if transition and not has_old and not rule.get("optionalOldSelf"):
            continue
        if self_cel is None:
            self_cel = to_cel(value, schema)
        activation: dict[str, Any] = {"self": self_cel}
        if transition:
            if old_cel is None and has_old:
                old_cel = to_cel(old, schema)
            activation["oldSelf"] = old_cel
        field = path
        fp = rule.get("fieldPath")
        if fp:
            field = path + fp if fp.startswith(".") or fp.startswith("[") else _join(path, fp)
        try:
            ok = _cel_eval(expr, activation)
        except Exception as exc:  # evaluation errors are validation errors in the apiserver too
            text = _cel_error_text(exc)
            if any(u in text or u in type(exc).__name__ for u in _UNSUPPORTED):
                if expr not in _warned:
                    _warned.add(expr)
                    log.warning("CEL rule %r skipped (unsupported by cel-python): %s", expr, text)
                continue
            causes.append(
                _invalid(
                    field, _type_name(value, schema), f"evaluation error: {_cel_error_text(exc)}"
                )
            )
            continue
        if bool(ok):
            continue
        message = rule.get("message") or f"failed rule: {expr}"
        if rule.get("messageExpression"):
            try:
                msg = _cel_eval(rule["messageExpression"], activation)
                if isinstance(msg, str) and msg.strip():
                    message = str(msg)
            except Exception:
                pass
        reason = rule.get("reason") or "FieldValueInvalid"
        if reason == "FieldValueInvalid":
            causes.append(_invalid(field, _type_name(value, schema), message))
        else:
            prefix = _REASON_PREFIX.get(reason, "Invalid value")
            causes.append(Cause(field, reason, f"{prefix}: {message}"))


def _cel_error_text(exc: Exception) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    return text.split(" (in activation")[0].strip()
