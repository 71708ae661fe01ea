"""Kubernetes' CEL cost model for a CRD's ``x-kubernetes-validations`` rules, in Python.

When a CustomResourceDefinition is created or updated the apiserver compiles every rule against
the schema and *estimates* its worst-case cost before any object exists: sizes come from the
schema (``maxLength`` × 4 bytes, ``maxItems``, ``maxProperties``; without a bound, whatever fits
into one 3 MiB request), and each operation has a cost formula (cel-go ``checker/cost.go`` and
Kubernetes' ``apiserver/pkg/cel/library/cost.go``). A rule over
:data:`STATIC_ESTIMATED_COST_LIMIT`, or a CRD whose rules (each × how often it can run, the
product of the ``maxItems``/``maxProperties`` above it) sum over
:data:`STATIC_ESTIMATED_CRD_COST_LIMIT`, is refused: "estimated rule cost exceeds budget".

:func:`rule_costs` does that estimate for the operations this project's rules use (literals,
identifiers, field selection, ``has``, ``!``, ``&&``, ``||``, ``?:``, comparisons, ``==``/``!=``,
``in``, ``size``, ``matches``, ``contains``, ``startsWith``, ``endsWith``, list literals). An
operation it does not model raises :class:`UnsupportedRule` (write its cost formula here first).
Two modes:

- ``conservative=False``: the apiserver's static estimate (the sandbox refuses a CRD with it,
  as the apiserver does);
- ``conservative=True`` (default): an upper bound of that estimate and of the runtime cost, which
  counts ``==``/``!=`` of lists, maps and objects as a walk of the whole value (the apiserver's
  estimate charges an object comparison almost nothing; its runtime charges the shallow size):
  what the project's tests hold every rule to, against :data:`PER_CALL_LIMIT`.

Every string, list or map a rule reads whose size has no bound in the schema is reported in
:attr:`RuleCost.unbounded` (``metadata.name``/``generateName`` excepted: Kubernetes forbids a
``maxLength`` there and bounds them by the request size).

``python -m npu_lora_sandbox.celcost [CRD.yaml]`` prints each rule's estimated cost (default:
the generated MoEFinetune CRD).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_REQUEST_SIZE_BYTES",
    "PER_CALL_LIMIT",
    "RUNTIME_CEL_COST_BUDGET",
    "STATIC_ESTIMATED_COST_LIMIT",
    "STATIC_ESTIMATED_CRD_COST_LIMIT",
    "RuleCost",
    "UnsupportedRule",
    "crd_cost_errors",
    "rule_costs",
]

# -- the limits (Kubernetes sources, read at kubernetes/apiserver 24a394e, 2026-07-23, and
#    kubernetes/apiextensions-apiserver 1aa2717, 2026-07-22) ----------------------------------
#: k8s.io/apiserver/pkg/apis/cel/config.go ``PerCallLimit``: the runtime cost limit of one
#: rule evaluation (also what each rule is compiled with)
PER_CALL_LIMIT = 1_000_000
#: k8s.io/apiserver/pkg/apis/cel/config.go ``RuntimeCELCostBudget``: all rules of one object
RUNTIME_CEL_COST_BUDGET = 10_000_000
#: k8s.io/apiserver/pkg/apis/cel/config.go ``MaxRequestSizeBytes``: what an unbounded string,
#: list or map is assumed to fill
MAX_REQUEST_SIZE_BYTES = 3 * 1024 * 1024
#: k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation/validation.go
#: ``StaticEstimatedCostLimit``: one rule's estimated cost × its cardinality
STATIC_ESTIMATED_COST_LIMIT = 10_000_000
#: ...validation.go ``StaticEstimatedCRDCostLimit``: the sum over a CRD's rules
STATIC_ESTIMATED_CRD_COST_LIMIT = 100_000_000

# -- cel-go common/cost.go (google/cel-go 14f6746) -------------------------------------------
SELECT_AND_IDENT_COST = 1  # SelectAndIdentCost (also the presence test of has())
CONST_COST = 0  # ConstCost
LIST_CREATE_BASE_COST = 10  # ListCreateBaseCost
STRING_TRAVERSAL_COST_FACTOR = 0.1  # StringTraversalCostFactor
REGEX_STRING_LENGTH_COST_FACTOR = 0.25  # RegexStringLengthCostFactor

UNBOUNDED = MAX_REQUEST_SIZE_BYTES - 2  # apiserver/pkg/cel/common/schemas.go: minus the ""


class UnsupportedRule(ValueError):
    """A rule uses syntax or a function this estimator has no cost formula for."""


def _factor(n: int, f: float) -> int:
    """cel-go ``multiplyByCostFactor``: rounded up."""
    return math.ceil(n * f)


# --------------------------------------------------------------------------------------------
# A parser for the CEL subset (precedence as in the CEL spec)
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<num>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[uU]?)
  | (?P<str>[rR]?'(?:\\.|[^'\\])*'|[rR]?"(?:\\.|[^"\\])*")
  | (?P<op>\|\||&&|==|!=|<=|>=|[<>!?:().,\[\]+\-*/%{}])
  | (?P<id>[A-Za-z_][A-Za-z_0-9]*)
)""",
    re.VERBOSE,
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise UnsupportedRule(f"cannot read {text[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _unquote(tok: str) -> str:
    raw = tok[:1] in "rR"
    body = tok[2:-1] if raw else tok[1:-1]
    if raw:
        return body
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise UnsupportedRule("unexpected end of rule")
        tok = self.toks[self.i]
        if want is not None and tok[1] != want:
            raise UnsupportedRule(f"expected {want!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> tuple:
        node = self.ternary()
        if self.i != len(self.toks):
            raise UnsupportedRule(f"unexpected {self.peek()!r}")
        return node

    def ternary(self) -> tuple:
        cond = self.binary(0)
        if self.peek() == "?":
            self.take("?")
            a = self.ternary()
            self.take(":")
            b = self.ternary()
            return ("call", "_?_:_", None, [cond, a, b])
        return cond

    _LEVELS = (("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"))

    def binary(self, level: int) -> tuple:
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while self.peek() in self._LEVELS[level] and (
            self.peek() != "in" or self.toks[self.i][0] == "id"
        ):
            op = self.take()[1]
            rhs = self.binary(level + 1)
            node = ("call", "@in" if op == "in" else f"_{op}_", None, [node, rhs])
        return node

    def unary(self) -> tuple:
        if self.peek() in ("!", "-"):
            op = self.take()[1]
            return ("call", f"{op}_", None, [self.unary()])
        return self.member()

    def member(self) -> tuple:
        node = self.primary()
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                name = self.take()[1]
                if self.peek() == "(":
                    node = ("call", name, node, self.args())
                else:
                    node = ("select", node, name)
            else:
                raise UnsupportedRule("indexing ([...]) has no cost formula here")
        return node

    def args(self) -> list[tuple]:
        self.take("(")
        out: list[tuple] = []
        while self.peek() != ")":
            out.append(self.ternary())
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return out

    def primary(self) -> tuple:
        kind, tok = self.take()
        if tok == "(":
            node = self.ternary()
            self.take(")")
            return node
        if tok == "[":
            elems: list[tuple] = []
            while self.peek() != "]":
                elems.append(self.ternary())
                if self.peek() == ",":
                    self.take(",")
            self.take("]")
            return ("list", elems)
        if kind == "num":
            return ("lit", float(tok) if "." in tok else int(tok.rstrip("uU")))
        if kind == "str":
            return ("lit", _unquote(tok))
        if kind == "id":
            if tok in ("true", "false"):
                return ("lit", tok == "true")
            if tok == "null":
                return ("lit", None)
            if self.peek() == "(":
                if tok == "has":
                    (arg,) = self.args()
                    if arg[0] != "select":
                        raise UnsupportedRule("has() needs a field selection")
                    return ("has", arg)
                return ("call", tok, None, self.args())
            return ("ident", tok)
        raise UnsupportedRule(f"unexpected {tok!r}")


# --------------------------------------------------------------------------------------------
# Sizes from the schema (apiserver/pkg/cel/common/schemas.go SchemaDeclType)
# --------------------------------------------------------------------------------------------


def _is_map(s: dict[str, Any]) -> bool:
    return s.get("type") == "object" and isinstance(s.get("additionalProperties"), dict)


def _is_free_form(s: dict[str, Any]) -> bool:
    return (
        s.get("type") in (None, "object")
        and not s.get("properties")
        and not _is_map(s)
        and not s.get("x-kubernetes-int-or-string")
    )


def _min_size(s: dict[str, Any]) -> int:
    """The smallest JSON serialisation of a value of ``s`` (for unbounded lists and maps)."""
    typ = s.get("type")
    if typ == "string" or s.get("x-kubernetes-int-or-string"):
        return 2 if typ == "string" else 1
    if typ == "boolean":
        return 4
    if typ in ("integer", "number"):
        return 1
    if typ == "object" and s.get("properties"):
        size = 2
        for name in s.get("required") or []:
            sub = s["properties"].get(name)
            if sub is not None and "default" not in sub:
                size += len(name) + _min_size(sub) + 4
        return size
    return 2


@dataclass
class _Size:
    """The apiserver's ``MaxElements`` of a value (bytes of a string, items of a list or map)."""

    n: int
    unbounded: list[str] = field(default_factory=list)


def _max_elements(s: dict[str, Any] | None, path: str) -> _Size:
    if s is None:
        return _Size(UNBOUNDED, [path])
    if s.get("_request_bounded"):
        return _Size(UNBOUNDED)
    typ = s.get("type")
    if typ == "string" or s.get("x-kubernetes-int-or-string"):
        if "maxLength" in s:
            return _Size(4 * int(s["maxLength"]))
        if s.get("enum"):
            return _Size(max(len(str(v)) for v in s["enum"]))
        return _Size(UNBOUNDED, [path])
    if typ == "array":
        if "maxItems" in s:
            return _Size(int(s["maxItems"]))
        return _Size(UNBOUNDED // (_min_size(s.get("items") or {}) + 1), [path])
    if _is_map(s):
        if "maxProperties" in s:
            return _Size(int(s["maxProperties"]))
        return _Size(UNBOUNDED // (_min_size(s["additionalProperties"]) + 6), [path])
    return _Size(0)  # objects, numbers, booleans: MaxElements is not set


def _walk_cost(s: dict[str, Any] | None, path: str) -> _Size:
    """An upper bound of traversing a whole value of ``s`` (what comparing two of them costs at
    most): strings by their bytes × 0.1, every scalar 1, lists and maps by their bound."""
    if s is None or s.get("_request_bounded"):
        return _Size(_factor(UNBOUNDED, STRING_TRAVERSAL_COST_FACTOR), [] if s else [path])
    typ = s.get("type")
    if typ == "string" or s.get("x-kubernetes-int-or-string"):
        sz = _max_elements(s, path)
        return _Size(max(1, _factor(sz.n, STRING_TRAVERSAL_COST_FACTOR)), sz.unbounded)
    if typ == "array":
        n = _max_elements(s, path)
        item = _walk_cost(s.get("items"), f"{path}[]")
        return _Size(n.n * max(1, item.n), n.unbounded + item.unbounded)
    if _is_map(s):
        n = _max_elements(s, path)
        # map keys carry no maxLength in a structural schema: the request bounds them
        key = _factor(UNBOUNDED, STRING_TRAVERSAL_COST_FACTOR)
        value = _walk_cost(s["additionalProperties"], f"{path}.*")
        return _Size(n.n * (key + max(1, value.n)), [*n.unbounded, f"{path} (keys)"])
    if typ == "object" or typ is None:
        props = s.get("properties") or {}
        if not props:
            return _Size(UNBOUNDED, [f"{path} (free-form)"])
        total, unb = 1, []
        for name, sub in props.items():
            w = _walk_cost(sub, f"{path}.{name}")
            total += max(1, w.n)
            unb += w.unbounded
        return _Size(total, unb)
    return _Size(1)


# --------------------------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------------------------


@dataclass
class _Est:
    cost: int
    schema: dict[str, Any] | None = None  # the value's schema, when it is a field
    path: str | None = None
    lit_size: int | None = None  # a literal's size (runes of a string, items of a list)
    unbounded: list[str] = field(default_factory=list)
    text: bool = False  # a string (literal or computed)

    @property
    def is_string(self) -> bool:
        return self.text or (self.schema or {}).get("type") == "string"


def _with_object_meta(schema: dict[str, Any]) -> dict[str, Any]:
    """``WithTypeAndObjectMeta``: a resource root's rules see ``metadata.name`` and
    ``generateName`` (strings without a bound it can see)."""
    out = dict(schema)
    props = dict(out.get("properties") or {})
    meta = {"type": "string", "_request_bounded": True}
    props["metadata"] = {"type": "object", "properties": {"name": meta, "generateName": meta}}
    out["properties"] = props
    return out


#: CEL's type names, usable as values (``type(self) == bool``)
_TYPE_NAMES = frozenset({"bool", "int", "uint", "double", "string", "bytes", "list", "map"})


class _Estimator:
    def __init__(self, schema: dict[str, Any], where: str, conservative: bool) -> None:
        self.schema = schema
        self.where = where
        self.conservative = conservative

    def size(self, e: _Est) -> _Size:
        if e.lit_size is not None:
            return _Size(e.lit_size)
        if e.schema is None and e.path is None:
            return _Size(UNBOUNDED, ["(a computed value)"])
        return _max_elements(e.schema, e.path or "?")

    def est(self, node: tuple) -> _Est:
        kind = node[0]
        if kind == "lit":
            v = node[1]
            size = len(v) if isinstance(v, str) else 1
            return _Est(CONST_COST, lit_size=size, text=isinstance(v, str))
        if kind == "ident":
            name = node[1]
            if name in _TYPE_NAMES:  # a type literal (``type(self) == bool``): a constant
                return _Est(CONST_COST, lit_size=1)
            if name not in ("self", "oldSelf"):
                raise UnsupportedRule(f"unknown identifier {name!r}")
            return _Est(SELECT_AND_IDENT_COST, schema=self.schema, path=self.where)
        if kind == "select":
            inner = self.est(node[1])
            sub = None
            if inner.schema is not None:
                sub = (inner.schema.get("properties") or {}).get(node[2])
                if sub is None and _is_map(inner.schema):
                    sub = inner.schema["additionalProperties"]
            path = f"{inner.path}.{node[2]}" if inner.path else node[2]
            if sub is None:
                raise UnsupportedRule(f"{path}: no such field in the schema")
            return _Est(
                inner.cost + SELECT_AND_IDENT_COST,
                schema=sub,
                path=path,
                unbounded=inner.unbounded,
            )
        if kind == "has":
            inner = self.est(node[1][1])
            return _Est(inner.cost + SELECT_AND_IDENT_COST, lit_size=1, unbounded=inner.unbounded)
        if kind == "list":
            elems = [self.est(e) for e in node[1]]
            return _Est(
                LIST_CREATE_BASE_COST + sum(e.cost for e in elems),
                lit_size=len(elems),
                unbounded=[u for e in elems for u in e.unbounded],
            )
        if kind == "call":
            return self.call(node[1], node[2], node[3])
        raise UnsupportedRule(f"no cost formula for {kind}")

    def call(self, fn: str, target: tuple | None, args: list[tuple]) -> _Est:
        t = self.est(target) if target is not None else None
        a = [self.est(x) for x in args]
        base = (t.cost if t else 0) + sum(x.cost for x in a)
        unb = (t.unbounded if t else []) + [u for x in a for u in x.unbounded]
        # cel-go computeTypeSize: a computed boolean, int or double has size 1
        if fn in ("_&&_", "_||_"):
            return _Est(base, lit_size=1, unbounded=unb)
        if fn == "_?_:_":
            cond, yes, no = a
            sizes = [self.size(yes), self.size(no)]
            return _Est(
                cond.cost + max(yes.cost, no.cost),
                lit_size=max(z.n for z in sizes),
                unbounded=unb + [u for z in sizes for u in z.unbounded],
            )
        if fn == "_+_" and any(x.is_string for x in a):
            # string concatenation: the result's size × 0.1 (cel-go AddString)
            sizes = [self.size(x) for x in a]
            n = sum(z.n for z in sizes)
            unb = unb + [u for z in sizes for u in z.unbounded]
            cost = _factor(n, STRING_TRAVERSAL_COST_FACTOR)
            return _Est(cost + base, lit_size=n, unbounded=unb, text=True)
        if fn == "_+_" and any((x.schema or {}).get("type") == "array" for x in a):
            raise UnsupportedRule("list concatenation has no cost formula here")
        if fn in ("!_", "-_", "_+_", "_-_", "_<_", "_<=_", "_>_", "_>=_"):
            # O(1) for numbers and booleans; string ordering walks the shorter string
            if fn in ("_<_", "_<=_", "_>_", "_>=_") and any(x.is_string for x in a):
                return self._compare(a, base, unb)
            return _Est(1 + base, lit_size=1, unbounded=unb)
        if fn in ("_==_", "_!=_"):
            return self._compare(a, base, unb)
        if fn == "@in":
            lst = self.size(a[1])
            cost = lst.n
            if self.conservative and a[1].schema is not None:
                items = _walk_cost(a[1].schema.get("items"), f"{a[1].path}[]")
                cost = lst.n * max(1, items.n)
                unb += items.unbounded
            return _Est(cost + base, lit_size=1, unbounded=unb + lst.unbounded)
        if fn in ("size", "type"):
            # cel-go: size() of a string/list/map and the type() conversion cost 1
            return _Est(1 + base, lit_size=1, unbounded=unb)
        if fn == "matches" and t is not None and len(a) == 1:
            s, r = self.size(t), self.size(a[0])
            str_cost = _factor(s.n + 1, STRING_TRAVERSAL_COST_FACTOR)
            regex_cost = _factor(r.n, REGEX_STRING_LENGTH_COST_FACTOR)
            return _Est(
                str_cost * regex_cost + base, lit_size=1, unbounded=unb + s.unbounded + r.unbounded
            )
        if fn == "contains" and t is not None and len(a) == 1:
            s, sub = self.size(t), self.size(a[0])
            cost = _factor(s.n, STRING_TRAVERSAL_COST_FACTOR) * _factor(
                sub.n, STRING_TRAVERSAL_COST_FACTOR
            )
            return _Est(cost + base, lit_size=1, unbounded=unb + s.unbounded + sub.unbounded)
        if fn in ("startsWith", "endsWith") and t is not None and len(a) == 1:
            sub = self.size(a[0])
            cost = _factor(sub.n, STRING_TRAVERSAL_COST_FACTOR)
            return _Est(cost + base, lit_size=1, unbounded=unb + sub.unbounded)
        raise UnsupportedRule(f"no cost formula for {fn}()")

    def _compare(self, a: list[_Est], base: int, unb: list[str]) -> _Est:
        """cel-go: ``min(size(lhs), size(rhs)) × 0.1``; conservative: the walk of the whole
        value when a side is a field (a list, map or object compared in full)."""
        lhs, rhs = self.size(a[0]), self.size(a[1])
        smallest = min(lhs.n, rhs.n)
        cost = _factor(smallest, STRING_TRAVERSAL_COST_FACTOR)
        unb = (
            unb
            + (lhs.unbounded if lhs.n <= rhs.n else [])
            + (rhs.unbounded if rhs.n <= lhs.n else [])
        )
        if self.conservative:
            walks = [_walk_cost(x.schema, x.path or "?") for x in a if x.schema is not None]
            if walks:
                w = min(walks, key=lambda w: w.n)
                cost = max(cost, w.n)
                unb = unb + w.unbounded
        return _Est(cost + base, lit_size=1, unbounded=unb)


@dataclass
class RuleCost:
    """One rule's estimate: where it sits, its cost per evaluation, how many times it can run
    in one object (``cardinality``) and the unbounded sizes it reads."""

    path: str  # dotted schema path of the node holding the rule ("" for the root)
    index: int
    rule: str
    cost: int
    cardinality: int
    unbounded: list[str]

    @property
    def total(self) -> int:
        return self.cost * self.cardinality

    @property
    def field(self) -> str:
        """The apiserver's field path of the rule inside a CRD's ``versions[0]`` schema."""
        names = {"[]": ".items", "*": ".additionalProperties"}
        parts = "".join(names.get(p, f".properties[{p}]") for p in self.path.split(".") if p)
        return f"openAPIV3Schema{parts}.x-kubernetes-validations[{self.index}].rule"


def _schema_nodes(schema: dict[str, Any], path: str = "", card: int = 1):
    """(path, node, cardinality) of every node; path segments ``[]`` (items), ``*`` (values)."""
    yield path, schema, card
    for name, sub in (schema.get("properties") or {}).items():
        yield from _schema_nodes(sub, f"{path}.{name}" if path else name, card)
    if isinstance(schema.get("items"), dict):
        n = schema.get("maxItems")
        n = int(n) if n is not None else UNBOUNDED // (_min_size(schema["items"]) + 1)
        yield from _schema_nodes(schema["items"], f"{path}.[]", card * n)
    if _is_map(schema):
        n = schema.get("maxProperties")
        n = (
            int(n)
            if n is not None
            else UNBOUNDED // (_min_size(schema["additionalProperties"]) + 6)
        )
        yield from _schema_nodes(schema["additionalProperties"], f"{path}.*", card * n)


def rule_costs(schema: dict[str, Any], *, conservative: bool = True) -> list[RuleCost]:
    """Every ``x-kubernetes-validations`` rule of an ``openAPIV3Schema`` with its estimated cost
    (see the module doc for the two modes); raises :class:`UnsupportedRule`."""
    out: list[RuleCost] = []
    for path, node, card in _schema_nodes(schema):
        rules = node.get("x-kubernetes-validations") or []
        if not rules:
            continue
        scope = _with_object_meta(node) if path == "" else node
        est = _Estimator(scope, path, conservative)
        for i, r in enumerate(rules):
            e = est.est(_Parser(r["rule"]).parse())
            unb = sorted(set(e.unbounded))
            out.append(RuleCost(path, i, r["rule"], e.cost, card, unb))
    return out


def crd_cost_errors(crd: dict[str, Any]) -> list[tuple[str, str]]:
    """What the apiserver says about a CRD's rule costs: ``(field, message)`` of each rule over
    :data:`STATIC_ESTIMATED_COST_LIMIT` and of a schema whose rules sum over
    :data:`STATIC_ESTIMATED_CRD_COST_LIMIT` (messages as in validation.go
    ``getCostErrorMessage``). Rules this module cannot estimate are left out (the sandbox's CEL
    skips what cel-python cannot run, likewise)."""
    errors: list[tuple[str, str]] = []
    for v, version in enumerate((crd.get("spec") or {}).get("versions") or []):
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or None
        if not isinstance(schema, dict):
            continue
        prefix = f"spec.versions[{v}].schema."
        costs: list[RuleCost] = []
        for path, node, card in _schema_nodes(schema):
            scope = _with_object_meta(node) if path == "" else node
            est = _Estimator(scope, path, conservative=False)
            for i, r in enumerate(node.get("x-kubernetes-validations") or []):
                try:
                    e = est.est(_Parser(str(r.get("rule", ""))).parse())
                except UnsupportedRule:
                    continue
                costs.append(RuleCost(path, i, r["rule"], e.cost, card, []))
        for c in costs:
            if c.total > STATIC_ESTIMATED_COST_LIMIT:
                errors.append(
                    (
                        prefix + c.field,
                        _cost_message("estimated rule cost", c.total, STATIC_ESTIMATED_COST_LIMIT),
                    )
                )
        total = sum(c.total for c in costs)
        if total > STATIC_ESTIMATED_CRD_COST_LIMIT:
            errors.append(
                (
                    prefix + "openAPIV3Schema",
                    _cost_message(
                        "x-kubernetes-validations estimated rule cost total for entire "
                        "OpenAPIv3 schema",
                        total,
                        STATIC_ESTIMATED_CRD_COST_LIMIT,
                    ),
                )
            )
    return errors


def _cost_message(name: str, cost: int, limit: int) -> str:
    """validation.go ``getCostErrorMessage``."""
    x = cost / limit
    factor = "more than 100x" if x > 100 else f"{x:f}x" if x < 1.5 else f"{x:.1f}x"
    return (
        f"{name} exceeds budget by factor of {factor} (try simplifying the rule, or adding "
        "maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )


def main(argv: list[str] | None = None) -> int:
    """Print each rule's cost: ``python -m npu_lora_sandbox.celcost [CRD.yaml]``."""
    import yaml

    args = sys.argv[1:] if argv is None else argv
    if args:
        with open(args[0], encoding="utf-8") as f:
            crd = next(d for d in yaml.safe_load_all(f) if d)
    else:
        from npu_lora_operator.crd import build_crd

        crd = build_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    static = {(c.path, c.index): c for c in rule_costs(schema, conservative=False)}
    rows = rule_costs(schema)
    print(f"{'bound':>9} {'static':>9} {'card':>5}  rule (at)")
    for c in rows:
        s = static[(c.path, c.index)]
        flag = f"  UNBOUNDED: {', '.join(c.unbounded)}" if c.unbounded else ""
        print(
            f"{c.cost:>9} {s.cost:>9} {c.cardinality:>5}  {c.path or '<root>'}: {c.rule[:90]}{flag}"
        )
    total = sum(c.total for c in rows)
    print(
        f"largest rule {max(c.total for c in rows)} (PerCallLimit {PER_CALL_LIMIT}, "
        f"StaticEstimatedCostLimit {STATIC_ESTIMATED_COST_LIMIT}); all rules {total} "
        f"(RuntimeCELCostBudget {RUNTIME_CEL_COST_BUDGET}, StaticEstimatedCRDCostLimit "
        f"{STATIC_ESTIMATED_CRD_COST_LIMIT})"
    )
    bad = [c for c in rows if c.unbounded or c.total > PER_CALL_LIMIT]
    return 1 if bad or total > RUNTIME_CEL_COST_BUDGET else 0


if __name__ == "__main__":
    raise SystemExit(main())
