"""``spec.device.precompile`` (issue 44): YAML booleans, omitted meaning auto; the retired
string form and a precompile without ``device.compileCache`` are refused with messages naming
what to write, by ``npu-lora run`` (exit 2) as by the CRD's schema and CEL."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from npu_lora.api.load import SpecError, load_manifest
from npu_lora.api.v1alpha1 import DeviceSpec
from testkit import run_cli, tiny_manifest

CACHE = {"claimName": "graphs"}


@pytest.mark.parametrize(
    ("text", "want", "enabled"),
    [
        ("precompile: true", True, True),
        ("precompile: false", False, False),
        ("", None, False),  # omitted: auto, off on cpu
    ],
)
def test_yaml_booleans_and_omitted_is_auto(tmp_path: Path, text, want, enabled) -> None:
    p = tiny_manifest(tmp_path)
    p.write_text(
        p.read_text().replace(
            "  device:\n", f"  device:\n    compileCache: {{claimName: graphs}}\n    {text}\n"
        )
    )
    device = load_manifest(p).spec.device
    assert device.precompile is want
    assert device.precompile_enabled is enabled


def test_omitted_is_on_for_furiosa() -> None:
    assert DeviceSpec(backend="furiosa", cards=1, compile_cache=CACHE).precompile_enabled
    assert not DeviceSpec(backend="furiosa", cards=1, precompile=False).precompile_enabled


@pytest.mark.parametrize(
    ("old", "hint"),
    [
        ('"true"', "write precompile: true without quotes"),
        ('"false"', "write precompile: false without quotes"),
        ('"auto"', "omit the field for auto"),
        ("'yes'", "write precompile: true or precompile: false, or omit it for auto"),
    ],
)
def test_the_string_form_is_refused_naming_the_new_form(tmp_path: Path, old, hint) -> None:
    p = tiny_manifest(tmp_path, device={"compileCache": CACHE})
    p.write_text(p.read_text().replace("  device:\n", f"  device:\n    precompile: {old}\n"))
    with pytest.raises(SpecError) as e:
        load_manifest(p)
    msg = str(e.value)
    assert "device.precompile is a YAML boolean now" in msg and hint in msg, msg


def test_precompile_without_a_cache_is_refused_naming_compile_cache(tmp_path: Path) -> None:
    p = tiny_manifest(tmp_path, device={"precompile": True})
    with pytest.raises(SpecError) as e:
        load_manifest(p)
    assert "device.compileCache" in str(e.value)
    # false (or auto) needs no cache
    load_manifest(tiny_manifest(tmp_path, "f", device={"precompile": False}))


def test_npu_lora_run_exits_2_naming_the_field(tmp_path: Path) -> None:
    p = tiny_manifest(tmp_path, device={"precompile": True})
    r = run_cli("run", str(p), "--out", str(tmp_path / "out"), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "device.compileCache" in r.stderr and "Traceback" not in r.stderr
    q = tiny_manifest(tmp_path, "s", device={"precompile": "true", "compileCache": CACHE})
    r = run_cli("run", str(q), "--out", str(tmp_path / "out2"), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "write precompile: true without quotes" in r.stderr


# -- the same refusals on the server (CRD schema + CEL, through the emulator's admission) -----

schema_mod = pytest.importorskip("npu_lora_sandbox.schema")


def _server_causes(device: dict) -> list[str]:
    from npu_lora_operator.crd import openapi_schema

    schema = openapi_schema()
    obj = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "p"},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:nsmc-mini"},
            "device": copy.deepcopy(device),
        },
    }
    schema_mod.prune(obj, schema)
    schema_mod.apply_defaults(obj, schema)
    return [str(c) for c in schema_mod.validate(obj, schema)]


def test_the_crd_takes_booleans_and_refuses_strings_and_a_missing_cache() -> None:
    assert _server_causes({"precompile": True, "compileCache": CACHE}) == []
    assert _server_causes({"precompile": False}) == []
    assert _server_causes({}) == []
    causes = _server_causes({"precompile": "true", "compileCache": CACHE})
    assert causes == [
        'spec.device.precompile: Invalid value: "string": spec.device.precompile in body '
        'must be of type boolean: "string"'
    ]
    causes = _server_causes({"precompile": True})
    assert len(causes) == 1 and causes[0].startswith("spec.device.precompile: Invalid value")
    assert "device.compileCache" in causes[0]
