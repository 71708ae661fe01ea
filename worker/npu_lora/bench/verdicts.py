"""Verdicts: the project's targets evaluated on one run, from per-round paired figures.

The rule (one function, :func:`judge`): a figure is measured once per round, paired within the
round (a variant's time against another variant's in the same round; the host forward's
bandwidth against the read-only and copy bandwidth sampled at the start of the same round). The
verdict is the *median over rounds* against the target, quoted with the number of rounds on the
target's side, the per-round range and the number of rounds flagged as disturbed by other
processes (``npu_lora.bench.disturbance``). Never the best of several samples: on these VMs the
copy bandwidth swings ±15 points between samples, and a best-of reference once printed "80 % …
met" for a run whose per-round median was 45 %.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from npu_lora.api.variant import Variant

MET, NOT_MET, NOT_MEASURED = "met", "NOT met", "not measured"

#: Target of the host MoE forward: at least this fraction of the copy bandwidth.
FWD_OF_COPY = 0.60
#: keep_graph's HostMLP backward against recompute's, paired per round.
BWD_KEEP_GRAPH = 0.60
#: host-only+keep_graph's step against stock transformers + peft's, paired per round.
STEP_VS_PEER = 0.75


@dataclass(frozen=True)
class Verdict:
    """A target judged on per-round figures (finite values only, in round order)."""

    target: float
    at_most: bool  # the target is an upper bound (times, ratios) or a lower bound (fractions)
    values: tuple[float, ...]
    rounds: tuple[int, ...]
    disturbed_rounds: tuple[int, ...]  # those of ``rounds`` flagged as disturbed

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    def ok(self, x: float) -> bool:
        return x <= self.target if self.at_most else x >= self.target

    @property
    def on_side(self) -> int:
        """Rounds whose own figure meets the target."""
        return sum(1 for x in self.values if self.ok(x))

    @property
    def met(self) -> bool | None:
        """The median over rounds meets the target (None: no round measured it)."""
        return None if not self.values else self.ok(self.median)

    @property
    def word(self) -> str:
        return NOT_MEASURED if self.met is None else MET if self.met else NOT_MET

    @property
    def undisturbed_median(self) -> float:
        pairs = zip(self.values, self.rounds, strict=True)
        xs = [x for x, k in pairs if k not in self.disturbed_rounds]
        return statistics.median(xs) if xs else math.nan

    def describe(self, fmt: Callable[[float], str] = "{:.2f}".format) -> str:
        """``met in 5 of 6 rounds, median 63% (per round 48%–70%); 1 of 6 rounds disturbed``."""
        if not self.values:
            return "no round measured it"
        d = len(self.disturbed_rounds)
        text = (
            f"met in {self.on_side} of {self.n} rounds, median {fmt(self.median)} "
            f"(per round {fmt(min(self.values))}–{fmt(max(self.values))})"
        )
        text += f"; {d} of {self.n} rounds disturbed"
        if 0 < d < self.n:
            text += f" (median of the {self.n - d} others {fmt(self.undisturbed_median)})"
        return text

    def line(
        self, label: str, fmt: Callable[[float], str] = "{:.2f}".format, detail: str = ""
    ) -> str:
        """``<label> (target ≥ 60%): met in … rounds, median …; … disturbed[; detail]:
        <met|NOT met>``: the verdict always last."""
        op = "≤" if self.at_most else "≥"
        more = f"; {detail}" if detail else ""
        return f"{label} (target {op} {fmt(self.target)}): {self.describe(fmt)}{more}: {self.word}"


def judge(
    per_round: Mapping[int, float] | Sequence[float],
    target: float,
    *,
    at_most: bool,
    disturbed: Collection[int] = (),
) -> Verdict:
    """The verdict on per-round figures (round → figure, or a sequence in round order):
    met when the median over rounds meets ``target``; non-finite figures are left out;
    ``disturbed``: the rounds flagged as disturbed."""
    items = per_round.items() if isinstance(per_round, Mapping) else enumerate(per_round)
    kept = [(k, float(x)) for k, x in items if x is not None and math.isfinite(x)]
    rounds = tuple(k for k, _ in kept)
    flagged = set(disturbed)
    return Verdict(
        target=target,
        at_most=at_most,
        values=tuple(x for _, x in kept),
        rounds=rounds,
        disturbed_rounds=tuple(k for k in rounds if k in flagged),
    )


def disturbed_rounds(summary: Mapping[str, Any]) -> set[int]:
    """The rounds of a summary flagged as disturbed (``round`` records)."""
    return {r["round"] for r in summary.get("rounds") or [] if r.get("disturbed")}


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _spread(xs: Sequence[float]) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "not measured"
    return f"{statistics.median(xs):.1f} GB/s (rounds {min(xs):.1f}–{max(xs):.1f})"


#: Beside an 8-bit variant's bandwidth line: why its fraction sits far below bf16's on a host
#: without AMX (experiments/2026-12-05-q8-floor.md).
Q8_BOUND_NOTE = (
    "8-bit: half the bytes, the same multiply-adds (the bytes are widened in registers), so on a "
    "host without AMX the multiply-adds, not the bytes, bound this fraction (docs/engine.md, "
    "8-bit experts)"
)


def _is_q8(variant: str) -> bool:
    """Whether a variant name runs 8-bit experts (``+int8`` / ``+fp8``); other names (tests'
    labels) are not."""
    try:
        return Variant.parse(variant).q8 is not None
    except ValueError:
        return False


def bandwidth_verdict(
    fractions: Mapping[str, Any], rounds: Sequence[Mapping[str, Any]], disturbed: Collection[int]
) -> tuple[Verdict, str]:
    """The host forward's verdict against the copy bandwidth (the target's reference) and the
    text quoting the read-only fraction and both bandwidths with their spread. ``fractions``:
    ``{"rounds": [...], "copy": [...], "read": [...]}`` (per round, of one variant)."""
    ks = fractions.get("rounds") or []
    copy, read = (
        judge(
            dict(zip(ks, fractions.get(ref) or [], strict=False)),
            FWD_OF_COPY,
            at_most=False,
            disturbed=disturbed,
        )
        for ref in ("copy", "read")
    )
    ref = (
        f"copy {_spread([r.get('copy_gbs', math.nan) for r in rounds])}; "
        f"of read-only {_spread([r.get('read_gbs', math.nan) for r in rounds])}: "
    )
    if read.values:
        ref += (
            f"median {_pct(read.median)} (per round {_pct(min(read.values))}–"
            f"{_pct(max(read.values))}), ≥ {_pct(FWD_OF_COPY)} in {read.on_side} of {read.n} rounds"
        )
    else:
        ref += "not measured"
    return copy, ref


def peer_fairness(host_dtype: str, native_bf16: bool, variants: Sequence[str]) -> str | None:
    """Which stock peer is the fair reference for our bf16 here, and whether this run had it:
    with native bf16 (AVX512-BF16/AMX) the peer's bf16; without (AVX2 only) torch's bf16 is
    emulated (~100x slower), so a user runs fp32 and ``peer+fp32`` is the fair peer."""
    peers = [v for v in variants if v.startswith("peer")]
    if host_dtype not in ("bfloat16", "bf16") or not peers:
        return None
    fp32 = [p for p in peers if p.startswith("peer+fp32") or "+fp32" in p]
    bf16 = [p for p in peers if p not in fp32]
    if native_bf16:
        have = "ran" if bf16 else "did not run (only fp32 peers)"
        return f"fair peer for bf16: this CPU has native bf16, so stock bf16 (peer@…); it {have}"
    have = (
        f"ran ({', '.join(fp32)})"
        if fp32
        else "did not run: the bf16 peers here are emulated bf16, an unfairly slow reference "
        "(add peer+fp32@grouped_mm)"
    )
    return (
        "fair peer for bf16: this CPU has no native bf16 (AVX2 only; torch emulates bf16), "
        f"so stock fp32 (peer+fp32@…); it {have}"
    )


def derived_targets(
    summary: dict[str, Any], limits: dict | None, memory: list[dict] | None
) -> list[str]:
    """The project's targets, evaluated on this run with :func:`judge` (per-round paired
    figures), or 'not measured'."""
    med = summary["medians"]
    pairs = summary.get("pairs", {})
    disturbed = disturbed_rounds(summary)
    out = []

    def verdict(ok: bool) -> str:
        return MET if ok else NOT_MET

    for key, p in pairs.items():
        ks = p.get("ratio_rounds") or range(len(p["ratios"]))
        ratios = dict(zip(ks, p["ratios"], strict=False))
        pair = key.split(" :")[0]
        if key.endswith(": host_bwd_s") and "@" not in key:
            v = judge(ratios, BWD_KEEP_GRAPH, at_most=True, disturbed=disturbed)
            out.append(v.line(f"HostMLP bwd {pair}, paired per-round ratio"))
        elif "/ peer" in key and key.endswith("step_s"):
            v = judge(ratios, STEP_VS_PEER, at_most=True, disturbed=disturbed)
            out.append(v.line(f"step (wall) {pair}, paired per-round ratio"))
        else:
            v = judge(ratios, 1.0, at_most=True, disturbed=disturbed)
            if not v.values:
                continue
            out.append(
                f"{key} = {v.median:.2f} (paired per-round median over {v.n} rounds, per round "
                f"{min(v.values):.2f}–{max(v.values):.2f}; {pair.split(' / ')[0]} took less in "
                f"{p.get('won_rounds', 0)} of {v.n} rounds; {len(v.disturbed_rounds)} of {v.n} "
                "rounds disturbed)"
            )
    if not any("peer" in k for k in pairs):
        why = (
            "needs a host-only+keep_graph[@kernel] variant"
            if any(v.startswith("peer") for v in med)
            else "no peer variant in this run"
        )
        out.append(f"step vs stock transformers+peft: not measured ({why})")
    if limits:
        rounds = summary.get("rounds") or []
        for v, fr in (summary.get("fractions") or {}).items():
            if v.startswith("peer") or not fr.get("copy"):
                continue
            copy, ref = bandwidth_verdict(fr, rounds, disturbed)
            how = (
                "per round: hit experts' bytes, all layers / (host_fwd_s − hot_s), incl. router "
                "and dispatch, ÷ that round's bandwidth"
            )
            if _is_q8(v):
                how += f"; {Q8_BOUND_NOTE}"
            out.append(copy.line(f"host MoE fwd {v} of copy bandwidth", _pct, f"{ref}; {how}"))
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
