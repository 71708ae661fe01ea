"""``bench.md`` (the table, bandwidth, hot dispatch, targets) and ``bench.png``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from npu_lora.bench.config import BenchConfig
from npu_lora.bench.disturbance import DISTURBED_SHARE
from npu_lora.bench.peak_rss import rss_lines
from npu_lora.bench.q8 import error_lines
from npu_lora.bench.stats import TABLE_COLUMNS, column_cell, column_heading, hot_dispatch_lines


def _fmt(x: float | None, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{nd}f}"


def render_table(summary: dict[str, Any], variants: list[str]) -> str:
    """The per-variant medians of the step record's bench columns (:data:`TABLE_COLUMNS`), then
    the paired comparison with the baseline and the bench's own CPU seconds."""
    base = summary["baseline"]
    head = [
        "variant",
        *(column_heading(c) for c in TABLE_COLUMNS),
        f"Δ vs {base} (same-sign rounds)",
        "ratio",
        "CPU s/step",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        m, d = summary["medians"][v], summary["deltas"][v]
        delta = (
            "—"
            if v == base
            else f"{d['median_delta_s']:+.3f} s ({d['same_sign_rounds']}/{d['rounds']})"
        )
        ratio = "1.00" if v == base else _fmt(d["median_ratio"], 2)
        cells = [v, *(column_cell(c, m.get(c.name)) for c in TABLE_COLUMNS)]
        cells += [delta, ratio, _fmt(m.get("cpu_s"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], variants: list[str], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = summary["medians"]
    parts = [
        ("attn+head", lambda m: m["attn_head_s"]),
        ("HostMLP fwd", lambda m: m["host_fwd_s"]),
        ("HostMLP bwd (excl. recompute)", lambda m: m["host_bwd_s"] - m["recompute_s"]),
        ("recompute", lambda m: m["recompute_s"]),
        ("stock fwd (peers)", lambda m: m["fwd_s"]),
        ("stock bwd (peers)", lambda m: m["bwd_s"]),
    ]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(variants) + 4.5), 4.8))
    bottoms = [0.0] * len(variants)
    for label, f in parts:
        vals = []
        for v in variants:
            try:
                x = f(med[v])
            except (KeyError, TypeError):
                x = math.nan
            vals.append(0.0 if x is None or math.isnan(x) else max(x, 0.0))
        ax.bar(variants, vals, bottom=bottoms, label=label)
        bottoms = [b + x for b, x in zip(bottoms, vals, strict=True)]
    other = [
        max(med[v]["step_s"] - b, 0.0) if not math.isnan(med[v]["step_s"]) else 0.0
        for v, b in zip(variants, bottoms, strict=True)
    ]
    ax.bar(
        variants,
        other,
        bottom=bottoms,
        label="other (step − parts)",
        color="lightgray",
    )
    for i, v in enumerate(variants):
        ax.text(
            i, med[v]["step_s"], f"{med[v]['step_s']:.2f}", ha="center", va="bottom", fontsize=8
        )
    ax.set_ylabel("seconds per step (medians; parts are medians too)")
    ax.set_title(title or "npu-lora bench")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _range(xs: Sequence[float]) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "not measured"
    return f"{statistics.median(xs):.1f} GB/s (rounds {min(xs):.1f}–{max(xs):.1f})"


def bandwidth_line(limits: dict[str, Any], rounds: Sequence[dict[str, Any]]) -> str:
    """The bandwidth the fractions are quoted against (medians over the rounds, with their
    spread), the samples before and after the rounds, and the rounds' load and disturbance."""
    text = (
        f"Bandwidth (torch, {limits['threads']} threads), sampled at the start of every round: "
        f"read-only {_range([r.get('read_gbs', math.nan) for r in rounds])}, "
        f"copy {_range([r.get('copy_gbs', math.nan) for r in rounds])}; "
        f"copy before the rounds {limits.get('copy_gbs_before', limits['copy_gbs']):.1f}, "
        f"after {limits.get('copy_gbs_after', math.nan):.1f} GB/s; triad {limits['triad_gbs']:.1f} GB/s."
    )
    return text + " " + rounds_line(rounds) if rounds else text


def rounds_line(rounds: Sequence[dict[str, Any]]) -> str:
    """Per round: load average (1 min) and other processes' share of the CPUs."""
    loads = [r["loadavg1"] for r in rounds if r.get("loadavg1") is not None]
    shares = [r["others_share"] for r in rounds if r.get("others_share") is not None]
    flagged = sum(1 for r in rounds if r.get("disturbed"))
    text = f"{len(rounds)} rounds: load average {min(loads):.1f}–{max(loads):.1f}" if loads else ""
    if shares:
        text += (
            f"{'; ' if text else ''}other processes used {min(shares):.0%}–{max(shares):.0%} of "
            f"the CPUs; {flagged} of {len(rounds)} rounds disturbed (others > "
            f"{DISTURBED_SHARE:.0%})."
        )
    return text


def write_report(
    cfg: BenchConfig,
    summary: dict[str, Any],
    records: list[dict],
    names: list[str],
    log: Callable[[str], None],
) -> None:
    """``bench.md`` (table, bandwidth, hot dispatch, targets) and ``bench.png``."""
    out = Path(cfg.out)
    limits = summary["limits"]
    md = [f"# {cfg.title or 'npu-lora bench'}", "", render_table(summary, names), ""]
    if limits:
        md.append(bandwidth_line(limits, summary.get("rounds") or []))
    elif summary.get("rounds"):
        md.append(rounds_line(summary["rounds"]))
    md += hot_dispatch_lines(records, names)
    md += rss_lines(summary.get("peak_rss") or [])
    q8 = summary.get("q8_errors") or []
    md += error_lines(q8, q8[0]["reference"] if q8 else "")
    md += ["", "Targets:", *[f"- {t}" for t in summary["targets"]], ""]
    (out / "bench.md").write_text("\n".join(md))
    try:
        plot(summary, names, out / "bench.png", title=cfg.title or "")
    except Exception as e:  # pragma: no cover - plotting is a convenience
        log(f"plot failed: {e!r}")
    log("\n".join(md))
