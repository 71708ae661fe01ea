"""Per-micro-batch profile of the hybrid engine (one ``StepProfile`` per ``forward_backward``).

``StepProfile`` is a dataclass made from the step record's engine columns
(:data:`npu_lora.api.record.PROFILE_COLUMNS`, in record order): a new engine column is a new
field here without a change to this module. Keyword-only; the summed columns default to zero
(an engine that does not measure one reports 0), the others (``loss``, ``tokens``,
``hot_experts``, ``keep_graph``, ``placement``) are required. One more field that is not a
record column: ``device_calls``, the forward-direction device calls by kind.

All times are wall seconds from ``time.perf_counter`` around synchronised work. Each field
means what its column in :mod:`npu_lora.api.record` says; how some are measured:

- ``attn_head_s``. Forward: around each synchronised device call. Backward: (wall time of
  ``loss.backward()``) − ``host_bwd_s`` (HostMLP's backward runs nested inside autograd's
  backward, so the rest of the backward is the device side).
- ``recompute_s``: keep_graph off, or keep_graph on but the kept graph was not usable.
- ``device_calls_per_layer``: see ``npu_lora.backends.base.Backend``; embedding and head
  calls and backward-direction work are not in it.
- ``tokens``: B*S of the micro-batch (all positions, padding included: all are computed).
- traffic (``to_device_bytes`` .. ``traffic_layers``): ``npu_lora.backends.base`` (the seam
  counts every copy, both directions, forward and backward); ``move_bytes`` is the part of
  ``to_device_bytes`` that moved hot experts' weights since the previous micro-batch.
- ``expert_bytes``: :class:`npu_lora.moe.expert_reads.ExpertReads`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from npu_lora.api import record
from npu_lora.moe.host_mlp import HostTimes

__all__ = ["HostTimes", "StepProfile", "profile_class"]

_TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "layers": dict[str, list],
    "floats": list[float],
}


def _field(c: record.Column) -> tuple[str, Any, Any]:
    if not c.summed:
        return (c.name, _TYPES[c.kind], dataclasses.field())
    if c.kind == "layers":
        return (c.name, _TYPES[c.kind], dataclasses.field(default_factory=dict))
    return (c.name, _TYPES[c.kind], dataclasses.field(default=record.zero(c.name)))


def _to_dict(self: Any) -> dict[str, Any]:
    return dataclasses.asdict(self)


def profile_class(columns: tuple[record.Column, ...] = record.PROFILE_COLUMNS) -> type:
    """The profile dataclass of ``columns`` (the engine columns of the record by default)."""
    fields = [_field(c) for c in columns]
    fields.append(("device_calls", dict[str, int], dataclasses.field(default_factory=dict)))
    cls = dataclasses.make_dataclass(
        "StepProfile",
        fields,
        kw_only=True,
        namespace={"to_dict": _to_dict, "__module__": __name__},
    )
    cls.__doc__ = (
        "Timings and counts of one ``HybridEngine.forward_backward`` call (one micro-batch); "
        "fields: the engine columns of the step record (see the module docstring)."
    )
    return cls


StepProfile = profile_class()
