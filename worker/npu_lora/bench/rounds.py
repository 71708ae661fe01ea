"""The measured rounds: variants in alternating order; each round measures, in this order, the
read-only and copy bandwidth (``CopyProbe``), then every variant's steps; one record per step and
one per round (``bench.jsonl``).

A round's record (``kind`` = ``round``) holds its read/copy/triad bandwidth, the load average at
its end, and the CPU time other processes used during it (``npu_lora.bench.disturbance``) with
the ``disturbed`` flag; every verdict is computed from these rounds (``npu_lora.bench.verdicts``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from npu_lora.bench import disturbance
from npu_lora.bench.runner import VariantRunner
from npu_lora.bench.variant import Variant


class Emitter:
    """``bench.jsonl``: one JSON record per line, flushed as written."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("w")

    def __call__(self, rec: dict) -> None:
        self._f.write(json.dumps(rec, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def bandwidth_before(emit: Emitter, log: Callable[[str], None]) -> dict[str, Any]:
    from npu_lora.bench.limits import stream_bandwidth

    bw = stream_bandwidth()
    limits = {"kind": "limits", "when": "before", **bw.to_dict()}
    emit(limits)
    log(
        f"bandwidth: copy {bw.copy_gbs:.1f} GB/s, triad {bw.triad_gbs:.1f} GB/s ({bw.threads} threads, load {bw.loadavg})"
    )
    return limits


def bandwidth_after(
    limits: dict[str, Any], emit: Emitter, rounds: list[dict[str, Any]] | None = None
) -> None:
    """The sample after the rounds, and the run's reference figures: ``copy_gbs`` /
    ``read_gbs`` = the median of the per-round samples (never the best of several samples);
    without round samples, the median of the before and after samples."""
    from npu_lora.bench.limits import stream_bandwidth

    bw2 = stream_bandwidth()
    emit({"kind": "limits", "when": "after", **bw2.to_dict()})
    limits["copy_gbs_before"] = limits["copy_gbs"]
    limits["copy_gbs_after"] = bw2.copy_gbs
    limits["triad_gbs_after"] = bw2.triad_gbs
    copies = [r["copy_gbs"] for r in rounds or [] if _finite(r.get("copy_gbs"))]
    reads = [r["read_gbs"] for r in rounds or [] if _finite(r.get("read_gbs"))]
    limits["copy_gbs"] = statistics.median(copies or [limits["copy_gbs"], bw2.copy_gbs])
    limits["copy_gbs_rounds"] = copies
    limits["read_gbs"] = statistics.median(reads) if reads else math.nan
    limits["read_gbs_rounds"] = reads


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _measured_step(
    runner: VariantRunner,
    v: Variant,
    batch: dict[str, torch.Tensor],
    where: tuple[int, int, int],
    round_bw: tuple[float, float],
) -> dict[str, Any]:
    """One measured step's record (``where``: round, position in it, step in the round), with
    the host forward's achieved bandwidth."""
    rec = runner.step(v, batch)
    rnd, pos, s = where
    rec.update(
        kind="step",
        variant=v.name,
        round=rnd,
        order_pos=pos,
        step_in_round=s,
        loadavg=os.getloadavg(),
    )
    rec["loadavg1"] = rec["loadavg"][0]
    round_read, round_copy = round_bw
    rec["copy_gbs_round"] = round_copy
    rec["read_gbs_round"] = round_read
    fwd = rec.get("host_fwd_s", 0.0) - rec.get("hot_s", 0.0)
    if rec.get("host_hit_bytes") and fwd > 0:
        rec["host_fwd_gbs"] = rec["host_hit_bytes"] / fwd / 1e9
        rec["host_fwd_copy_fraction"] = rec["host_fwd_gbs"] / round_copy
        rec["host_fwd_read_fraction"] = rec["host_fwd_gbs"] / round_read
    rec["experts_impl"] = v.experts_impl or runner.cfg.experts_impl
    return rec


def run_rounds(
    runner: VariantRunner,
    variants: list[Variant],
    batches: list[dict[str, torch.Tensor]],
    emit: Emitter,
    log: Callable[[str], None],
    on_round: Callable[[int, list[dict]], None] | None = None,
) -> list[dict]:
    """``cfg.rounds`` rounds, alternating order; per round first a short read-only and copy
    bandwidth sample, then the variants' steps. Returns the step records and one ``round``
    record per round. ``on_round(rounds_done, records)`` after each round (progress reporting)."""
    cfg = runner.cfg
    records: list[dict] = []
    probe = None
    for rnd in range(cfg.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        cpu0, t0 = disturbance.sample(), time.perf_counter()
        rinfo: dict[str, Any] = {"kind": "round", "round": rnd}
        round_bw = (math.nan, math.nan)
        if cfg.limits:  # a short bandwidth sample per round: the machine drifts
            from npu_lora.bench.limits import CopyProbe

            probe = probe or CopyProbe()  # buffers allocated once for all rounds
            bw_r = probe.measure(repeats=3, read=True)
            round_bw = (bw_r.read_gbs, bw_r.copy_gbs)
            emit({"kind": "limits", "when": f"round {rnd}", **bw_r.to_dict()})
            rinfo.update(read_gbs=bw_r.read_gbs, copy_gbs=bw_r.copy_gbs, triad_gbs=bw_r.triad_gbs)
        steps = []
        for pos, v in enumerate(order):
            runner.apply(v)
            for s in range(cfg.steps_per_round):
                batch = batches[s % len(batches)]
                rec = _measured_step(runner, v, batch, (rnd, pos, s), round_bw)
                steps.append(rec)
                emit(rec)
        rinfo["wall_s"] = time.perf_counter() - t0
        rinfo.update(disturbance.disturbance(cpu0, disturbance.sample()))
        rinfo["loadavg"] = os.getloadavg()
        rinfo["loadavg1"] = rinfo["loadavg"][0]
        emit(rinfo)
        records += [*steps, rinfo]
        share = rinfo["others_share"]
        log(
            f"round {rnd + 1}/{cfg.rounds} ({'forward' if rnd % 2 == 0 else 'reverse'}): "
            + ", ".join(f"{r['variant']} {r['step_s']:.2f}s" for r in steps)
            + f" | load {rinfo['loadavg1']:.1f}"
            + ("" if share is None else f", others {share:.0%} of the CPUs")
            + (" (disturbed)" if rinfo["disturbed"] else "")
        )
        if on_round is not None:
            on_round(rnd + 1, records)
    return records
