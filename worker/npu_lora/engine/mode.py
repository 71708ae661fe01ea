"""The engine mode's owner (:class:`ModeControl`): ``moe.placement`` as asked (the policy) and the
current :class:`~npu_lora.moe.mode.EngineMode` (placement, keep_graph, overlap).

Every ``HostMLP`` reads the mode from here (it is their ``ModeSource``); it changes only through
:meth:`ModeControl.set`, which checks it and tells the engine (``on_change``) so that kept graphs
are freed and the hot set is parked or restored (``engine.hotset.HotSet``).
"""

from __future__ import annotations

from collections.abc import Callable

from npu_lora.moe.mode import EngineMode

__all__ = ["POLICIES", "ModeControl"]

#: ``moe.placement``: ``auto`` measures ``host-only`` against ``hot`` (``engine.placement``)
POLICIES = ("hot", "host-only", "auto")


class ModeControl:
    """``policy``: ``hot``, ``host-only`` or ``auto`` (``auto`` with trained experts is
    ``host-only``: trained experts cannot live on the device). ``mode``: the current mode
    (``auto`` starts ``hot``; its trials switch it)."""

    def __init__(
        self,
        placement: str,
        keep_graph: bool,
        overlap: bool,
        *,
        train_experts: bool = False,
        on_change: Callable[[EngineMode, EngineMode], None] | None = None,
    ) -> None:
        self.train_experts = train_experts
        if placement == "auto" and train_experts:
            placement = "host-only"
        self.policy = placement
        first = EngineMode("hot" if placement == "auto" else placement, keep_graph, overlap)  # type: ignore[arg-type]
        self.check(first)
        self._mode = first
        self._on_change = on_change

    @property
    def mode(self) -> EngineMode:
        return self._mode

    def check(self, mode: EngineMode) -> None:
        if self.train_experts and mode.placement == "hot":
            raise ValueError("train_experts requires placement host-only")

    def set(self, mode: EngineMode) -> None:
        """Switch to ``mode`` (between steps); ``on_change(old, new)`` runs first."""
        self.check(mode)
        if self._on_change is not None:
            self._on_change(self._mode, mode)
        self._mode = mode

    def with_placement(self, placement: str) -> EngineMode:
        """The current mode with another placement."""
        return EngineMode(placement, self._mode.keep_graph, self._mode.overlap)  # type: ignore[arg-type]
