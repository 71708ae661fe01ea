"""summary.json, the timing table and step_times.png, from the metrics records."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from npu_lora.api import record as step_record
from npu_lora.machine import machine_facts

#: Timing/count columns summarised by their median after warm-up (table order).
TIMING_COLUMNS = step_record.TABLE_COLUMNS


def after_warmup(records: list[dict[str, Any]], warmup_steps: int) -> list[dict[str, Any]]:
    """Records with ``step > warmup_steps`` (all of them if that leaves none)."""
    post = [r for r in records if r.get("step", 0) > warmup_steps]
    return post or list(records)


def medians(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median of every :data:`~npu_lora.api.record.MEDIAN_COLUMNS` column (``None``: no
    value; a data-parallel column is left out of a single-rank run's medians)."""
    out: dict[str, float | None] = {}
    for col in step_record.MEDIAN_COLUMNS:
        vals = [float(r[col]) for r in records if isinstance(r.get(col), int | float)]
        if not vals and step_record.by_name(col).data_parallel:
            continue
        out[col] = statistics.median(vals) if vals else None
    return out


def traffic_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per decoder layer, the median per step of each traffic list (``traffic_layers``), and
    the bytes that moved hot experts over these steps."""
    rows = [r["traffic_layers"] for r in records if isinstance(r.get("traffic_layers"), dict)]
    rows = [r for r in rows if r]
    if not rows:
        return None
    out: dict[str, Any] = {}
    for key in rows[0]:
        cols = list(zip(*(r[key] for r in rows if key in r), strict=True))
        out[key] = [statistics.median(c) for c in cols]
    return {
        "per_layer_median": out,
        "move_bytes": int(sum(int(r.get("move_bytes") or 0) for r in records)),
    }


def host_moe_pass(records: list[dict[str, Any]], engine: Any) -> dict[str, Any] | None:
    """Tokens per host MoE pass (B·S of a micro-batch: one layer, one direction) and what bounds
    it on this machine's measured roofline (``moe.roofline``; not measured: said so), with the
    measured host forward per layer and pass (``host_fwd_s − hot_s`` over micro-batches and
    layers, medians) and what n× the tokens per pass would give."""
    mlps = getattr(engine, "mlps", None)
    per = [
        (int(r["tokens"]) / max(int(r.get("micro_batches") or 1), 1), r)
        for r in records
        if isinstance(r.get("tokens"), int | float) and r.get("tokens")
    ]
    if not mlps or not per:
        return None
    from npu_lora.models.quant import expert_nbytes
    from npu_lora.moe import roofline

    T = int(statistics.median(t for t, _ in per))
    E, _, H = mlps[0].experts.gate_up_proj.shape
    inter = mlps[0].experts.down_proj.shape[2]
    K = int(getattr(getattr(engine, "config", None), "num_experts_per_tok", 8))
    fwd = [
        (float(r.get("host_fwd_s") or 0.0) - float(r.get("hot_s") or 0.0))
        / max(int(r.get("micro_batches") or 1), 1)
        / len(mlps)
        for _, r in per
    ]
    measured = statistics.median(fwd) if any(x > 0 for x in fwd) else None
    dtype = str(mlps[0].host_dtype).removeprefix("torch.")
    lines = roofline.tuning_lines(
        T,
        K=K,
        E=int(E),
        H=int(H),
        inter=int(inter),
        expert_bytes=expert_nbytes(mlps[0].experts),  # 8-bit: the bytes plus the scales
        dtype=dtype,
        m=roofline.load(),
        measured_s=measured,
    )
    return {"tokens_per_pass": T, "host_fwd_s_per_layer": measured, "lines": lines}


def _host_moe_pass(records: list[dict[str, Any]], engine: Any) -> dict[str, Any] | None:
    try:  # a tuning fact never fails a run's summary
        return host_moe_pass(records, engine)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("npu-lora", "torch", "transformers", "peft", "tokenizers", "furiosa-torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def build_summary(
    records: list[dict[str, Any]],
    *,
    name: str | None,
    total_steps: int,
    warmup_steps: int,
    hot: dict[str, Any] | None,
    status: str,
    wall_s: float | None = None,
    engine: Any = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    post = after_warmup(records, warmup_steps)
    losses = [r.get("loss") for r in records]
    finite = [x for x in losses if isinstance(x, int | float) and math.isfinite(x)]
    step_s = sum(float(r.get("step_s") or 0.0) for r in post)
    tokens = sum(int(r.get("tokens") or 0) for r in post)
    hot_info = None
    if hot:
        hot_info = {
            k: hot[k] for k in ("fraction", "experts", "selected_at_step", "memory") if k in hot
        }
        history = getattr(getattr(engine, "hotset", None), "history", None)
        if history:
            hot_info["history"] = [dict(h) for h in history]
        if records:  # what the last step ran with (placement auto may have parked the set)
            hot_info["experts_at_end"] = int(records[-1].get("hot_experts") or 0)
    choice = getattr(engine, "placement_choice", None)
    summary: dict[str, Any] = {
        "status": status,
        "name": name,
        "steps": records[-1]["step"] if records else 0,
        "total_steps": total_steps,
        "first_loss": finite[0] if finite else None,
        "final_loss": losses[-1] if losses and isinstance(losses[-1], int | float) else None,
        "min_loss": min(finite) if finite else None,
        "median": medians(post),
        "median_over_steps": [post[0]["step"], post[-1]["step"]] if post else None,
        "tokens_per_s": (tokens / step_s) if step_s > 0 else None,
        "tokens": sum(int(r.get("tokens") or 0) for r in records),
        "hot": hot_info,
        "keep_graph": records[-1].get("keep_graph") if records else None,
        "placement": records[-1].get("placement") if records else None,
        "placement_choice": choice() if callable(choice) else None,
        "traffic": traffic_summary(post),
        "host_moe_pass": _host_moe_pass(post, engine),
        "wall_s": wall_s,
        "versions": versions(),
        "machine": machine_facts(engine),
    }
    summary.update(extra or {})
    return summary


def timing_table(summary: dict[str, Any]) -> str:
    med = summary.get("median") or {}
    span = summary.get("median_over_steps")
    head = "median per step"
    if span:
        head += f" (steps {span[0]}–{span[1]}, after warm-up)"
    lines = [head]
    for col in TIMING_COLUMNS:
        v = med.get(col)
        label = step_record.by_name(col).label or col
        if v is None:
            lines.append(f"  {label:<20} {'-':>10}")
        elif step_record.by_name(col).unit == "calls":
            lines.append(f"  {label:<20} {v:>10.2f}")
        else:
            lines.append(f"  {label:<20} {v:>10.4f}")
    fl, ll = summary.get("first_loss"), summary.get("final_loss")
    if fl is not None and ll is not None:
        lines.append(f"  {'loss':<20} {fl:.4f} → {ll:.4f} ({summary.get('steps')} steps)")
    tps = summary.get("tokens_per_s")
    if tps:
        lines.append(f"  {'tokens/s':<20} {tps:>10.1f}")
    for line in (summary.get("host_moe_pass") or {}).get("lines") or []:
        lines.append(f"  {line}")
    hot = summary.get("hot")
    if hot:
        lines.append(f"  {'hot experts':<20} {_hot_line(hot, summary.get('placement_choice'))}")
    return "\n".join(lines)


def _hot_line(hot: dict[str, Any], choice: dict[str, Any] | None) -> str:
    """The hot set as the run ended: placement auto choosing host-only parks the set, so the
    count selected at warm-up is not what the last steps ran with."""
    picked = (
        f"{hot.get('experts')} selected after step {hot.get('selected_at_step')} "
        f"(fraction {hot.get('fraction')})"
    )
    end = hot.get("experts_at_end")
    if end is None or end == hot.get("experts"):
        return f"{hot.get('experts')} (fraction {hot.get('fraction')}, after step {hot.get('selected_at_step')})"
    if choice and choice.get("chosen") == "host-only":
        host, hot_s = choice.get("host_only_median_s"), choice.get("hot_median_s")
        why = (
            f" (median {host:.4f} s vs {hot_s:.4f} s a step with the hot set)"
            if isinstance(host, int | float) and isinstance(hot_s, int | float)
            else ""
        )
        return (
            f"{end} at the end: placement auto chose host-only at step "
            f"{choice.get('decided_at_step')}{why}; {picked}"
        )
    return f"{end} at the end; {picked}"


def plot_step_times(records: list[dict[str, Any]], path: Path) -> Path | None:
    """Stacked bars per step: attn_head, host_fwd, host_bwd − recompute, recompute, other."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]

    def col(name: str) -> list[float]:
        return [float(r.get(name) or 0.0) for r in records]

    attn, hfwd, hbwd, rec, tot = (
        col("attn_head_s"),
        col("host_fwd_s"),
        col("host_bwd_s"),
        col("recompute_s"),
        col("step_s"),
    )
    bwd_only = [max(b - r, 0.0) for b, r in zip(hbwd, rec, strict=True)]
    other = [max(t - a - f - b, 0.0) for t, a, f, b in zip(tot, attn, hfwd, hbwd, strict=True)]
    parts = [
        ("attn/head (device)", attn, "#4c72b0"),
        ("host MoE fwd", hfwd, "#dd8452"),
        ("host MoE bwd", bwd_only, "#c44e52"),
        ("recompute", rec, "#8172b3"),
        ("other (optimizer, data, ...)", other, "#bbbbbb"),
    ]
    fig, (ax, ax2) = plt.subplots(
        2,
        1,
        figsize=(max(6.0, min(16.0, 0.12 * len(steps) + 4)), 6),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1]},
    )
    bottom = [0.0] * len(steps)
    for label, vals, color in parts:
        ax.bar(steps, vals, bottom=bottom, width=0.9, label=label, color=color, linewidth=0)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    hot_steps = [r["step"] for r in records if r.get("hot_experts")]
    if hot_steps:
        ax.axvline(hot_steps[0] - 0.5, color="k", linestyle="--", linewidth=1)
        ax.text(hot_steps[0] - 0.4, max(tot) * 0.95 if tot else 0, " hot experts on", fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("step time breakdown")
    ax.legend(fontsize=8, loc="upper right")
    losses = [r.get("loss") for r in records]
    ax2.plot(
        steps,
        [x if isinstance(x, int | float) else float("nan") for x in losses],
        "-",
        color="#333333",
        linewidth=1,
    )
    ax2.set_ylabel("loss")
    ax2.set_xlabel("step")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path
