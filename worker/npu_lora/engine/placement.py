"""Where things run: :func:`place_on_device` (everything but the MoE blocks on the device) and
the ``moe.placement: auto`` trials (:class:`AutoPlacement`).

``auto``: after the hot set is chosen, ``AUTO_ROUNDS`` rounds of one host-only and one hot step
(host-only first in even rounds: the bench's alternation); then the placement with the smaller
median forward+backward seconds is kept. Under data parallelism every rank keeps rank 0's
choice (``agree``: a collective every rank reaches at the same step).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from torch import nn

from npu_lora.backends import Backend
from npu_lora.engine.mode import AUTO_ROUNDS

__all__ = ["AUTO_ROUNDS", "AutoPlacement", "place_on_device"]


def place_on_device(model: nn.Module, host_modules: list[nn.Module], backend: Backend) -> None:
    """Every parameter and buffer of ``model`` but those of ``host_modules`` (the MoE blocks)
    goes to the backend's device (nothing moves on ``cpu``)."""
    if backend.device.type == "cpu":
        return
    dev = backend.device
    host_ids = {id(t) for m in host_modules for t in (*m.parameters(), *m.buffers())}
    for mod in model.modules():
        for p in mod._parameters.values():
            if p is not None and id(p) not in host_ids:
                p.data = p.data.to(dev)
        for key, b in mod._buffers.items():
            if b is not None and id(b) not in host_ids:
                mod._buffers[key] = b.to(dev)


class AutoPlacement:
    """The trials of placement ``auto`` and their outcome: ``trials`` (``[placement, step,
    seconds]``), ``chosen`` (None while measuring), ``decided_at_step``, ``median_s``."""

    def __init__(self, rounds: int = AUTO_ROUNDS) -> None:
        self.rounds = rounds
        self.trials: list[list[Any]] = []
        self.chosen: str | None = None
        self.decided_at_step: int | None = None
        self.median_s: dict[str, float] | None = None
        self._agree: Callable[[str], str] | None = None

    def agree_with(self, agree: Callable[[str], str] | None) -> None:
        """Data parallel: ``agree(choice) -> rank 0's choice``; None: this process alone."""
        self._agree = agree

    @property
    def deciding(self) -> bool:
        return self.chosen is None

    def placement(self) -> str:
        """The placement of the next step: the choice, else the next trial's."""
        if self.chosen is not None:
            return self.chosen
        k = len(self.trials)
        first, second = ("host-only", "hot") if (k // 2) % 2 == 0 else ("hot", "host-only")
        return first if k % 2 == 0 else second

    def record(self, placement: str, step: int, seconds: float) -> None:
        """One trial step (its placement and forward+backward seconds); after ``rounds``
        rounds keep the faster (median)."""
        self.trials.append([placement, step, seconds])
        if len(self.trials) >= 2 * self.rounds:
            med = {
                p: statistics.median(s for q, _, s in self.trials if q == p)
                for p in ("host-only", "hot")
            }
            self.median_s = med
            chosen = "hot" if med["hot"] < med["host-only"] else "host-only"
            self.chosen = self._agree(chosen) if self._agree else chosen
            self.decided_at_step = step

    def report(self) -> dict[str, Any]:
        """``{policy, chosen, decided_at_step, host_only_median_s, hot_median_s, trials}``."""
        med = self.median_s or {}
        return {
            "policy": "auto",
            "chosen": self.chosen,
            "decided_at_step": self.decided_at_step,
            "host_only_median_s": med.get("host-only"),
            "hot_median_s": med.get("hot"),
            "trials": [list(t) for t in self.trials],
        }

    def state(self) -> dict[str, Any]:
        return {
            "trials": [list(t) for t in self.trials],
            "chosen": self.chosen,
            "decided_at_step": self.decided_at_step,
            "median_s": self.median_s,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.trials = [list(t) for t in state["trials"]]
        self.chosen = state["chosen"]
        self.decided_at_step = state["decided_at_step"]
        self.median_s = dict(state["median_s"]) if state.get("median_s") else None
