"""``kubectl apply`` against the emulator: invalid run names are refused by the CRD's CEL rule
with the rule stated, and any mutated manifest is either created or refused naming a field
(Hypothesis; a short profile). No operator needed (issue 12)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from e2e_harness import Cluster, manifest, to_yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.e2e

NAME_RULE = "metadata.name must be a DNS-1123 label"


@pytest.mark.parametrize("name", ["my.dotted.run", "a" * 64])
def test_invalid_run_name_refused_by_cel(cluster: Cluster, name: str) -> None:
    r = cluster.kubectl("apply", "-f", "-", input=to_yaml(manifest(name)), check=False)
    text = r.stdout + r.stderr
    assert r.returncode != 0 and NAME_RULE in text, text
    assert cluster.kubectl("get", "mft", "-o", "name").stdout.strip() == ""
    ok = cluster.kubectl("apply", "-f", "-", input=to_yaml(manifest("my-dotted-run")), check=False)
    assert ok.returncode == 0, ok.stderr


PATHS = [
    ("lora", "r"),
    ("lora", "alpha"),
    ("moe", "placement"),
    ("moe", "hotFraction"),
    ("moe", "warmupSteps"),
    ("training", "steps"),
    ("training", "seqLen"),
    ("training", "learningRate"),
    ("device", "backend"),
    ("model", "path"),
    ("data",),
    ("resumeFrom",),
    ("bogus",),
]
finite = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.lists(st.integers(0, 9), max_size=3),
)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.sampled_from(PATHS), value=finite)
def test_any_applied_manifest_is_created_or_refused_naming_a_field(
    cluster: Cluster, path: tuple[str, ...], value: Any
) -> None:
    obj = copy.deepcopy(manifest("fuzz"))
    cur = obj["spec"]
    for k in path[:-1]:
        cur = cur.setdefault(k, {})
    cur[path[-1]] = value
    r = cluster.kubectl("apply", "-f", "-", input=to_yaml(obj), check=False)
    text = r.stdout + r.stderr
    if r.returncode == 0:
        assert cluster.mft("fuzz") is not None
        cluster.kubectl("delete", "mft", "fuzz", "--wait=true")
        return
    assert "Traceback" not in text
    assert cluster.mft("fuzz") is None, "a refused apply created the object"
    assert f"spec.{path[0]}" in text, text
