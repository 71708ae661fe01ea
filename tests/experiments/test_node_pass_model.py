"""experiments/node-pass/model.py: the additive model of the shared expert pass is fitted to the
1-rank variant only, and predicts the 2-rank variants from it (issue 30, item 5)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parents[2] / "experiments" / "node-pass" / "model.py"


@pytest.fixture(scope="module")
def model():
    spec = importlib.util.spec_from_file_location("_node_pass_model", MODEL)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(model, tmp: Path, S: int, bw: float, p: float, shared_extra: float = 1.0) -> str:
    """A bench output whose variants follow the additive form exactly (shared: times a factor)."""
    times = {
        "one": model.step(1, S, bw, p, 2, True, True),
        "shared": model.step(2, S, bw, p, 2, True, True) * shared_extra,
        "separate": model.step(2, S, bw, p, 2, False, True),
    }
    rows = []
    for rnd in range(3):
        for v, t in times.items():
            for rank in range(1 if v == "one" else 2):
                for st in range(2):
                    rows.append(
                        {"variant": v, "rank": rank, "step": st, "round": rnd, "total_s": t}
                    )
    lim = {"read_gbs": 50.0, "kernel_gflops": 500.0, "kernel_T": 1024}
    rows.append({"limits": lim, "S": S, "cores": 2})
    path = tmp / f"s{S}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_fit_recovers_the_stream_and_compute_rates_from_the_one_rank_variant(model, tmp_path):
    bw, p = 41e9, 760e9
    runs = [model.load(_run(model, tmp_path, S, bw, p)) for S in (32, 64, 128, 256)]
    bw_s, p_s = model.fit(runs)
    assert bw_s == pytest.approx(bw, rel=1e-6)
    assert p_s == pytest.approx(p, rel=1e-6)


def test_the_fit_ignores_the_two_rank_variants(model, tmp_path):
    # a pass that costs 30 % more changes the measured shared times, not the fitted rates
    bw, p = 41e9, 760e9
    runs = [model.load(_run(model, tmp_path, S, bw, p, shared_extra=1.3)) for S in (64, 128)]
    assert model.fit(runs) == pytest.approx((bw, p), rel=1e-6)


def test_one_tokens_per_rank_cannot_be_fitted_and_prints_the_bound_only(model, tmp_path, capsys):
    path = _run(model, tmp_path, 128, 41e9, 760e9)
    assert model.fit([model.load(path)]) is None
    model.main([path])
    out = capsys.readouterr().out
    assert "not fitted" in out
    assert "| 128 | **shared / separate** | **" in out and "| — |" in out


def test_the_shared_pass_saves_only_the_repeated_stream(model):
    # (M + C) / (R M + C): 1/R with no arithmetic, -> 1 when arithmetic dominates
    bw, T, R = 40e9, 128, 2
    ratio = model.step(R, T, bw, 1e30, 2, True, True) / model.step(R, T, bw, 1e30, 2, False, True)
    assert ratio == pytest.approx(model.hit_bytes(R * T) / (R * model.hit_bytes(T)), rel=1e-9)
    slow = model.step(R, T, bw, 1e9, 2, True, True) / model.step(R, T, bw, 1e9, 2, False, True)
    assert 0.99 < slow < 1.0
    # C = M / 2 gives 0.6 exactly when the union hits no more experts than one rank
    m = model.hit_bytes(T) / bw
    p_half = R * model.flops(T) / (m / 2)
    r = model.step(R, T, bw, p_half, 2, True, True) / model.step(R, T, bw, p_half, 2, False, True)
    assert r == pytest.approx(0.6, abs=1e-3)
