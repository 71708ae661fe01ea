"""The pure-torch op-inventory tracer: it passes compile-friendly graphs and DOES flag what RNGD
rejects (int64 tensor ops, denylisted ops), forward and backward. Runs on any torch >= 2.10."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from npu_lora.commands import rngd_check  # noqa: E402
from npu_lora.rngd import check  # noqa: E402
from npu_lora.rngd.inventory import capture, check_op, inventory  # noqa: E402

from .conftest import STANDINS_PATH  # noqa: E402


def _rules(inv) -> set[tuple[str, str]]:
    return {(v.op, v.rule) for v in inv.violations}


def _by_name(graphs, name):
    return next(g for g in graphs if g.name == name)


def test_package_imports_without_torch_or_furiosa():
    code = "import sys, npu_lora.rngd; assert 'torch' not in sys.modules; assert 'furiosa' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("mode", ["aot", "eager"])
def test_good_standins_pass(standins, mode):
    for g in standins.device_graphs():
        invs = inventory(g, mode=mode)
        for d in ("forward", "backward"):
            assert invs[d].ok, invs[d].summary()
            assert invs[d].n_ops > 0, f"{g.name} {d} traced nothing"
            assert invs[d].tracer == mode


def test_attention_standin_traces_bf16_softmax_backward(standins):
    attn = _by_name(standins.device_graphs(), "attention")
    bwd = inventory(attn)["backward"]
    stat = bwd.ops["aten._softmax_backward_data.default"]
    assert stat.out_dtypes == {"bfloat16"}
    assert "aten.mm.default" in bwd.ops or "aten.bmm.default" in bwd.ops


@pytest.mark.parametrize("mode", ["aot", "eager"])
def test_flags_int64_and_denylisted_ops(standins, mode):
    bad = {g.name: g for g in standins.bad_graphs()}

    fwd = inventory(bad["bad_routing"], mode=mode)["forward"]
    assert not fwd.ok
    rules = _rules(fwd)
    assert ("aten.argmax.default", "denylist") in rules
    assert ("aten.argmax.default", "int64") in rules
    assert ("aten.cumsum.default", "denylist") in rules
    assert ("aten.floor_divide.default", "denylist") in rules
    assert any(op.startswith("aten.arange") and rule == "int64" for op, rule in rules)

    invs = inventory(bad["int64_only"], mode=mode)
    rules = _rules(invs["forward"])
    # The only problems are int64: the index input and the int64 add / embedding.
    assert {rule for _, rule in rules} == {"input", "int64"}
    assert ("aten.add.Tensor", "int64") in rules
    assert ("aten.embedding_dense_backward.default", "int64") in _rules(invs["backward"])


def test_flags_sdpa_and_fp32_softmax_backward(standins):
    sdpa = _by_name(standins.bad_graphs(), "sdpa_attention")
    invs = inventory(sdpa)
    assert any("scaled_dot_product" in op for op, _ in _rules(invs["forward"])), invs[
        "forward"
    ].summary()
    assert ("aten._softmax_backward_data.default", "denylist") in _rules(invs["backward"])


def test_check_op_rules():
    f32, bf16, i64, i32 = torch.float32, torch.bfloat16, torch.int64, torch.int32
    assert check_op("aten.mm.default", [bf16, bf16], [bf16]) == []
    assert check_op("aten.embedding.default", [bf16, i32], [bf16]) == []
    assert [r for r, _ in check_op("aten.add.Tensor", [i64], [i64])] == ["int64"]
    assert [r for r, _ in check_op("aten.max.dim", [f32], [f32, i64])] == ["denylist", "int64"]
    assert check_op("aten.amax.default", [f32], [f32]) == []
    assert [r for r, _ in check_op("aten.sort.default", [f32], [f32, i32])] == ["denylist"]
    assert [r for r, _ in check_op("aten._grouped_mm.default", [bf16], [bf16])] == ["denylist"]
    # index_put only with accumulate
    assert check_op("aten.index_put.default", [f32, i32, f32], [f32], ("s", "i", "v", False)) == []
    put = check_op("aten.index_put.default", [f32, i32, f32], [f32], ("s", "i", "v", True))
    assert [r for r, _ in put] == ["denylist"]
    put_kw = check_op("aten.index_put_.default", [f32], [f32], (), {"accumulate": True})
    assert [r for r, _ in put_kw] == ["denylist"]
    # softmax backward: fp32 fails, bf16 compiles
    assert check_op("aten._softmax_backward_data.default", [bf16, bf16], [bf16]) == []
    assert check_op("aten._softmax_backward_data.default", [f32, f32], [f32])
    assert [r for r, _ in check_op("aten.mul.Tensor", [torch.complex64], [torch.complex64])] == [
        "complex"
    ]
    assert check_op("aten._scaled_dot_product_flash_attention_for_cpu.default", [f32], [f32])


def test_index_put_accumulate_traced():
    """A scatter-add written as ``x.index_put_(..., accumulate=True)`` is caught in a trace."""

    class Scatter(torch.nn.Module):
        def forward(self, x, idx, v):
            return x.clone().index_put_((idx,), v, accumulate=True)

    g = type("G", (), {})()
    g.name, g.module, g.trainable = "scatter", Scatter(), [0, 2]
    g.example_inputs = (
        torch.zeros(6, 3),
        torch.tensor([0, 2, 2], dtype=torch.int32),
        torch.ones(3, 3),
    )
    fwd = inventory(g)["forward"]
    assert any(v.rule == "denylist" and "index_put" in v.op for v in fwd.violations), fwd.summary()


def test_capture_grads_match_eager(standins):
    """The AOT-captured forward/backward compute what eager autograd computes."""
    for g in standins.device_graphs():
        aot, eager = capture(g, mode="aot"), capture(g, mode="eager")
        assert aot.tracer == "aot", aot.notes
        assert aot.wrt == eager.wrt and aot.wrt
        for a, e in zip(aot.outputs, eager.outputs, strict=True):
            torch.testing.assert_close(a, e)
        for w in aot.wrt:
            torch.testing.assert_close(aot.grads[w], eager.grads[w], msg=f"{g.name} {w}")
        # The captured backward graph reproduces the gradients from its own inputs.
        outs = aot.bw(*aot.bw_args)
        assert len(outs) == len(aot.wrt)


def test_standin_attention_matches_reference(standins):
    attn = _by_name(standins.device_graphs(dtype=torch.float32), "attention")
    with torch.no_grad():
        out = attn.module(*attn.example_inputs)
        ref = attn.reference(*attn.example_inputs)
    for o, r in zip(out, ref, strict=True):
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)


# ---- rngd-check, inventory tier (no furiosa needed) --------------------------------------------


def test_check_inventory_tier_passes_good_graphs(tmp_path, capsys):
    out = tmp_path / "inv.json"
    rc = rngd_check.main(
        ["--tier", "inventory", "--source", f"{STANDINS_PATH}:device_graphs", "--seq-len", "16",
         "--json", str(out)]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["ok"] is True
    assert {(r["graph"], r["direction"]) for r in doc["rows"]} >= {
        ("attention", "forward"),
        ("attention", "backward"),
    }
    table = capsys.readouterr().out
    assert "attention" in table and "inventory" in table


def test_check_inventory_tier_fails_bad_graphs(tmp_path, capsys):
    rc = rngd_check.main(
        ["--tier", "inventory", "--source", f"{STANDINS_PATH}:bad_device_graphs",
         "--graphs", "bad_routing", "--directions", "forward", "--json", str(tmp_path / "b.json")]
    )  # fmt: skip
    assert rc == 1
    row = json.loads((tmp_path / "b.json").read_text())["rows"][0]
    assert not row["ok"] and "aten.argmax.default" in row["failed_ops"]
    assert "FAIL" in capsys.readouterr().out


def test_check_unknown_source_or_graph_is_usage_error():
    assert rngd_check.main(["--tier", "inventory", "--source", "no_such_module_xyz:f"]) == 2
    bad = ["--tier", "inventory", "--source", f"{STANDINS_PATH}:device_graphs", "--graphs", "nope"]
    assert rngd_check.main(bad) == 2


@pytest.mark.skipif(check.furiosa_available(), reason="furiosa-torch is installed here")
def test_check_compile_tiers_without_furiosa_exit_2(capsys):
    rc = rngd_check.main(
        ["--tier", "probe", "--source", f"{STANDINS_PATH}:device_graphs", "--seq-len", "16"]
    )
    assert rc == 2
    assert "rngd-env.sh" in capsys.readouterr().err


def test_compiler_scratch_owns_and_removes_its_dirs(tmp_path):
    before = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "TMPDIR")}
    with check.compiler_scratch(None) as scratch:
        assert os.environ["TMPDIR"].startswith(str(scratch))
        assert os.environ["XDG_CACHE_HOME"].startswith(str(scratch))
        assert tempfile.gettempdir() == os.environ["TMPDIR"]
    assert not scratch.exists()
    assert {k: os.environ.get(k) for k in before} == before
    keep = tmp_path / "cache"
    with check.compiler_scratch(keep) as scratch:
        assert os.environ["XDG_CACHE_HOME"] == str(keep.resolve())
        (Path(os.environ["XDG_CACHE_HOME"]) / "x").write_text("kept")
    assert (keep / "x").exists() and not scratch.exists()


def test_format_table():
    rows = [
        check.Row(
            "attention", "forward", "compile", ok=True, ops=12, seconds=3.21, peak_rss_mb=900
        ),
        check.Row(
            "lm_head", "backward", "probe", ok=False, ops=5, failed_ops=["aten.sort.default"]
        ),
    ]
    text = check.format_table(rows)
    assert "FAIL" in text and "sort.default" in text and "3.2" in text and "900" in text
