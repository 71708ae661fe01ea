"""Per-micro-batch profile of the hybrid engine (one ``StepProfile`` per ``forward_backward``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from npu_lora.moe.host_mlp import HostTimes

__all__ = ["HostTimes", "StepProfile"]


@dataclass
class StepProfile:
    """Timings and counts of one ``HybridEngine.forward_backward`` call (one micro-batch).

    All times are wall seconds from ``time.perf_counter`` around synchronised work. Each field
    named in :mod:`npu_lora.api.record` means what its column there says; the rest:

    - ``attn_head_s`` is measured as follows. Forward: around each synchronised device call.
      Backward: (wall time of ``loss.backward()``) − ``host_bwd_s`` (HostMLP's backward runs
      nested inside autograd's backward, so the rest of the backward is the device side).
    - ``recompute_s``: keep_graph off, or keep_graph on but the kept graph was not usable.
    - ``device_calls_per_layer``: see ``npu_lora.backends.base.Backend``; embedding and head
      calls and backward-direction work are not in it.
    - ``tokens``: B*S of the micro-batch (all positions, padding included: all are computed).
    - ``device_calls``: forward-direction device calls by kind.
    - traffic (``to_device_bytes`` .. ``traffic_layers``): ``npu_lora.backends.base`` (the seam
      counts every copy, both directions, forward and backward); ``move_bytes`` is the part of
      ``to_device_bytes`` that moved hot experts' weights since the previous micro-batch.
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
    to_device_bytes: int = 0
    to_host_bytes: int = 0
    to_device_s: float = 0.0
    to_host_s: float = 0.0
    copy_mb: float = 0.0
    move_bytes: int = 0
    traffic_layers: dict[str, list] = field(default_factory=dict)
    #: expert weight bytes this process's kernel calls streamed (hit experts × bytes, once per
    #: direction; moe/node_pass.py); the loop sums them over the node's ranks
    node_expert_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)
