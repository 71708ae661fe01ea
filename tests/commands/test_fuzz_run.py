"""Property-based tests (Hypothesis) of ``npu-lora run`` over manifests and data files.

For any input, ``main(["run", FILE, ...])`` either gets as far as building the engine (the input
was accepted: here the engine seam raises :class:`WouldRun` so nothing trains) or returns exit
code 2 with one ``npu-lora run: error:`` message that names the file or a field; never a
traceback, never another exit code, and nothing is written before the engine is built.

The default profile keeps the whole module to a few tens of seconds on 2 cores; the ``slow``
test runs the same properties with many more examples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR
from npu_lora.cli import main

BASE: dict[str, Any] = {
    "apiVersion": "npu-lora.io/v1alpha1",
    "kind": "MoEFinetune",
    "metadata": {"name": "fuzz"},
    "spec": {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:nsmc-mini"},
        "lora": {"r": 4, "alpha": 8.0},
        "moe": {"placement": "hot", "warmupSteps": 1},
        "training": {"steps": 2, "seqLen": 32, "batchSize": 1, "maxGradNorm": 1.0},
        "device": {"backend": "cpu", "cards": 0},
        "podTemplate": {"tolerations": [{"key": "k", "operator": "Exists"}]},
    },
}
#: where a mutation may land (the fields a user sets, and a few structural spots)
PATHS = [
    ("metadata", "name"),
    ("spec", "model"),
    ("spec", "model", "preset"),
    ("spec", "model", "layers"),
    ("spec", "data", "path"),
    ("spec", "data", "format"),
    ("spec", "data", "maxExamples"),
    ("spec", "lora", "r"),
    ("spec", "lora", "alpha"),
    ("spec", "lora", "dropout"),
    ("spec", "lora", "targetModules"),
    ("spec", "moe", "placement"),
    ("spec", "moe", "hotFraction"),
    ("spec", "moe", "warmupSteps"),
    ("spec", "moe", "bucketSizes"),
    ("spec", "training", "steps"),
    ("spec", "training", "seqLen"),
    ("spec", "training", "batchSize"),
    ("spec", "training", "learningRate"),
    ("spec", "training", "maxGradNorm"),
    ("spec", "device", "backend"),
    ("spec", "output"),
    ("spec", "checkpoint", "everySteps"),
    ("spec", "podTemplate", "tolerations"),
    ("spec", "podTemplate", "env"),
    ("spec", "resumeFrom"),
    ("spec", "unknownField"),
    ("spec",),
]

scalars = st.one_of(
    st.integers(min_value=1, max_value=8),
    st.floats(min_value=0.01, max_value=1.0),
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "example:nsmc-mini", "hot", "cpu", "../../etc/passwd", "q_proj"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


class WouldRun(BaseException):
    """The input was accepted: the engine would be built now."""


@pytest.fixture
def accept_engine(monkeypatch):
    import npu_lora.commands.run as run_cmd

    def build_engine(spec, vocab_size):
        raise WouldRun

    monkeypatch.setattr(run_cmd, "build_engine", build_engine)
    monkeypatch.setenv("NPU_LORA_MEMORY_LIMIT", "none")


def _event(outcome: str) -> None:
    if currently_in_test_context():  # --hypothesis-show-statistics shows the outcome shares
        event(outcome)


def _check(file: Path, capsys, *extra: str) -> str:
    """Run the CLI on ``file``; assert the property; return "ran" or "refused"."""
    out = file.parent / "out" / "run"
    try:
        code = main(["run", str(file), "--out", str(out), "--quiet", "--no-plot", *extra])
    except WouldRun:
        code = None
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    if code is None:
        assert not out.exists(), "nothing is written before the engine is built"
        _event("ran")
        return "ran"
    assert code == EXIT_CONFIG_ERROR, err
    assert not out.exists(), "a refused run writes nothing"
    (line,) = [x for x in err.splitlines() if x.startswith("npu-lora run: error:")]
    text = err[err.index(line) :]
    named = str(file) in text or "spec." in text or "metadata." in text or "--out" in text
    assert named, err
    _event("refused")
    return "refused"


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    cur = doc
    for k in path[:-1]:
        if not isinstance(cur.get(k), dict):
            cur[k] = {}
        cur = cur[k]
    cur[path[-1]] = value


def _dump(doc: Any) -> str:
    # YAML spells NaN/inf as .nan/.inf; yaml.safe_dump does that for floats
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


PROFILE = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
SLOW = settings(PROFILE, max_examples=400, derandomize=False)


def _mutated_manifest(tmp_path_factory, capsys, mutations) -> str:
    doc = json.loads(json.dumps(BASE))
    for path, value in mutations:
        _set(doc, path, value)
    f = tmp_path_factory.mktemp("m") / "m.yaml"
    f.write_text(_dump(doc), encoding="utf-8")
    return _check(f, capsys)


mutation_lists = st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=3)


@PROFILE
@given(mutations=mutation_lists)
def test_any_mutated_manifest_runs_or_is_refused(
    mutations, tmp_path_factory, capsys, accept_engine
):
    _mutated_manifest(tmp_path_factory, capsys, mutations)


@PROFILE
@given(data=st.binary(max_size=2048))
def test_any_bytes_as_a_manifest_are_refused_naming_the_file(
    data, tmp_path_factory, capsys, accept_engine
):
    f = tmp_path_factory.mktemp("b") / "m.yaml"
    f.write_bytes(data)
    assert _check(f, capsys) == "refused"


YAML_TOKENS = [*"ab:-[]{}&*!|>'\"#,. \n\t0123456789", "\n  ", ".inf", ".nan", "~", "spec", "<<"]
yaml_ish = st.lists(st.sampled_from(YAML_TOKENS), max_size=120).map("".join)


@PROFILE
@given(text=yaml_ish)
def test_any_yaml_ish_text_is_handled(text, tmp_path_factory, capsys, accept_engine):
    f = tmp_path_factory.mktemp("y") / "m.yaml"
    f.write_text(text, encoding="utf-8")
    _check(f, capsys)


plain = st.text(st.characters(blacklist_characters="\t\n\r", codec="utf-8"), max_size=30)
valid_row = st.builds(
    lambda i, d, lab: f"{i}\t{d}\t{lab}", st.integers(0, 10**6), plain, st.sampled_from("01")
)
data_lines = st.lists(
    st.one_of(
        valid_row,
        valid_row,
        st.text(max_size=60),
        st.builds(
            lambda i, d, lab: f"{i}\t{d}\t{lab}",
            st.integers(),
            st.text(max_size=30),
            st.sampled_from(["0", "1", "2", "", "x"]),
        ),
        st.builds(json.dumps, st.fixed_dictionaries({"text": plain})),
        st.builds(
            json.dumps,
            st.dictionaries(st.sampled_from(["text", "prompt", "completion", "x"]), values),
        ),
    ),
    min_size=1,
    max_size=8,
)


@PROFILE
@given(
    lines=st.one_of(st.lists(valid_row, min_size=1, max_size=8), data_lines),
    header=st.booleans(),
    fmt=st.sampled_from(["nsmc", "jsonl", "auto"]),
    raw=st.one_of(st.none(), st.binary(max_size=200)),
)
def test_any_data_file_runs_or_is_refused(
    lines, header, fmt, raw, tmp_path_factory, capsys, accept_engine
):
    d = tmp_path_factory.mktemp("d")
    data = d / ("data.jsonl" if fmt == "jsonl" else "data.tsv")
    if raw is not None:
        data.write_bytes(raw)
    else:
        text = ("id\tdocument\tlabel\n" if header else "") + "\n".join(lines) + "\n"
        data.write_text(text, encoding="utf-8")
    doc = json.loads(json.dumps(BASE))
    doc["spec"]["data"] = {"path": str(data), "format": fmt}
    f = d / "m.yaml"
    f.write_text(_dump(doc), encoding="utf-8")
    _check(f, capsys)


@pytest.mark.slow
@SLOW
@given(mutations=mutation_lists)
def test_any_mutated_manifest_many_examples(mutations, tmp_path_factory, capsys, accept_engine):
    _mutated_manifest(tmp_path_factory, capsys, mutations)


def test_the_base_manifest_is_accepted(tmp_path, capsys, accept_engine):
    f = tmp_path / "m.yaml"
    f.write_text(_dump(BASE), encoding="utf-8")
    assert _check(f, capsys) == "ran"
