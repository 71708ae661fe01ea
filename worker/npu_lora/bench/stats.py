"""Statistics of the measured steps: per-variant medians and per-round paired comparisons."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from npu_lora.api import record as step_record

#: Per-variant medians of the engine's profile (the step record's bench columns).
PROFILE_COLUMNS = step_record.BENCH_COLUMNS
#: The bench tables' columns (``bench.md``, ``benchmark.md``): the same, in record order.
TABLE_COLUMNS: tuple[step_record.Column, ...] = tuple(
    step_record.by_name(n) for n in PROFILE_COLUMNS
)


def column_heading(col: step_record.Column) -> str:
    """A bench table's heading of ``col``: its ``bench_label`` (else its name); byte columns
    are shown in MB (10^6 bytes)."""
    label = col.bench_label or col.name
    return f"{label} MB" if col.unit == "bytes" else label


def column_cell(col: step_record.Column, value: float | None, spec: str = ".3f") -> str:
    """``value`` of ``col`` formatted for a table (``spec`` for seconds; calls per layer with
    one decimal, bytes in MB); ``—`` when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if col.unit == "bytes":
        return f"{value / 1e6:{spec}}"
    if col.unit == "calls" and spec == ".3f":
        return f"{value:.1f}"
    return f"{value:{spec}}"


def hot_dispatch_lines(records: Sequence[dict[str, Any]], names: Sequence[str]) -> list[str]:
    """Per hot variant, medians per step: hot pairs on the device, overflow pairs computed on
    the host, padded rows sent (the dense tensor's size), and the padding's share."""
    out = []
    for name in names:
        rs = [r for r in records if r.get("variant") == name and "hot_rows_padded" in r]
        if not rs:
            continue
        dev = statistics.median(r["hot_pairs_device"] for r in rs)
        ovf = statistics.median(r["hot_pairs_overflow"] for r in rs)
        rows = statistics.median(r["hot_rows_padded"] for r in rs)
        pad = 1 - dev / rows if rows else math.nan
        out.append(
            f"Hot dispatch {name}: {dev:.0f} pairs on the device in {rows:.0f} padded rows "
            f"({pad:.0%} padding), {ovf:.0f} overflow pairs on the host (medians per step)."
        )
    return ["", *out] if out else []


def _median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else math.nan


def per_round(steps: Sequence[dict], v: str, col: str) -> dict[int, float]:
    """Round → the mean of variant ``v``'s finite ``col`` values in that round."""
    steps = [r for r in steps if r.get("kind", "step") == "step"]
    out: dict[int, float] = {}
    for k in sorted({r["round"] for r in steps}):
        xs = [r.get(col) for r in steps if r["variant"] == v and r["round"] == k]
        xs = [x for x in xs if isinstance(x, int | float) and not math.isnan(x)]
        if xs:
            out[k] = statistics.fmean(xs)
    return out


def paired(records: list[dict], a: str, b: str, col: str = "step_s") -> dict[str, Any]:
    """Per-round paired comparison of variant ``a`` against ``b`` on one column."""
    steps = [r for r in records if r.get("kind") == "step"]
    pa, pb = per_round(steps, a, col), per_round(steps, b, col)
    common = [k for k in pa if k in pb]
    ds = [pa[k] - pb[k] for k in common]
    ratio_rounds = [k for k in common if pb[k]]
    ratios = [pa[k] / pb[k] for k in ratio_rounds]
    md = _median(ds)
    same = sum(1 for d in ds if d != 0 and (d > 0) == (md > 0)) if ds else 0
    return {
        "median_delta": md,
        "median_ratio": _median(ratios),
        "same_sign_rounds": same,
        "won_rounds": sum(1 for d in ds if d < 0),  # rounds where ``a`` took less than ``b``
        "rounds": len(ds),
        "deltas": ds,
        "ratios": ratios,
        "ratio_rounds": ratio_rounds,  # the round of each ratio
    }


def summarize(records: list[dict], variants: list[str], baseline: str) -> dict[str, Any]:
    """Per-variant medians of every column, and paired per-round deltas vs ``baseline``."""
    steps = [r for r in records if r.get("kind") == "step"]
    med: dict[str, dict[str, float]] = {}
    for v in variants:
        rs = [r for r in steps if r["variant"] == v]
        cols = (
            *PROFILE_COLUMNS,
            "cpu_s",
            "host_hit_bytes",
            "host_fwd_gbs",
            "host_fwd_copy_fraction",
            "host_fwd_read_fraction",
            "copy_gbs_round",
            "read_gbs_round",
            "loss",
            "fwd_s",
            "bwd_s",
            "loadavg1",
        )
        med[v] = {c: _median([r.get(c) for r in rs]) for c in cols}
        med[v]["n"] = len(rs)
    deltas: dict[str, dict[str, Any]] = {}
    for v in variants:
        p = paired(records, v, baseline)
        deltas[v] = {
            "median_delta_s": p["median_delta"],
            "median_ratio": p["median_ratio"],
            "same_sign_rounds": p["same_sign_rounds"],
            "won_rounds": p["won_rounds"],
            "rounds": p["rounds"],
            "deltas_s": p["deltas"],
        }
    pairs: dict[str, dict[str, Any]] = {}
    names = set(variants)
    for a, b, col in (
        ("host-only+keep_graph", "host-only", "host_bwd_s"),
        ("hot+keep_graph", "hot", "host_bwd_s"),
        *[
            (a, v, col)
            for a in variants
            if a.split("@")[0] == "host-only+keep_graph"
            for v in variants
            if v.startswith("peer")
            for col in ("step_s", "cpu_s")
        ],
        *[
            (v, "host-only+keep_graph", "step_s")
            for v in variants
            if "@" in v and not v.startswith("peer")
        ],
        *[
            (v, "host-only+keep_graph", "host_fwd_s")
            for v in variants
            if "@" in v and not v.startswith("peer")
        ],
        *[
            (v, "host-only+keep_graph", "host_bwd_s")
            for v in variants
            if "@" in v and not v.startswith("peer")
        ],
    ):
        if a in names and b in names:
            pairs[f"{a} / {b} : {col}"] = paired(records, a, b, col)
    rounds = [r for r in records if r.get("kind") == "round"]
    fractions: dict[str, dict[str, list]] = {}  # the host forward's, per round
    for v in variants:
        copy = per_round(steps, v, "host_fwd_copy_fraction")
        read = per_round(steps, v, "host_fwd_read_fraction")
        if copy or read:
            ks = sorted(set(copy) | set(read))
            fractions[v] = {
                "rounds": ks,
                "copy": [copy.get(k, math.nan) for k in ks],
                "read": [read.get(k, math.nan) for k in ks],
            }
    return {
        "medians": med,
        "deltas": deltas,
        "baseline": baseline,
        "pairs": pairs,
        "rounds": rounds,
        "fractions": fractions,
    }
