"""Invalid manifests are rejected by the server (schema, strict field validation, CEL) with the
field named, and nothing is created or changed. No operator needed."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from e2e_harness import Cluster, manifest, to_yaml

pytestmark = pytest.mark.e2e


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    cur = obj["spec"]
    *head, last = path.split(".")
    for k in head:
        cur = cur.setdefault(k, {})
    if value is _DELETE:
        cur.pop(last, None)
    else:
        cur[last] = value
    return obj


_DELETE = object()

CASES = [
    # (what, path, value, text the error must contain)
    ("type", "lora.r", "eight", "spec.lora.r"),
    ("bound", "training.seqLen", 4, "spec.training.seqLen"),
    ("bound", "moe.hotFraction", 1.5, "spec.moe.hotFraction"),
    ("enum", "moe.placement", "gpu", "spec.moe.placement"),
    ("enum", "device.backend", "tpu", "spec.device.backend"),
    ("unknown field", "lora.rank", 8, "rank"),
    ("unknown field", "trainig", {"steps": 3}, "trainig"),
    ("cross-field CEL", "moe.warmupSteps", 50, "warmupSteps"),
    ("CEL one-of", "model.path", "/models/x", "exactly one of path or preset"),
    ("required", "data", _DELETE, "spec.data"),
    ("pattern", "benchmark", {"variants": ["hot+fast"]}, "spec.benchmark.variants[0]"),
    ("bound", "benchmark", {"rounds": 0}, "spec.benchmark.rounds"),
    ("min items", "benchmark", {"seqLens": []}, "spec.benchmark.seqLens"),
    ("enum", "benchmark", {"hostDtypes": ["float16"]}, "spec.benchmark.hostDtypes[0]"),
    ("CEL", "benchmark", {"baseline": "peer"}, "baseline must be one of the variants"),
]


def test_invalid_manifests_rejected(cluster: Cluster) -> None:
    base = manifest("bad")
    failures = []
    for what, path, value, needle in CASES:
        obj = _set(base, path, value)
        r = cluster.kubectl("apply", "-f", "-", input=to_yaml(obj), check=False)
        text = r.stdout + r.stderr
        if r.returncode == 0 or needle not in text:
            failures.append(f"{what} {path}={value!r}: rc={r.returncode}: {text.strip()}")
        assert cluster.mft("bad") is None, f"{what}: object was created"
    assert not failures, "\n".join(failures)
    assert cluster.kubectl("get", "mft", "-o", "name").stdout.strip() == ""
    assert cluster.emulator.list("batch/v1", "Job", namespace="default") == []


def test_immutable_fields_and_mutable_ones(cluster: Cluster) -> None:
    obj = manifest("edit")
    cluster.apply(obj)
    before = cluster.mft("edit")
    assert before is not None
    # defaults were applied by the server
    assert before["spec"]["lora"]["alpha"] == 32 and before["spec"]["moe"]["hotFraction"] == 0.25
    assert "keepGraph" not in before["spec"]["moe"]  # an optional boolean: omitted means auto
    for path, value in [
        ("training.steps", 99),
        ("lora.r", 8),
        ("model.preset", "qwen3-30b-a3b"),
        ("data.path", "example:jsonl-mini"),
        ("moe.placement", "host-only"),
    ]:
        r = cluster.kubectl("apply", "-f", "-", input=to_yaml(_set(obj, path, value)), check=False)
        assert r.returncode != 0, f"{path}: accepted"
        assert "immutable" in r.stderr, r.stderr
    after = cluster.mft("edit")
    assert after is not None and after["spec"] == before["spec"]
    # mutable fields can change
    changed = _set(_set(obj, "reporting.everySteps", 5), "suspend", True)
    cluster.apply(changed)
    now = cluster.mft("edit")
    assert now is not None
    assert now["spec"]["reporting"]["everySteps"] == 5 and now["spec"]["suspend"] is True
    # kubectl patch of an immutable field is rejected as well
    r = cluster.kubectl(
        "patch",
        "mft",
        "edit",
        "--type",
        "merge",
        "-p",
        '{"spec":{"training":{"seqLen":64}}}',
        check=False,
    )
    assert r.returncode != 0 and "immutable" in r.stderr
