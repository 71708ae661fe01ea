"""The engine mode: how the MoE blocks run (``moe.placement``, ``moe.keepGraph``, ``moe.overlap``).

One owner: :class:`npu_lora.engine.HybridEngine` holds the current :class:`EngineMode` and
changes it only through ``ModeControl.set`` (which does the engine's checks); every ``HostMLP`` reads it
from there (:class:`ModeSource`). A ``HostMLP`` built alone reads a :class:`FixedMode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

__all__ = ["PLACEMENTS", "EngineMode", "FixedMode", "ModeSource", "Placement"]

Placement = Literal["hot", "host-only"]
PLACEMENTS: tuple[str, ...] = get_args(Placement)


@dataclass(frozen=True)
class EngineMode:
    """``placement``: ``hot`` (the hot experts on the device once chosen) or ``host-only``;
    ``keep_graph``: HostMLP keeps the block's graph from forward to backward;
    ``overlap``: the hot-expert device call overlaps the cold experts (non-CPU devices)."""

    placement: Placement = "hot"
    keep_graph: bool = True
    overlap: bool = False

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be 'hot' or 'host-only', not {self.placement!r}")


class ModeSource(Protocol):
    """Where a HostMLP reads the current mode (the engine)."""

    @property
    def mode(self) -> EngineMode: ...


@dataclass(frozen=True)
class FixedMode:
    """The mode of a HostMLP outside an engine."""

    mode: EngineMode
