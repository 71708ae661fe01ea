"""The engine mode's owner (:class:`ModeControl`): ``moe.placement`` as asked (the policy) and the
current :class:`~npu_lora.moe.mode.EngineMode` (placement, keep_graph, overlap).

Every ``HostMLP`` reads the mode from here (it is their ``ModeSource``); it changes only through
:meth:`ModeControl.set`, which checks it and tells the engine (``on_change``) so that kept graphs
are freed and the hot set is parked or restored (``engine.hotset.HotSet``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npu_lora.moe.mode import EngineMode

__all__ = ["AUTO_ROUNDS", "POLICIES", "ModeControl"]

#: ``moe.placement: auto``: trial rounds after the hot set is chosen; round r runs one
#: host-only and one hot step, host-only first in even rounds (the bench's alternation).
AUTO_ROUNDS = 3

#: ``moe.placement``: ``auto`` measures ``host-only`` against ``hot`` (``engine.placement``)
POLICIES = ("hot", "host-only", "auto")


class ModeControl:
    """``policy``: ``hot``, ``host-only`` or ``auto`` (``auto`` with trained experts is
    ``host-only``: trained experts cannot live on the device). ``mode``: the current mode
    (``auto`` starts ``hot``; its trials switch it). ``auto_rounds``: the trial rounds of
    ``auto`` (``engine.placement.AutoPlacement``). ``on_change(old, new)``: told before every
    switch (the engine sets it to free kept graphs and park or restore the hot set)."""

    def __init__(
        self,
        placement: str,
        keep_graph: bool,
        overlap: bool,
        *,
        train_experts: bool = False,
        auto_rounds: int = AUTO_ROUNDS,
        on_change: Callable[[EngineMode, EngineMode], None] | None = None,
    ) -> None:
        self.train_experts = train_experts
        self.auto_rounds = auto_rounds
        if placement == "auto" and train_experts:
            placement = "host-only"
        self.policy = placement
        first = EngineMode("hot" if placement == "auto" else placement, keep_graph, overlap)  # type: ignore[arg-type]
        self.check(first)
        self._mode = first
        self.on_change = on_change

    @classmethod
    def from_spec(cls, moe: Any, lora: Any) -> ModeControl:
        """From the ``moe`` section (``placement``, ``keepGraph``: omitted is auto, which keeps
        the graph until ``keep_graph_auto`` sizes it, ``overlap``) and the ``lora`` section
        (``trainExperts``)."""
        return cls(
            moe.placement,
            moe.keep_graph is not False,
            moe.overlap,
            train_experts=lora.train_experts,
        )

    @property
    def mode(self) -> EngineMode:
        """The current mode (placement, keep_graph, overlap); change it with :meth:`set`."""
        return self._mode

    @property
    def placement(self) -> str:
        """The current placement (``hot`` or ``host-only``; :attr:`policy` is what was asked)."""
        return self._mode.placement

    @property
    def keep_graph(self) -> bool:
        return self._mode.keep_graph

    @property
    def overlap(self) -> bool:
        return self._mode.overlap

    def check(self, mode: EngineMode) -> None:
        if self.train_experts and mode.placement == "hot":
            raise ValueError("train_experts requires placement host-only")

    def set(self, mode: EngineMode) -> None:
        """Switch to ``mode`` (between steps; the bench's variants, the ``auto`` trials).
        ``on_change(old, new)`` runs first: the engine frees kept graphs, and leaving placement
        ``hot`` parks the hot set (the MoE blocks run all experts on the host), coming back
        restores it."""
        self.check(mode)
        if self.on_change is not None:
            self.on_change(self._mode, mode)
        self._mode = mode

    def with_placement(self, placement: str) -> EngineMode:
        """The current mode with another placement."""
        return EngineMode(placement, self._mode.keep_graph, self._mode.overlap)  # type: ignore[arg-type]
