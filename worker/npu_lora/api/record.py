"""The per-step record: one torch-free definition of every column of ``metrics.jsonl``.

Everything that lists step columns is derived from :data:`RECORD`, so adding a column is a
change here (plus the code that measures it):

- the engine's per-micro-batch profile (``npu_lora.engine.profile.StepProfile``: the fields are
  the columns with ``source="engine"``, :data:`PROFILE_COLUMNS`);
- the training loop's record (key order, micro-batch sums: :data:`SUMMED`), and the keys a
  data-parallel run adds (``source="data-parallel"``: :data:`DATA_PARALLEL`, written by
  ``npu_lora.distributed.group``; a single-rank record has none of them);
- ``summary.json``'s medians and the printed timing table (:data:`TABLE_COLUMNS`,
  :data:`MEDIAN_COLUMNS`);
- the bench's per-variant medians and its tables (:data:`BENCH_COLUMNS`, ``bench_label``);
- TensorBoard tags (``npu_lora.train.tensorboard.tag_of``: by unit and source);
- ``status.lastStep`` (:data:`STATUS_FIELDS`, keys camelCase) and ``status.distributed``
  (:data:`DISTRIBUTED_STATUS_FIELDS`), and their API models;
- the ``kubectl get mft`` columns that show the last step (:func:`printer_columns`);
- ``status.trainerStatus.metrics`` (Kubeflow Trainer's names, :data:`TRAINER_METRICS`) and the
  PROGRESS column (:func:`progress_column`).

``tests/api/test_record_registry.py`` adds a column to a copy of this file and checks that every
consumer shows it, and that no other module lists column names.

Imports only the standard library (the operator imports it and must never import torch).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "BENCH_COLUMNS",
    "DATA_PARALLEL",
    "DISTRIBUTED_STATUS_FIELDS",
    "MEDIAN_COLUMNS",
    "NAMES",
    "PROFILE_COLUMNS",
    "RECORD",
    "STATUS_FIELDS",
    "SUMMED",
    "TABLE_COLUMNS",
    "TRAINER_METRICS",
    "Column",
    "Printer",
    "TrainerMetric",
    "add",
    "by_name",
    "camel",
    "ordered",
    "printer_columns",
    "progress_column",
    "zero",
]


@dataclass(frozen=True)
class Printer:
    """A ``kubectl get mft`` column showing ``status.lastStep.<key>`` (a data-parallel column:
    ``status.distributed.<key>``)."""

    name: str
    description: str
    priority: int = 0  # 1: only with ``-o wide``


@dataclass(frozen=True)
class Column:
    """One key of the per-step record.

    ``source``: who measures it: ``engine`` (a field of the engine's per-micro-batch
    ``StepProfile``), ``loop`` (the training loop, once per step) or ``data-parallel`` (the
    loop's collectives; only in the records of a run with more than one rank);
    ``summed``: the sum over the step's micro-batches of the engine's profile value;
    ``table``: in the printed timing table (median after warm-up; ``label`` names it there);
    ``median``: median after warm-up in ``summary.json`` (every ``table`` column is);
    ``bench``: median per variant in the bench; ``status``: in ``status.lastStep`` (with
    ``digits`` significant digits, ``status_doc`` as the API field's description; a
    data-parallel column is reported in ``status.distributed`` instead); ``bench_label``: its
    heading in the bench's tables (default: the name).
    """

    name: str
    kind: Literal["int", "float", "bool", "str", "layers", "floats"]
    unit: str
    doc: str
    source: Literal["engine", "loop", "data-parallel"] = "loop"
    summed: bool = False
    table: bool = False
    median: bool = False
    bench: bool = False
    status: bool = False
    status_doc: str = ""
    required: bool = False  # required in the status model
    digits: int = 4
    label: str = ""
    bench_label: str = ""
    printer: Printer | None = None

    @property
    def data_parallel(self) -> bool:
        return self.source == "data-parallel"

    @property
    def status_section(self) -> str:
        """Where in ``status`` the column is reported: ``lastStep`` or ``distributed``."""
        return "distributed" if self.data_parallel else "lastStep"

    @property
    def status_key(self) -> str:
        """The key in ``status``: ``camel(name)`` (``attn_head_s`` → ``attnHeadS``); in
        ``status.distributed`` a trailing ``_s`` is spelled ``Seconds`` (``skew_s`` →
        ``skewSeconds``, the API as released)."""
        if self.data_parallel:
            return camel(re.sub(r"_s$", "_seconds", self.name))
        return camel(self.name)


def camel(name: str) -> str:
    """``attn_head_s`` → ``attnHeadS`` (the API's spelling)."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


_TIME = {"table": True, "median": True, "bench": True, "status": True}
_ENGINE = {"source": "engine", "summed": True}

#: The record's keys, in the order they appear in ``metrics.jsonl``.
RECORD: tuple[Column, ...] = (
    Column(
        "step",
        "int",
        "",
        "Optimizer step (1-based).",
        status=True,
        status_doc="Optimizer step (1-based).",
        required=True,
    ),
    Column(
        "loss",
        "float",
        "",
        "Mean training loss of the micro-batches (null when not finite).",
        source="engine",
        status=True,
        status_doc="Training loss of the step.",
        digits=5,
        printer=Printer("Loss", "Training loss of the last reported step."),
    ),
    Column(
        "step_s",
        "float",
        "s",
        "Wall seconds of the whole step (micro-batches, clipping, optimizer).",
        **_TIME,
        bench_label="s/step",
        status_doc="Wall seconds of the whole step.",
    ),
    Column(
        "attn_head_s",
        "float",
        "s",
        "Device work outside the MoE blocks: embeddings, attention blocks and LM head, "
        "forward + backward.",
        **_ENGINE,
        **_TIME,
        status_doc="Device seconds: embeddings, attention blocks and LM head (fwd+bwd).",
        bench_label="attn+head",
        printer=Printer("Attn", "Device seconds of the last step: embeddings, attention, LM head."),
    ),
    Column(
        "host_fwd_s",
        "float",
        "s",
        "HostMLP forward (router, dispatch, cold experts, the hot-expert device call and its "
        "transfers) over all layers.",
        **_ENGINE,
        **_TIME,
        status_doc="Host MoE forward seconds.",
        bench_label="HostMLP fwd",
        printer=Printer("Host-Fwd", "Host MoE forward seconds of the last step."),
    ),
    Column(
        "host_bwd_s",
        "float",
        "s",
        "HostMLP backward over all layers, including recompute_s.",
        **_ENGINE,
        **_TIME,
        status_doc="Host MoE backward seconds (includes recompute).",
        bench_label="HostMLP bwd",
        printer=Printer("Host-Bwd", "Host MoE backward seconds of the last step."),
    ),
    Column(
        "recompute_s",
        "float",
        "s",
        "The part of host_bwd_s that re-ran the block forward.",
        **_ENGINE,
        **_TIME,
        status_doc="Part of host_bwd_s spent recomputing the forward (keepGraph off).",
        bench_label="recompute",
    ),
    Column(
        "device_calls_per_layer",
        "float",
        "calls",
        "Forward-direction device calls in decoder layers divided by the number of layers.",
        **_ENGINE,
        **_TIME,
        status_doc="Forward-direction device calls per decoder layer.",
        label="device calls/layer",
        bench_label="calls/layer",
        printer=Printer(
            "Calls/Layer", "Forward-direction device calls per decoder layer.", priority=1
        ),
    ),
    Column(
        "tokens",
        "int",
        "tokens",
        "B*S summed over the micro-batches (padding included).",
        source="engine",
        status=True,
        status_doc="Tokens in the step.",
    ),
    Column(
        "hot_experts",
        "int",
        "experts",
        "Hot experts over all layers (0 while host-only).",
        source="engine",
    ),
    Column("keep_graph", "bool", "", "moe.keepGraph of the step.", source="engine"),
    Column("placement", "str", "", "moe.placement of the step.", source="engine"),
    Column(
        "expert_dtype",
        "str",
        "",
        "The host experts' dtype as resolved (moe.hostDtype; auto: what the worker chose): "
        "float32, bfloat16, int8 or float8_e4m3fn (status.host.dtype).",
    ),
    Column(
        "expert_layout",
        "str",
        "",
        "8-bit host experts: their layout and where it came from (status.host.layout, e.g. "
        "'int8 per output channel, quantised at load, expert by expert'); null otherwise.",
    ),
    Column("lr", "float", "", "Learning rate of the step."),
    Column("grad_norm", "float", "", "Gradient norm before clipping (null when not finite)."),
    Column("time", "str", "", "When the step ended (RFC 3339, UTC, milliseconds)."),
    Column(
        "hot_s",
        "float",
        "s",
        "The hot-expert device calls inside host_fwd_s.",
        **_ENGINE,
        median=True,
        bench=True,
        bench_label="hot calls",
    ),
    Column("opt_s", "float", "s", "Clipping and optimizer step.", median=True),
    Column("micro_batches", "int", "", "Micro-batches of the step (training.gradAccumulation)."),
    Column(
        "to_device_bytes",
        "int",
        "bytes",
        "Bytes copied host→device (forward and backward, all copies through the device seam, "
        "incl. move_bytes).",
        **_ENGINE,
        median=True,
        bench=True,
        status=True,
        status_doc="Bytes copied host→device in the step.",
        bench_label="→dev",
    ),
    Column(
        "to_host_bytes",
        "int",
        "bytes",
        "Bytes copied device→host (forward and backward).",
        **_ENGINE,
        median=True,
        bench=True,
        status=True,
        status_doc="Bytes copied device→host in the step.",
        bench_label="→host",
    ),
    Column(
        "to_device_s",
        "float",
        "s",
        "Wall seconds of the host→device copies.",
        **_ENGINE,
        median=True,
        bench=True,
        bench_label="→dev copy",
    ),
    Column(
        "to_host_s",
        "float",
        "s",
        "Wall seconds of the device→host copies.",
        **_ENGINE,
        median=True,
        bench=True,
        bench_label="→host copy",
    ),
    Column(
        "copy_mb",
        "float",
        "MB",
        "(to_device_bytes + to_host_bytes) / 10^6.",
        **_ENGINE,
        status=True,
        status_doc="MB (10^6 bytes) copied between host and device, both directions.",
        digits=4,
        printer=Printer(
            "Copy-MB", "MB copied host↔device in the last step (both directions).", priority=1
        ),
    ),
    Column(
        "move_bytes",
        "int",
        "bytes",
        "Part of to_device_bytes that copied hot experts' weights (selection, refresh).",
        **_ENGINE,
    ),
    Column(
        "traffic_layers",
        "layers",
        "",
        "Per decoder layer: {to_device_bytes, to_host_bytes, to_device_s, to_host_s} as lists (index = layer); "
        "copies outside the layers (inputs, head) are only in the totals.",
        **_ENGINE,
    ),
    Column(
        "expert_bytes",
        "int",
        "bytes",
        "Host expert weight bytes this process's experts kernel calls streamed: per decoder "
        "layer and pass over the experts (forward, recompute, backward), the experts hit by at "
        "least one token of the call × one expert's bytes (gate/up + down, host dtype); hot "
        "experts on the device are not counted. With distributed.sharedPass local rank 0 "
        "streams its worker's union and the other ranks none (npu_lora.moe.node_pass).",
        **_ENGINE,
        median=True,
        bench=True,
        status=True,
        status_doc="Host expert weight bytes this rank read in the step (hit experts × bytes, "
        "all layers, every pass).",
        bench_label="expert reads",
        printer=Printer(
            "Expert-Bytes",
            "Host expert weight bytes this rank read in the last step (hit experts × bytes).",
            priority=1,
        ),
    ),
    Column(
        "node_expert_bytes",
        "int",
        "bytes",
        "Host expert weight bytes the worker streamed in the step: expert_bytes summed over "
        "the worker's local ranks (one process: its own). Every rank streaming alone: ∝ ranks; "
        "with distributed.sharedPass one pass over the ranks' union: ∝ 1.",
        median=True,
        status=True,
        status_doc="Host expert weight bytes the worker streamed in the step (all its ranks).",
        printer=Printer(
            "Node-Expert-Bytes",
            "Host expert weight bytes the worker streamed in the last step (all its ranks).",
            priority=1,
        ),
    ),
    # --- data-parallel runs only (npu_lora.distributed.group), after the columns above;
    # reported in status.distributed
    Column(
        "world_size",
        "int",
        "ranks",
        "Training ranks in the process group.",
        source="data-parallel",
        status=True,
        status_doc="Training ranks in the process group.",
        required=True,
    ),
    Column(
        "rank_compute_s",
        "floats",
        "s",
        "Per rank: wall seconds of the step's forward/backward (micro-batches), by rank.",
        source="data-parallel",
        status=True,
        status_doc="Per rank: seconds of forward/backward of the last step, by rank.",
    ),
    Column(
        "slowest_rank",
        "int",
        "rank",
        "The rank with the most compute seconds.",
        source="data-parallel",
        status=True,
        status_doc="The rank with the most compute seconds.",
    ),
    Column(
        "skew_s",
        "float",
        "s",
        "Slowest minus fastest rank's compute seconds (what the others wait).",
        source="data-parallel",
        median=True,
        status=True,
        status_doc="Slowest minus fastest rank's compute seconds (the others' wait).",
    ),
    Column(
        "allreduce_s",
        "float",
        "s",
        "Wall seconds of the gradient all-reduce (includes waiting for slower ranks).",
        source="data-parallel",
        median=True,
        status=True,
        status_doc="Gradient all-reduce seconds of the last step (rank 0).",
    ),
    Column(
        "allreduce_bytes",
        "int",
        "bytes",
        "Gradient bytes all-reduced in the step.",
        source="data-parallel",
        status=True,
        status_doc="Gradient bytes all-reduced per step.",
    ),
)

#: The keys of every record (data-parallel columns excluded), in order.
NAMES: tuple[str, ...] = tuple(c.name for c in RECORD if not c.data_parallel)
#: The keys a data-parallel run's records add after :data:`NAMES`.
DATA_PARALLEL: tuple[str, ...] = tuple(c.name for c in RECORD if c.data_parallel)
#: The fields of the engine's per-micro-batch profile (``StepProfile``).
PROFILE_COLUMNS: tuple[Column, ...] = tuple(c for c in RECORD if c.source == "engine")
#: Summed over the micro-batches of a step (the engine's profile values).
SUMMED: tuple[str, ...] = tuple(c.name for c in RECORD if c.summed)
#: The printed timing table (medians after warm-up), in order.
TABLE_COLUMNS: tuple[str, ...] = tuple(c.name for c in RECORD if c.table)
#: ``summary.json``'s ``median``: the table's columns, then the other medians.
MEDIAN_COLUMNS: tuple[str, ...] = TABLE_COLUMNS + tuple(
    c.name for c in RECORD if c.median and not c.table
)
#: The bench's per-variant median columns from the engine's profile.
BENCH_COLUMNS: tuple[str, ...] = tuple(c.name for c in RECORD if c.bench)
#: The columns reported in ``status.lastStep``.
STATUS_FIELDS: tuple[Column, ...] = tuple(c for c in RECORD if c.status and not c.data_parallel)
#: The columns reported in ``status.distributed`` (data-parallel runs).
DISTRIBUTED_STATUS_FIELDS: tuple[Column, ...] = tuple(
    c for c in RECORD if c.status and c.data_parallel
)

_BY_NAME = {c.name: c for c in RECORD}


def by_name(name: str) -> Column:
    return _BY_NAME[name]


def ordered(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as a record in :data:`RECORD` order; every column must be given (extra keys,
    e.g. ``nonfinite``, follow)."""
    missing = [n for n in NAMES if n not in values]
    if missing:
        raise KeyError(f"step record lacks {missing}")
    out = {n: values[n] for n in NAMES}
    out.update((k, v) for k, v in values.items() if k not in out)
    return out


def zero(name: str) -> Any:
    """The start value of a summed column (0 for numbers, ``{}`` for per-layer lists)."""
    kind = by_name(name).kind
    return {} if kind == "layers" else 0.0 if kind == "float" else 0


def add(total: Any, value: Any) -> Any:
    """``total + value`` for a summed column: numbers add, per-layer lists add elementwise."""
    if isinstance(total, dict) or isinstance(value, dict):
        out = {k: list(v) for k, v in (total or {}).items()}
        for k, v in (value or {}).items():
            cur = out.get(k)
            out[k] = list(v) if cur is None else [a + b for a, b in zip(cur, v, strict=True)]
        return out
    out = (total or 0) + (value or 0)
    return float(out) if isinstance(total, float) else out


def printer_columns(
    *, priority: int | None = None, only: tuple[str, ...] = (), exclude: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """``additionalPrinterColumns`` entries of the record's columns (record order)."""
    out: list[dict[str, Any]] = []
    for c in RECORD:
        p = c.printer
        if p is None or (only and c.name not in only) or c.name in exclude:
            continue
        if priority is not None and p.priority != priority:
            continue
        col: dict[str, Any] = {
            "name": p.name,
            "type": "integer" if c.kind == "int" else "number",
            "jsonPath": f".status.{c.status_section}.{c.status_key}",
        }
        if p.priority:
            col["priority"] = p.priority
        col["description"] = p.description
        out.append(col)
    return out


# --- Kubeflow Trainer's view of progress (KEP-2779: ``status.trainerStatus``) ----------------


@dataclass(frozen=True)
class TrainerMetric:
    """One entry of ``status.trainerStatus.metrics`` ({name, value as a string}, Kubeflow
    Trainer KEP-2779), taken from the step record.

    ``source``: ``step`` (the last reported step's ``key``), ``median`` (the median of ``key``
    after warm-up, as ``status.stepSecondsMedian``), ``rate`` (the last step's ``key`` divided by
    its ``step_s``) or ``eval`` (the last held-out evaluation's ``key``, ``status.eval``)."""

    name: str
    source: Literal["step", "median", "rate", "eval"]
    key: str
    doc: str
    digits: int = 5


#: The fixed set of ``status.trainerStatus.metrics``, in the order they are written (a metric
#: without a value yet, e.g. ``eval_loss`` before the first evaluation, is left out).
TRAINER_METRICS: tuple[TrainerMetric, ...] = (
    TrainerMetric("loss", "step", "loss", "Training loss of the last reported step."),
    TrainerMetric("eval_loss", "eval", "loss", "Held-out loss of the last evaluation (spec.eval)."),
    TrainerMetric(
        "eval_accuracy",
        "eval",
        "accuracy",
        "Held-out accuracy of the last evaluation (classification data).",
    ),
    TrainerMetric(
        "step_seconds",
        "median",
        "step_s",
        "Median wall seconds per step after warm-up (the S/STEP column).",
        digits=4,
    ),
    TrainerMetric(
        "tokens_per_second",
        "rate",
        "tokens",
        "Tokens (padding included) per wall second of the last reported step.",
        digits=4,
    ),
)


def progress_column() -> dict[str, Any]:
    """The PROGRESS column of ``kubectl get mft`` (Kubeflow Trainer's, from
    ``status.trainerStatus.progressPercentage``)."""
    return {
        "name": "Progress",
        "type": "integer",
        "jsonPath": ".status.trainerStatus.progressPercentage",
        "description": "Percent of the run's steps done (Kubeflow Trainer's progressPercentage).",
    }
