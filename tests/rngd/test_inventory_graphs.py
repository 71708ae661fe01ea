"""The engine's device graphs (npu_lora.device.graphs) are RNGD-compile-friendly by inventory:
no int64 tensor op and no denylisted op, forward and backward; and they compute what the stock
transformers modules compute (their ``reference``). Pure torch: runs on the CPU torch of the
main venv and on furiosa's pinned torch 2.10 in the RNGD venv."""

from __future__ import annotations

import functools
import importlib.util

import pytest

torch = pytest.importorskip("torch")

from npu_lora.rngd.inventory import Inventory, inventory  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

if importlib.util.find_spec("npu_lora.device.graphs") is None:
    pytest.skip(
        "npu_lora/device/graphs.py (the device graphs) does not exist yet", allow_module_level=True
    )

SEQ = 32

# Graph/direction -> the one op known to fail, and why. Each entry has an xfail test below
# (non-strict, so fixing graphs.py does not break the suite: it shows as XPASS; then delete it).
KNOWN_FAILURES: dict[tuple[str, str], tuple[str, str]] = {
    # Fixed by the formulations graphs.py now uses (npu_lora.device.ops), guarded since:
    # ("attention", "backward"): fp32 aten._softmax_backward_data -> ops.softmax_rngd;
    # ("head", "forward"): aten.logsumexp -> ops.cross_entropy_int32 / logsumexp_rngd.
}


@functools.cache
def _graphs(dtype):
    from npu_lora.rngd.catalogue import device_graphs

    return device_graphs("tiny", SEQ, dtype=dtype)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def inventories(request) -> dict[tuple[str, str], Inventory]:
    out = {}
    for g in _graphs(request.param):
        for d, inv in inventory(g).items():
            out[(g.name, d)] = inv
    return out


def test_expected_graphs_exist(inventories):
    names = {name for name, _ in inventories}
    assert {"embed", "attention", "head"} <= names, names
    assert any(n.startswith("hot_experts") for n in names), names


def test_no_int64_no_denylisted_op(inventories):
    problems = []
    for key, inv in inventories.items():
        known = KNOWN_FAILURES.get(key)
        failed = inv.failed_ops()
        if known and failed == [known[0]]:
            continue  # a documented known failure (see KNOWN_FAILURES)
        if not inv.ok:
            problems.append(inv.summary())
    assert not problems, "\n".join(problems)


def test_every_graph_traced_both_directions(inventories):
    for (name, d), inv in inventories.items():
        if d == "forward" or name != "embed":  # embed has no trainable input: no backward
            assert inv.n_ops > 0, f"{name} {d}: nothing traced ({inv.notes})"
        assert inv.tracer == "aot", f"{name} {d}: {inv.notes}"


def _close(out, ref, tol):
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    refs = [t for t in tree_leaves(ref) if isinstance(t, torch.Tensor)]
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs, strict=True):
        torch.testing.assert_close(o.float(), r.float(), **tol)


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [
        (torch.float32, {"atol": 1e-5, "rtol": 1e-4}),
        (torch.bfloat16, {"atol": 3e-2, "rtol": 3e-2}),
    ],
    ids=["fp32", "bf16"],
)
def test_outputs_equal_stock_modules(dtype, tol):
    checked = []
    for g in _graphs(dtype):
        if g.reference is None:
            continue
        with torch.no_grad():
            out = g.module(*g.example_inputs)
            ref = g.reference(*g.example_inputs)
        _close(out, ref, tol)
        checked.append(g.name)
    assert {"embed", "attention", "head"} <= set(checked), checked


def test_index_inputs_are_int32():
    for g in _graphs(torch.float32):
        for i, t in enumerate(g.example_inputs):
            assert t.dtype != torch.int64, f"{g.name} input {i} is int64"
            assert not t.is_complex()
