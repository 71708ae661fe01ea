"""``status``: owned in disjoint subtrees by the operator and the worker; ``lastStep`` is built
from the step record (:mod:`npu_lora.api.record`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
)
from pydantic.alias_generators import to_camel, to_snake

from npu_lora.api import record
from npu_lora.api.v1alpha1.base import _Model


class Condition(_Model):
    """metav1.Condition."""

    type: str = Field(..., description="Queued, Running, Succeeded, Failed or Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False, Unknown.")
    reason: str = Field(..., description="CamelCase cause, e.g. WorkerError, ImagePullBackOff.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str = Field(..., description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="Generation this was computed for.")


class Progress(_Model):
    step: int = Field(0, description="Last completed optimizer step.")
    total_steps: int = Field(
        0, description="Steps of the run (training.steps, or from training.epochs)."
    )
    percent: float = Field(0.0, description="100 * step / totalSteps.")
    eta_seconds: float | None = Field(None, description="Estimated seconds to the end.")
    last_update_time: str | None = Field(None, description="When the worker last reported.")


class TrainerMetric(_Model):
    """One metric of ``trainerStatus`` (Kubeflow Trainer KEP-2779's ``Metric``)."""

    name: str = Field(
        ..., min_length=1, max_length=63, description="The metric, e.g. loss, eval_loss."
    )
    value: str = Field(
        ..., min_length=1, max_length=64, description="Its value, serialized as a string."
    )


class TrainerStatus(_Model):
    """Training progress under Kubeflow Trainer's names (``TrainJob`` ``status.trainerStatus``,
    KEP-2779), written by the worker with each step record beside ``progress`` and
    ``lastStep``."""

    progress_percentage: int | None = Field(
        None,
        ge=0,
        le=100,
        description="How complete the run is, 0-100 (steps done / steps of the run, floored).",
    )
    estimated_remaining_seconds: int | None = Field(
        None,
        ge=0,
        description="Estimated seconds to the end (steps left × median s/step; progress.etaSeconds).",
    )
    metrics: list[TrainerMetric] | None = Field(
        None,
        max_length=16,
        description="The current metrics: "
        + ", ".join(
            f"`{m.name}` ({m.doc[:1].lower() + m.doc[1:-1]})" for m in record.TRAINER_METRICS
        )
        + "; one without a value yet is left out.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    last_updated_time: str | None = Field(
        None, description="When these values were observed (RFC 3339)."
    )


_PY_TYPES: dict[str, Any] = {"int": int, "float": float, "floats": list[float]}


def _fields(columns: Any) -> dict[str, Any]:
    """``create_model`` fields of record columns: named by their status key (snake_case, so the
    camelCase alias is that key), required or ``None`` by default."""
    out: dict[str, Any] = {}
    for c in columns:
        py = _PY_TYPES[c.kind]
        name = to_snake(c.status_key)
        if c.required:
            out[name] = (py, Field(..., description=c.status_doc))
        else:
            out[name] = (py | None, Field(None, description=c.status_doc))
    return out


class _LenientModel(_Model):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


def _step_record_model() -> type[BaseModel]:
    """``status.lastStep``: the status columns of the step record (:mod:`npu_lora.api.record`)."""
    fields = _fields(record.STATUS_FIELDS)
    return create_model(
        "StepRecord",
        __base__=_LenientModel,
        __doc__="The numbers of one per-step profile record (see metrics.jsonl).",
        __module__=__name__,
        **fields,
    )


StepRecord = _step_record_model()


class HotStatus(_Model):
    fraction: float = Field(..., description="moe.hotFraction.")
    experts: int = Field(..., description="Hot experts in all layers together.")
    selected_at_step: int = Field(..., description="Step after which the hot set was chosen.")


class PlacementStatus(_Model):
    """``moe.placement: auto``: the two trial medians and the choice (worker)."""

    policy: str = Field(..., description="moe.placement as asked (auto).")
    chosen: str | None = Field(None, description="hot or host-only (null while measuring).")
    decided_at_step: int | None = Field(None, description="Step after which it was chosen.")
    host_only_median_s: float | None = Field(
        None, description="Median forward+backward seconds of the host-only trial steps."
    )
    hot_median_s: float | None = Field(
        None, description="Median forward+backward seconds of the hot trial steps."
    )


class HostStatus(_Model):
    """The host experts setup as resolved on the worker's CPU (``moe.hostDtype`` ``auto``)."""

    dtype: str = Field(..., description="Host expert dtype in use.")
    kernel: str = Field(..., description="Host experts kernel (moe.expertsKernel).")
    kernel_backend: str | None = Field(
        None, description="npu_lora_stream: `cpp:<isa>` or `torch` (fallback)."
    )
    reason: str = Field(..., description="Why this dtype (the capability probe's verdict).")
    warning: str | None = Field(
        None, description="Set when an explicit choice is known to be slow on this CPU."
    )
    layout: str | None = Field(
        None,
        description=(
            "8-bit host dtypes: the experts' layout and where it came from (e.g. `int8 per "
            "output channel, quantised at load`, `float8_e4m3fn 128x128 blocks, read from a "
            "fine-grained FP8 checkpoint`)."
        ),
    )


class CheckpointStatus(_Model):
    step: int = Field(..., description="Step of the last checkpoint.")
    path: str = Field(..., description="Checkpoint directory.")
    time: str = Field(..., description="When it was written (RFC 3339).")


class EvalBest(_Model):
    step: int = Field(..., description="Step of the lowest eval loss so far (adapter-best/).")
    loss: float = Field(..., description="That eval loss.")


class EvalStatus(_Model):
    """The last held-out evaluation (worker; spec.eval)."""

    step: int = Field(..., description="Step after which it ran.")
    loss: float | None = Field(None, description="Mean NLL per label token of the eval rows.")
    perplexity: float | None = Field(None, description="exp(loss).")
    accuracy: float | None = Field(
        None,
        description=(
            "Classification data only: share of rows whose gold answer has the highest "
            "log-likelihood among the candidate answers (calibrated with eval.calibrate)."
        ),
    )
    accuracy_total: float | None = Field(
        None, description="With eval.calibrate: the uncalibrated (total log-likelihood) accuracy."
    )
    examples: int | None = Field(None, description="Rows scored.")
    overlap: int | None = Field(
        None,
        description=(
            "Eval rows that are also training rows (`eval.path` only; absent when none): the "
            "eval loss measures memorisation for them."
        ),
    )
    seconds: float | None = Field(None, description="Wall seconds of the evaluation.")
    best: EvalBest | None = Field(None, description="The lowest eval loss so far.")


class _DistributedBase(_Model):
    """Data-parallel progress of the last reported step (worker, rank 0; spec.distributed)."""

    workers: int = Field(..., description="Worker pods.")
    ranks_per_worker: int = Field(..., description="Ranks in each worker pod.")
    step: int | None = Field(
        None, description="Last step every rank finished (the ranks step together)."
    )


def _distributed_status_model() -> type[BaseModel]:
    """``status.distributed``: the data-parallel columns of the step record
    (:data:`npu_lora.api.record.DISTRIBUTED_STATUS_FIELDS`, required ones first) around the
    fields of :class:`_DistributedBase`."""
    cols = record.DISTRIBUTED_STATUS_FIELDS
    fields = _fields([c for c in cols if c.required])
    fields.update(
        (n, (f.annotation, f)) for n, f in _DistributedBase.model_fields.items()
    )  # re-declared here so they follow the required columns
    fields.update(_fields([c for c in cols if not c.required]))
    return create_model(
        "DistributedStatus",
        __base__=_Model,
        __doc__=_DistributedBase.__doc__,
        __module__=__name__,
        **fields,
    )


DistributedStatus = _distributed_status_model()


class BenchmarkVariant(_Model):
    """One variant of a benchmark case."""

    name: str = Field(..., description="The variant.")
    steps: int = Field(0, description="Measured steps.")
    medians: dict[str, float] = Field(
        default_factory=dict,
        description="Median of every profile column (step record names: step_s, attn_head_s, "
        "host_fwd_s, host_bwd_s, recompute_s, device_calls_per_layer, hot_s, cpu_s, ...).",
    )
    ratio: float | None = Field(
        None, description="Median per-round ratio of step_s to the baseline's (same round)."
    )
    delta_s: float | None = Field(
        None, description="Median per-round step_s difference to the baseline (seconds)."
    )
    same_sign_rounds: int | None = Field(
        None, description="Rounds whose difference has the median's sign."
    )
    rounds: int | None = Field(None, description="Rounds compared with the baseline.")


class BenchmarkCase(_Model):
    """One point of the sweep: its table."""

    seq_len: int = Field(..., description="Sequence length.")
    host_dtype: str = Field(..., description="Host expert dtype.")
    hot_fraction: float = Field(..., description="Hot fraction.")
    baseline: str = Field(..., description="The baseline variant.")
    best: str | None = Field(None, description="Variant with the lowest median s/step.")
    copy_gbs: float | None = Field(None, description="Measured host copy bandwidth (GB/s).")
    triad_gbs: float | None = Field(None, description="Measured host triad bandwidth (GB/s).")
    peer_ratio: float | None = Field(
        None,
        description="host-only+keep_graph / stock transformers+peft (grouped_mm) step_s, "
        "median per-round ratio (when both ran).",
    )
    variants: list[BenchmarkVariant] = Field(default_factory=list, description="The table.")


class BenchmarkStatus(_Model):
    """A benchmark's progress and results (worker)."""

    variants: int | None = Field(None, description="Variants per case.")
    cases_total: int | None = Field(None, description="Cases of the sweep.")
    rounds_total: int | None = Field(None, description="Rounds over all cases.")
    rounds_done: int | None = Field(None, description="Rounds finished over all cases.")
    current: str | None = Field(None, description="The case running now.")
    best: str | None = Field(None, description="Best variant of the last finished case.")
    best_step_seconds: float | None = Field(None, description="Its median s/step.")
    best_ratio: float | None = Field(None, description="Its ratio to the baseline.")
    output: str | None = Field(None, description="Where bench.md/.jsonl/.png were written.")
    cases: list[BenchmarkCase] | None = Field(None, description="The tables, one per case.")


class CompileStatus(_Model):
    """The precompile Job's progress (``spec.device.precompile``; operator-owned)."""

    done: int = Field(0, description="Graphs compiled or found in the cache.")
    total: int = Field(0, description="Graphs in the run's compile plan.")
    eta_seconds: float | None = Field(None, description="Estimated seconds until all are done.")
    job_name: str | None = Field(None, description="The precompile Job.")


class MoEFinetuneStatus(_Model):
    """Owned in disjoint subtrees: the operator writes phase..message, the worker the rest."""

    # operator-owned
    phase: Literal["Pending", "Compiling", "Running", "Succeeded", "Failed", "Suspended"] | None = (
        Field(
            None,
            description="Pending, Compiling (device.precompile), Running, Succeeded, Failed or "
            "Suspended (operator).",
        )
    )
    compile: CompileStatus | None = Field(
        None, description="Device graphs precompiled before training (operator; device.precompile)."
    )
    conditions: list[Condition] | None = Field(None, description="Typed conditions (operator).")
    job_name: str | None = Field(None, description="The run's Job (operator).")
    pod_name: str | None = Field(None, description="The current or last worker pod (operator).")
    node_name: str | None = Field(None, description="Node of that pod (operator).")
    attempts: int | None = Field(None, description="Worker pods started so far (operator).")
    start_time: str | None = Field(None, description="When the Job started (operator).")
    completion_time: str | None = Field(None, description="When the run ended (operator).")
    observed_generation: int | None = Field(None, description="Last generation acted on.")
    message: str | None = Field(None, description="Last notable event, human-readable.")
    # worker-owned
    progress: Progress | None = Field(None, description="Step progress (worker).")
    trainer_status: TrainerStatus | None = Field(
        None,
        description="Progress and metrics under Kubeflow Trainer's names (KEP-2779; worker).",
    )
    last_step: StepRecord | None = Field(None, description="Last step's profile (worker).")
    step_seconds_median: float | None = Field(
        None, description="Median step seconds after warm-up (worker)."
    )
    hot: HotStatus | None = Field(None, description="The hot-expert set (worker).")
    placement: PlacementStatus | None = Field(
        None, description="How placement auto chose (worker)."
    )
    host: HostStatus | None = Field(None, description="Host dtype and experts kernel (worker).")
    last_checkpoint: CheckpointStatus | None = Field(None, description="Last checkpoint (worker).")
    distributed: DistributedStatus | None = Field(
        None, description="Data-parallel ranks and their skew (worker; spec.distributed)."
    )
    benchmark: BenchmarkStatus | None = Field(
        None, description="Benchmark progress and results (worker; spec.benchmark)."
    )
    eval: EvalStatus | None = Field(
        None, description="The last held-out evaluation and the best so far (worker; spec.eval)."
    )
