"""``compile-plan`` and ``precompile`` name the flag and the file for every bad input (exit 2,
no traceback): a model config that is a directory or not UTF-8 JSON, a cache that is a file."""

from __future__ import annotations

import pytest
from npu_lora.cli import main

SPEC = 'model: {preset: tiny-qwen3-moe}\ndata: {path: "example:nsmc-mini"}\n'


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("dir", "--model-config: {p}: Is a directory"),
        ("bytes", "--model-config: {p} is not UTF-8 JSON"),
        ("list", "--model-config: {p} is not a JSON object"),
    ],
)
def test_compile_plan_names_a_bad_model_config(tmp_path, capsys, case, needle):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    p = tmp_path / "cfg"
    if case == "dir":
        p.mkdir()
    elif case == "bytes":
        p.write_bytes(b"\xff\xfe{")
    else:
        p.write_text("[1, 2]")
    assert main(["compile-plan", str(spec), "--model-config", str(p)]) == 2
    err = capsys.readouterr().err
    assert needle.format(p=p) in err and "Traceback" not in err


def test_precompile_cache_that_is_a_file_exits_2(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC + "device: {backend: cpu, cards: 0}\n")
    f = tmp_path / "cache"
    f.write_text("keep")
    assert main(["precompile", str(spec), "--cache", str(f), "--index", "0"]) == 2
    assert f"--cache: {f} exists and is not a directory" in capsys.readouterr().err
    assert f.read_text() == "keep"
