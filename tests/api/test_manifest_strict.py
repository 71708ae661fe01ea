"""Duplicate keys and bounded ``--set`` paths (issue 28): an error naming key and line, never a
silent last-wins or a RecursionError traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from npu_lora.api.load import MAX_SET_DEPTH, SpecError, load_manifest

HEAD = "apiVersion: npu-lora.io/v1alpha1\nkind: MoEFinetune\nmetadata: {name: ok}\n"
SPEC = "spec:\n  model: {preset: tiny-qwen3-moe}\n  data: {path: 'example:nsmc-mini'}\n"


def _load(tmp_path: Path, text: str, name: str = "m.yaml", **kw) -> object:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return load_manifest(p, **kw)


@pytest.mark.parametrize(
    "text,key,line",
    [
        (HEAD + SPEC + "  training: {steps: 3}\n  training: {steps: 900}\n", "training", 8),
        (HEAD + "spec:\n  model: {preset: tiny-qwen3-moe, preset: qwen3-30b-a3b}\n", "preset", 5),
        (HEAD + SPEC + "  lora:\n    r: 4\n    alpha: 8\n    r: 64\n", "r", 10),
        ("kind: MoEFinetune\n" + HEAD + SPEC, "kind", 3),
        (HEAD + SPEC + "metadata: {name: b}\n", "metadata", 7),
    ],
)
def test_duplicate_yaml_keys_are_an_error_naming_key_and_line(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    with pytest.raises(SpecError) as e:
        _load(tmp_path, text)
    msg = str(e.value)
    assert f"duplicate key '{key}'" in msg and f"line {line}:" in msg, msg


def test_duplicate_json_keys_are_an_error(tmp_path: Path) -> None:
    text = (
        '{"apiVersion": "npu-lora.io/v1alpha1", "kind": "MoEFinetune", "metadata": {"name": "j"},'
        '\n "spec": {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "example:nsmc-mini"},'
        '\n  "image": "a", "image": "b"}}'
    )
    with pytest.raises(SpecError, match=r"line 3: duplicate key 'image' \(first at line 3"):
        _load(tmp_path, text, "m.json")


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    text = HEAD + SPEC + "  lora: &l {r: 4, alpha: 8}\n  checkpoint: {everySteps: 5}\n"
    text += "  moe:\n    placement: host-only\n"
    assert _load(tmp_path, text).spec.lora.r == 4
    merged = HEAD + "base: &b {r: 4}\n" + SPEC + "  lora: {<<: *b, r: 8}\n"
    with pytest.raises(SpecError, match="base"):  # an unknown top-level key, not a duplicate
        _load(tmp_path, merged)


def test_a_second_merge_key_is_a_duplicate_a_merge_list_is_not(tmp_path: Path) -> None:
    # `<<` twice: PyYAML keeps the first silently; refused like any repeated key
    text = HEAD + SPEC + "  lora:\n    <<: {r: 4}\n    <<: {r: 64}\n"
    with pytest.raises(SpecError, match=r"line 9: duplicate merge key '<<' \(first at line 8"):
        _load(tmp_path, text)
    from npu_lora.api import limits

    doc = limits.load_yaml_documents("a: &a {r: 4}\nb: &b {r: 8, alpha: 2}\nm: {<<: [*a, *b]}\n")
    assert doc[0]["m"] == {"r": 4, "alpha": 2}  # the YAML rule: the earlier mapping wins


def test_same_key_in_different_mappings_is_fine(tmp_path: Path) -> None:
    text = HEAD + SPEC + "  output: {path: a}\n  checkpoint: {everySteps: 2}\n"
    assert _load(tmp_path, text).spec.output.path == "a"


def test_duplicate_key_in_a_set_value(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="duplicate key 'r'"):
        _load(tmp_path, HEAD + SPEC, overrides=["lora={r: 4, r: 8}"])


@pytest.mark.parametrize(
    "override,needle",
    [
        (".".join(["a"] * 100_000) + "=1", "longer than"),
        (".".join(["a"] * (MAX_SET_DEPTH + 1)) + "=1", "deeper than"),
        ("x" * 10_000 + "=1", "longer than"),
    ],
)
def test_set_paths_are_bounded(tmp_path: Path, override: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as e:
        _load(tmp_path, HEAD + SPEC, overrides=[override])
    assert len(str(e.value)) < 400


def test_deep_set_path_through_the_cli_has_no_traceback(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text(HEAD + SPEC, encoding="utf-8")
    deep = ".".join(["a"] * 50_000) + "=1"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "npu_lora.cli",
            "run",
            str(p),
            "--set",
            deep,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr
    assert "longer than" in r.stderr


def test_deeply_nested_set_value_is_not_a_recursion_error(tmp_path: Path) -> None:
    value = "[" * 5000 + "]" * 5000
    with pytest.raises(SpecError):
        _load(tmp_path, HEAD + SPEC, overrides=[f"lora.targetModules={value}"])
    json.dumps({})  # (the loader left no broken state behind)
