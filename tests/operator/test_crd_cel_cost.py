"""The CRD's CEL rules within the apiserver's cost budget, by construction (issue 44).

A real apiserver estimates every ``x-kubernetes-validations`` rule's worst-case cost from the
schema when the CRD is applied and refuses the CRD when one rule, or all of them, exceed its
limits ("estimated rule cost exceeds budget"); an unbounded string, list or map counts as a whole
3 MiB request. The constants, read from the Kubernetes sources (see
:mod:`npu_lora_sandbox.celcost`):

- ``PerCallLimit`` = 1,000,000 (k8s.io/apiserver pkg/apis/cel/config.go): one evaluation;
- ``RuntimeCELCostBudget`` = 10,000,000 (same file): all rules of one object;
- ``MaxRequestSizeBytes`` = 3 MiB (same file): the size of an unbounded value;
- ``StaticEstimatedCostLimit`` = 10,000,000 and ``StaticEstimatedCRDCostLimit`` = 100,000,000
  (k8s.io/apiextensions-apiserver pkg/apis/apiextensions/validation/validation.go): what the
  apiserver enforces per rule and per CRD when the CRD is written;
- cel-go common/cost.go: ``StringTraversalCostFactor`` 0.1, ``RegexStringLengthCostFactor``
  0.25, ``SelectAndIdentCost`` 1.

Held here, more strictly than the apiserver: every rule's conservative bound (a comparison of
lists/maps/objects counted as a walk of the whole value) under ``PerCallLimit``, all of them
under ``RuntimeCELCostBudget``, no rule reading an unbounded value. ``pytest -s`` (or
``python -m npu_lora_sandbox.celcost``) prints each rule's cost.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from npu_lora_operator import crd as crd_mod
from npu_lora_operator.crd import BOUND_OVERRIDES, build_crd, openapi_schema
from npu_lora_sandbox import celcost
from npu_lora_sandbox.celcost import (
    MAX_REQUEST_SIZE_BYTES,
    PER_CALL_LIMIT,
    RUNTIME_CEL_COST_BUDGET,
    STATIC_ESTIMATED_COST_LIMIT,
    STATIC_ESTIMATED_CRD_COST_LIMIT,
    UnsupportedRule,
    rule_costs,
)


def test_the_constants_are_kubernetes_own() -> None:
    assert PER_CALL_LIMIT == 1_000_000 and RUNTIME_CEL_COST_BUDGET == 10_000_000
    assert MAX_REQUEST_SIZE_BYTES == 3 * 1024 * 1024
    assert STATIC_ESTIMATED_COST_LIMIT == 10_000_000
    assert STATIC_ESTIMATED_CRD_COST_LIMIT == 100_000_000


def _nodes(node: dict[str, Any], path: str):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}.*")


def test_every_string_list_and_map_in_spec_and_status_is_bounded() -> None:
    """metadata, apiVersion and kind are Kubernetes' (no bound may be set on metadata)."""
    schema = openapi_schema()
    unbounded = []
    for section in ("spec", "status"):
        for path, node in _nodes(schema["properties"][section], section):
            typ = node.get("type")
            if (typ == "string" or node.get("x-kubernetes-int-or-string")) and not (
                "maxLength" in node or "enum" in node
            ):
                unbounded.append(f"{path} (maxLength)")
            if typ == "array" and "maxItems" not in node:
                unbounded.append(f"{path} (maxItems)")
            if isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
                unbounded.append(f"{path} (maxProperties)")
    assert unbounded == []


def test_a_field_added_without_a_bound_gets_the_default_one() -> None:
    node = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "own": {"type": "string", "maxLength": 12},
            "sizes": {"type": "array", "items": {"type": "integer"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    crd_mod._bound(node, "spec.newSection")
    p = node["properties"]
    assert p["name"]["maxLength"] == crd_mod.DEFAULT_MAX_LENGTH
    assert "maxLength" not in p["mode"] and p["own"]["maxLength"] == 12
    assert p["sizes"]["maxItems"] == crd_mod.DEFAULT_MAX_ITEMS
    assert p["labels"]["maxProperties"] == crd_mod.DEFAULT_MAX_PROPERTIES
    assert p["labels"]["additionalProperties"]["maxLength"] == crd_mod.DEFAULT_MAX_LENGTH


def test_every_bound_override_names_a_field_of_the_schema() -> None:
    schema = openapi_schema()
    paths = {}
    for section in ("spec", "status"):
        paths.update(dict(_nodes(schema["properties"][section], section)))
    for path, bounds in BOUND_OVERRIDES.items():
        assert path in paths, path
        for key, value in bounds.items():
            assert paths[path][key] == value


def test_the_models_own_bounds_are_carried_over() -> None:
    spec = openapi_schema()["properties"]["spec"]["properties"]
    assert spec["podTemplate"]["properties"]["nodeSelector"]["maxProperties"] == 32
    assert spec["resources"]["properties"]["limits"]["maxProperties"] == 16
    assert spec["lora"]["properties"]["targetModules"]["maxItems"] == 64


def test_no_rule_reads_an_unbounded_value_and_each_is_within_the_limits(capsys) -> None:
    costs = rule_costs(openapi_schema())
    static = {(c.path, c.index): c.cost for c in rule_costs(openapi_schema(), conservative=False)}
    assert len(costs) >= 15
    with capsys.disabled():
        print(f"\n{'bound':>8} {'static':>8}  rule")
        for c in costs:
            print(
                f"{c.cost:>8} {static[(c.path, c.index)]:>8}  {c.path or '<root>'}: {c.rule[:70]}"
            )
    assert [(c.path, c.rule, c.unbounded) for c in costs if c.unbounded] == []
    for c in costs:
        assert static[(c.path, c.index)] <= c.cost  # the bound bounds the apiserver's estimate
        assert c.total <= PER_CALL_LIMIT < STATIC_ESTIMATED_COST_LIMIT, (c.path, c.rule, c.total)
    total = sum(c.total for c in costs)
    assert total <= RUNTIME_CEL_COST_BUDGET < STATIC_ESTIMATED_CRD_COST_LIMIT, total
    assert celcost.crd_cost_errors(build_crd()) == []


def test_the_estimate_follows_the_kubernetes_formulas() -> None:
    """By hand from cel-go checker/cost.go: ``s.matches(re)`` costs ceil((size(s)+1) × 0.1) ×
    ceil(len(re) × 0.25) plus 2 for ``self.s``; an unbounded string is 3 MiB − 2 bytes, a
    ``maxLength`` n string 4n bytes; ``x in list`` costs the list's maxItems."""
    rx = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # 31 characters → ceil(7.75) = 8
    rule = [{"rule": f"self.s.matches('{rx}')"}]

    def schema(s: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "properties": {"s": s}, "x-kubernetes-validations": rule}

    (c,) = rule_costs(schema({"type": "string"}))
    assert c.cost == -(-(MAX_REQUEST_SIZE_BYTES - 2 + 1) // 10) * 8 + 2 == 2_516_586
    assert c.unbounded == ["s"] and c.cost > PER_CALL_LIMIT
    (c,) = rule_costs(schema({"type": "string", "maxLength": 63}))
    assert c.cost == 26 * 8 + 2 and c.unbounded == []
    lst = {
        "type": "object",
        "properties": {
            "v": {"type": "string", "maxLength": 8},
            "vs": {"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 8}},
        },
        "x-kubernetes-validations": [{"rule": "self.v in self.vs"}],
    }
    (static,) = rule_costs(lst, conservative=False)
    assert static.cost == 16 + 2 + 2
    (bound,) = rule_costs(lst)
    assert bound.cost == 16 * 4 + 2 + 2  # each item compared: ceil(32 bytes × 0.1) = 4


def test_a_whole_section_compared_reaches_everything_in_it() -> None:
    """``self.x == oldSelf.x`` on an object: the apiserver charges almost nothing for it, the
    bound walks the whole value, so an unbounded list inside is caught."""
    section = {
        "type": "object",
        "properties": {"sizes": {"type": "array", "items": {"type": "integer"}}},
    }
    schema = {
        "type": "object",
        "properties": {"moe": section},
        "x-kubernetes-validations": [{"rule": "self.moe == oldSelf.moe"}],
    }
    (static,) = rule_costs(schema, conservative=False)
    (bound,) = rule_costs(schema)
    assert static.cost == 4 and static.unbounded == []
    assert bound.unbounded == ["moe.sizes"] and bound.cost > PER_CALL_LIMIT
    section["properties"]["sizes"]["maxItems"] = 64
    (bound,) = rule_costs(schema)
    assert bound.unbounded == [] and bound.cost == 1 + 64 + 4


def test_an_operation_without_a_cost_formula_is_an_error() -> None:
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self.all(x, x > 0)"}]}
    with pytest.raises(UnsupportedRule):
        rule_costs(schema)


def test_the_command_prints_each_rule_and_passes() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "npu_lora_sandbox.celcost"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "self.model == oldSelf.model" in r.stdout and "PerCallLimit 1000000" in r.stdout
    assert len(r.stdout.splitlines()) == len(rule_costs(openapi_schema())) + 2


def test_status_lists_hold_what_the_worker_writes() -> None:
    """The per-rank list holds the largest world the spec admits; a bound the worker could
    exceed would make its status patch fail."""
    from npu_lora.api.v1alpha1 import DistributedSpec

    def le(name: str) -> int:
        return next(m.le for m in DistributedSpec.model_fields[name].metadata if hasattr(m, "le"))

    status = openapi_schema()["properties"]["status"]["properties"]
    ranks = status["distributed"]["properties"]["rankComputeSeconds"]
    assert ranks["maxItems"] == le("workers") * le("ranks_per_worker")


def test_string_concatenation_and_ordering_walk_the_strings() -> None:
    """cel-go AddString: (size(a) + size(b)) × 0.1; string ``<``: min size × 0.1."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 10},
            "b": {"type": "string", "maxLength": 20},
        },
        "x-kubernetes-validations": [
            {"rule": "self.a + self.b == 'xy'"},
            {"rule": "self.a < self.b"},
        ],
    }
    concat, order = rule_costs(schema, conservative=False)
    assert concat.cost == 12 + 2 + 2 + 1  # ceil(120 × 0.1) + selects + ceil(min(120, 2) × 0.1)
    assert order.cost == 4 + 2 + 2  # ceil(min(40, 80) × 0.1) + selects
