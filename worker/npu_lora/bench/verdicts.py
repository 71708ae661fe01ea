"""The project's targets evaluated on one run."""

from __future__ import annotations

import math
from typing import Any


def derived_targets(
    summary: dict[str, Any], limits: dict | None, memory: list[dict] | None
) -> list[str]:
    """The project's targets, evaluated on this run (paired per-round ratios), or 'not measured'."""
    med = summary["medians"]
    pairs = summary.get("pairs", {})
    out = []

    def get(v: str, c: str) -> float:
        return med.get(v, {}).get(c, math.nan)

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    for key, p in pairs.items():
        r, n, same = p["median_ratio"], p["rounds"], p["same_sign_rounds"]
        if math.isnan(r):
            continue
        if key.endswith(": host_bwd_s") and "@" not in key:
            out.append(
                f"HostMLP bwd {key.split(' :')[0]} = {r:.2f} (paired median over {n} rounds, {same}/{n} same sign; target ≤ 0.60): {verdict(r <= 0.60)}"
            )
        elif "/ peer" in key and key.endswith("step_s"):
            out.append(
                f"step (wall) {key.split(' :')[0]} = {r:.2f} (paired median over {n} rounds, {same}/{n} same sign; target ≤ 0.75): {verdict(r <= 0.75)}"
            )
        else:
            out.append(f"{key} = {r:.2f} (paired median over {n} rounds, {same}/{n} same sign)")
    if not any("peer" in k for k in pairs):
        why = (
            "needs a host-only+keep_graph[@kernel] variant"
            if any(v.startswith("peer") for v in med)
            else "no peer variant in this run"
        )
        out.append(f"step vs stock transformers+peft: not measured ({why})")
    if limits:
        copy = limits.get("copy_gbs", math.nan)
        for v in med:
            if v.startswith("peer"):
                continue
            hot_s = get(v, "hot_s")
            hb, fs = (
                get(v, "host_hit_bytes"),
                get(v, "host_fwd_s") - (0.0 if math.isnan(hot_s) else hot_s),
            )
            if hb and not math.isnan(hb) and not math.isnan(fs) and fs > 0:
                bw = hb / fs / 1e9
                frac_r = get(v, "host_fwd_copy_fraction")
                per_round = (
                    ""
                    if math.isnan(frac_r)
                    else f"; per step against the same round's copy sample: median {frac_r:.0%}"
                )
                out.append(
                    f"host MoE fwd {v}: {bw:.1f} GB/s = {bw / copy:.0%} of copy {copy:.1f} GB/s{per_round} (target ≥ 60%): "
                    f"{verdict(max(bw / copy, 0 if math.isnan(frac_r) else frac_r) >= 0.6)} (bytes = hit experts' weights, all layers; time = host_fwd_s − hot_s, incl. router and dispatch)"
                )
    else:
        out.append("host MoE fwd bandwidth fraction: not measured (--no-limits)")
    for mem in memory or []:
        out.append(
            f"keep_graph saved tensors per layer {mem['layer_saved_bytes'] / 2**20:.1f} MiB vs analytic "
            f"T·K·(D+3I) {mem['analytic_bytes'] / 2**20:.1f} MiB = {mem['ratio']:.2f}× (target ≤ 1.5×; "
            f"autograd saved-tensor bytes of one layer's kept graph with `{mem['experts_impl']}`, not a process peak): "
            f"{verdict(mem['ratio'] <= 1.5)}"
        )
    if not memory:
        out.append("keep_graph memory: not measured (--no-memory)")
    return out
