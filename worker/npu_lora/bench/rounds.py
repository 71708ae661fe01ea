"""The measured rounds: variants in alternating order, a bandwidth sample per round, one record
per step (``bench.jsonl``)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

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


def bandwidth_after(limits: dict[str, Any], emit: Emitter) -> None:
    from npu_lora.bench.limits import stream_bandwidth

    bw2 = stream_bandwidth()
    emit({"kind": "limits", "when": "after", **bw2.to_dict()})
    limits["copy_gbs_after"] = bw2.copy_gbs
    limits["triad_gbs_after"] = bw2.triad_gbs
    # the reference for the fraction: the better (quieter) of the two measurements
    limits["copy_gbs"] = max(limits["copy_gbs"], bw2.copy_gbs)


def _measured_step(
    runner: VariantRunner,
    v: Variant,
    batch: dict[str, torch.Tensor],
    where: tuple[int, int, int],
    round_copy: float,
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
    rec["copy_gbs_round"] = round_copy
    fwd = rec.get("host_fwd_s", 0.0) - rec.get("hot_s", 0.0)
    if rec.get("host_hit_bytes") and fwd > 0:
        rec["host_fwd_gbs"] = rec["host_hit_bytes"] / fwd / 1e9
        rec["host_fwd_copy_fraction"] = rec["host_fwd_gbs"] / round_copy
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
    """``cfg.rounds`` rounds, alternating order; a short copy-bandwidth sample per round.
    ``on_round(rounds_done, records)`` after each round (progress reporting)."""
    cfg = runner.cfg
    records: list[dict] = []
    probe = None
    for rnd in range(cfg.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        round_copy = math.nan
        if cfg.limits:  # a short copy-bandwidth sample per round: the machine drifts
            from npu_lora.bench.limits import CopyProbe

            probe = probe or CopyProbe()  # buffers allocated once for all rounds
            bw_r = probe.measure(repeats=3)
            round_copy = bw_r.copy_gbs
            emit({"kind": "limits", "when": f"round {rnd}", **bw_r.to_dict()})
        for pos, v in enumerate(order):
            runner.apply(v)
            for s in range(cfg.steps_per_round):
                batch = batches[s % len(batches)]
                rec = _measured_step(runner, v, batch, (rnd, pos, s), round_copy)
                records.append(rec)
                emit(rec)
        log(
            f"round {rnd + 1}/{cfg.rounds} ({'forward' if rnd % 2 == 0 else 'reverse'}): "
            + ", ".join(f"{r['variant']} {r['step_s']:.2f}s" for r in records if r["round"] == rnd)
            + f" | load {os.getloadavg()[0]:.1f}"
        )
        if on_round is not None:
            on_round(rnd + 1, records)
    return records
