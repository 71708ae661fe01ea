"""Hostile manifests: size, bytes, depth, alias bombs, non-finite numbers, run names (issue 12)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import yaml
from npu_lora.api import limits
from npu_lora.api.load import SpecError, load_manifest
from npu_lora.api.v1alpha1 import METADATA_CEL_RULES, dns_label_name, is_dns_label

GOOD = (
    "apiVersion: npu-lora.io/v1alpha1\nkind: MoEFinetune\nmetadata: {name: ok}\n"
    "spec:\n  model: {preset: tiny-qwen3-moe}\n  data: {path: 'example:nsmc-mini'}\n"
)


def _refused(tmp_path: Path, content: str | bytes, needle: str) -> str:
    p = tmp_path / "m.yaml"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as e:
        load_manifest(p)
    assert time.perf_counter() - t0 < 2.0
    text = str(e.value)
    assert text.startswith(str(p)), text
    assert needle in text, text
    return text


def test_random_bytes_name_the_file(tmp_path: Path) -> None:
    rnd = random.Random(0)
    _refused(tmp_path, bytes(rnd.randrange(256) for _ in range(4096)), "not")
    _refused(tmp_path, b"spec: \xff\xfe\n", "not UTF-8 text (byte 0xff at offset 6")


def test_deep_nesting_is_refused_fast(tmp_path: Path) -> None:
    _refused(tmp_path, "spec: " + "[" * 100_000 + "]" * 100_000 + "\n", "")
    block = "".join("  " * i + f"k{i}:\n" for i in range(70)) + "  " * 70 + "v: 1\n"
    _refused(tmp_path, block, "nested deeper than 64 levels")


def test_alias_bomb_is_refused_fast(tmp_path: Path) -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, cur in zip("abcdefghi", "bcdefghij", strict=True):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    bomb = GOOD + "  podTemplate:\n    affinity:\n" + "".join(f"      {x}\n" for x in lines)
    _refused(tmp_path, bomb, "once aliases are expanded (the node limit)")
    many = GOOD + "  podTemplate:\n    env:\n      - &e {name: A, value: b}\n"
    many += "".join("      - *e\n" for _ in range(limits.MAX_ALIASES + 1))
    _refused(tmp_path, many, "more than 100 YAML aliases")


def test_oversized_manifest(tmp_path: Path) -> None:
    _refused(tmp_path, GOOD + "# " + "x" * limits.MAX_MANIFEST_BYTES + "\n", "larger than")


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text(
        GOOD + "  podTemplate:\n    nodeSelector: &sel {zone: a}\n    affinity: {x: *sel}\n"
    )
    assert load_manifest(p).spec.pod_template.affinity == {"x": {"zone": "a"}}


@pytest.mark.parametrize(
    ("yaml_line", "field"),
    [
        ("lora: {alpha: .inf}", "spec.lora.alpha"),
        ("training: {maxGradNorm: .inf}", "spec.training.maxGradNorm"),
        ("training: {learningRate: .nan}", "spec.training.learningRate"),
        ("moe: {hotFraction: -.inf}", "spec.moe.hotFraction"),
        ("reporting: {minIntervalSeconds: .inf}", "spec.reporting.minIntervalSeconds"),
        (
            "podTemplate: {tolerations: [{key: k, tolerationSeconds: .nan}]}",
            "spec.podTemplate.tolerations[0].tolerationSeconds",
        ),
    ],
)
def test_nonfinite_numbers_are_refused_with_the_field(
    tmp_path: Path, yaml_line: str, field: str
) -> None:
    text = _refused(tmp_path, GOOD + "  " + yaml_line + "\n", field)
    assert "finite number" in text


def test_nonfinite_override_is_refused() -> None:
    base = {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "example:nsmc-mini"}}
    with pytest.raises(SpecError, match=r"spec\.lora\.alpha: .*finite"):
        load_manifest(base, ["lora.alpha=.inf"])


@pytest.mark.parametrize("name", ["my.dotted.run", "Upper", "-x", "x-", "a" * 64, "a_b"])
def test_invalid_run_names_are_refused(tmp_path: Path, name: str) -> None:
    assert not is_dns_label(name)
    doc = yaml.safe_load(GOOD)
    doc["metadata"]["name"] = name
    text = _refused(tmp_path, yaml.safe_dump(doc), "metadata.name: must be a DNS-1123 label")
    assert repr(name)[:20] in text


def test_default_name_from_the_file_stem_is_made_valid(tmp_path: Path) -> None:
    p = tmp_path / "My_Run.v2.yaml"
    p.write_text("model: {preset: tiny-qwen3-moe}\ndata: {path: 'example:nsmc-mini'}\n")
    assert load_manifest(p).metadata.name == "my-run-v2"
    assert dns_label_name("___") == "run" and is_dns_label(dns_label_name("x" * 100))


def test_name_cel_rule_agrees_with_the_python_check() -> None:
    pytest.importorskip("celpy")
    import re

    import celpy
    from npu_lora.api.v1alpha1 import DNS_SUBDOMAIN_PATTERN

    (rule,) = METADATA_CEL_RULES
    env = celpy.Environment()
    prog = env.program(env.compile(rule["rule"]))
    for name in ["ok-run", "a", "a" * 63, "my.dotted.run", "Upper", "-x", "a" * 64, "9lives"]:
        obj = celpy.json_to_cel({"metadata": {"name": name}})
        # the apiserver holds every custom resource's name to a DNS-1123 subdomain first
        subdomain = len(name) <= 253 and re.fullmatch(DNS_SUBDOMAIN_PATTERN, name) is not None
        assert (subdomain and bool(prog.evaluate({"self": obj}))) == is_dns_label(name), name
