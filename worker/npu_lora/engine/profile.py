"""Per-micro-batch profile of the hybrid engine (one ``StepProfile`` per ``forward_backward``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from npu_lora.moe.host_mlp import HostTimes

__all__ = ["HostTimes", "StepProfile"]


@dataclass
class StepProfile:
    """Timings and counts of one ``HybridEngine.forward_backward`` call (one micro-batch).

    All times are wall seconds from ``time.perf_counter`` around synchronised work.

    - ``attn_head_s``: device work outside the MoE blocks: embeddings, attention blocks and LM
      head, forward + backward. Forward: measured around each synchronised device call.
      Backward: (wall time of ``loss.backward()``) − ``host_bwd_s`` (HostMLP's backward runs
      nested inside autograd's backward, so the rest of the backward is the device side).
    - ``host_fwd_s``: HostMLP forward (router, dispatch, cold experts, the hot-expert device
      call and its transfers) over all layers.
    - ``host_bwd_s``: HostMLP backward over all layers, *including* ``recompute_s``.
    - ``recompute_s``: the part of ``host_bwd_s`` that re-ran the block forward (keep_graph off,
      or keep_graph on but the kept graph was not usable).
    - ``device_calls_per_layer``: forward-direction device calls made in decoder layers
      divided by the number of layers (see ``npu_lora.backends.base.Backend``); embedding and
      head calls and backward-direction work are not in it.
    - ``tokens``: B*S of the micro-batch (all positions, padding included: all are computed).
    - ``hot_experts``: hot experts over all layers (0 while host-only).
    """

    loss: float
    attn_head_s: float
    host_fwd_s: float
    host_bwd_s: float
    recompute_s: float
    device_calls_per_layer: float
    tokens: int
    hot_experts: int
    keep_graph: bool
    placement: str
    hot_s: float = 0.0
    device_calls: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
