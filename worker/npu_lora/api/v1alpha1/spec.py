"""The spec's root (:class:`MoEFinetuneSpec`), its update tags read back (:func:`spec_fields`)
and its cross-field rules (CEL and pydantic)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from npu_lora.api.v1alpha1.base import (
    CLUSTER_ONLY,
    DEFAULT_STEPS,
    IMAGE_PATTERN,
    LABEL_VALUE_PATTERN,
    MANAGED_BY,
    MANAGED_BY_PATTERN,
    MAX_PATH,
    OnUpdate,
    _Model,
    cel,
)
from npu_lora.api.v1alpha1.benchmark import BenchmarkSpec
from npu_lora.api.v1alpha1.runtime import (
    CheckpointSpec,
    DeviceSpec,
    DistributedSpec,
    OutputSpec,
    PodTemplateSpec,
    ReportingSpec,
    ResourceRequirements,
)
from npu_lora.api.v1alpha1.sections import (
    DataSpec,
    EvalSpec,
    LoraSpec,
    ModelSpec,
    MoESpec,
    TrainingSpec,
)


class MoEFinetuneSpec(_Model):
    """What to fine-tune, on what, and how the Job runs."""

    model: Annotated[ModelSpec, OnUpdate.IMMUTABLE] = Field(..., description="The base model.")
    data: Annotated[DataSpec, OnUpdate.IMMUTABLE] = Field(..., description="The training data.")
    lora: Annotated[LoraSpec, OnUpdate.IMMUTABLE] = Field(
        default_factory=LoraSpec, description="LoRA adapters."
    )
    moe: Annotated[MoESpec, OnUpdate.IMMUTABLE] = Field(
        default_factory=MoESpec, description="MoE placement and HostMLP mode."
    )
    training: Annotated[TrainingSpec, OnUpdate.IMMUTABLE] = Field(
        default_factory=TrainingSpec, description="The loop."
    )
    eval: Annotated[EvalSpec | None, OnUpdate.IMMUTABLE] = Field(
        None,
        description=(
            "Held-out evaluation (loss, perplexity; accuracy for classification data) every "
            "`everySteps` and at the end: status.eval, metrics.jsonl, summary.json, adapter-best/."
        ),
    )
    device: Annotated[DeviceSpec, OnUpdate.NEW_RUN] = Field(
        default_factory=DeviceSpec, description="The accelerator."
    )
    distributed: Annotated[DistributedSpec | None, OnUpdate.NEW_RUN] = Field(
        None,
        description=(
            "Data-parallel training over several cards and nodes (default: one rank, one pod)."
        ),
    )
    output: Annotated[OutputSpec, OnUpdate.NEW_RUN] = Field(
        default_factory=OutputSpec, description="The run directory."
    )
    checkpoint: Annotated[CheckpointSpec, OnUpdate.WORKER_CONFIG] = Field(
        default_factory=CheckpointSpec, description="Checkpointing."
    )
    reporting: Annotated[ReportingSpec, OnUpdate.WORKER_CONFIG] = Field(
        default_factory=ReportingSpec, description="How often the worker patches status."
    )
    image: Annotated[str | None, OnUpdate.NEW_RUN, CLUSTER_ONLY] = Field(
        None,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="Worker image (default: the operator's configured worker image).",
    )
    resources: Annotated[ResourceRequirements | None, OnUpdate.NEW_RUN, CLUSTER_ONLY] = Field(
        None, description="Worker container resources (the accelerator request is added)."
    )
    suspend: Annotated[bool, OnUpdate.JOB, CLUSTER_ONLY] = Field(
        False, description="Suspend the run (the Job's pods are deleted)."
    )
    backoff_limit: Annotated[int, OnUpdate.NEW_RUN, CLUSTER_ONLY] = Field(
        2, ge=0, le=100, description="Retries of the worker pod (disruptions do not count)."
    )
    active_deadline_seconds: Annotated[int | None, OnUpdate.JOB, CLUSTER_ONLY] = Field(
        None, ge=1, description="Fail the run after this many seconds of running."
    )
    ttl_seconds_after_finished: Annotated[int | None, OnUpdate.JOB, CLUSTER_ONLY] = Field(
        None, ge=0, description="Delete the finished Job (not the MoEFinetune) after this long."
    )
    queue_name: Annotated[str | None, OnUpdate.NEW_RUN, CLUSTER_ONLY] = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="Kueue LocalQueue; copied to the Job as label `kueue.x-k8s.io/queue-name`.",
    )
    managed_by: Annotated[str, OnUpdate.NEW_RUN, CLUSTER_ONLY] = Field(
        MANAGED_BY,
        min_length=1,
        max_length=63,
        pattern=MANAGED_BY_PATTERN,
        description=(
            f"The controller that reconciles this run (immutable). `{MANAGED_BY}` (default): "
            "this operator. Any other value (Kueue MultiKueue's `kueue.x-k8s.io/multikueue`, "
            "which mirrors the run to a worker cluster and copies its status back) makes the "
            "operator leave the run alone: no Job, ConfigMap or RBAC from it, and its status "
            "is never written. The server refuses a change (CEL)."
        ),
    )
    pod_template: Annotated[PodTemplateSpec | None, OnUpdate.NEW_RUN, CLUSTER_ONLY] = Field(
        None, description="Pod scheduling and extra settings."
    )
    resume_from: Annotated[str | None, OnUpdate.WORKER_CONFIG] = Field(
        None,
        min_length=1,
        max_length=MAX_PATH,
        description=(
            "Start from the last checkpoint of this run directory although another run wrote it "
            "(a deleted and re-created run, or another run of the same namespace: its run.json "
            "says so). Relative to the output root (the output volume in a cluster, the run "
            "directory's parent locally): no absolute path, no `..`, no symbolic link on the way. "
            "The training configuration must match; another run's directory is only read. "
            "Without it a run never resumes another run's checkpoint (see Run identity)."
        ),
    )
    benchmark: Annotated[BenchmarkSpec | None, OnUpdate.NEW_RUN] = Field(
        None,
        description=(
            "Run the A/B benchmark instead of training (results in status.benchmark and the "
            "output volume: bench.md, bench.jsonl, bench.png per case)."
        ),
    )

    @model_validator(mode="after")
    def _cross_field(self) -> MoEFinetuneSpec:
        if (
            self.benchmark is None
            and self.moe.placement != "host-only"
            and self.training.steps is not None
            and self.moe.warmup_steps >= self.training.steps
        ):
            raise ValueError(
                f"moe.warmupSteps ({self.moe.warmup_steps}) must be less than training.steps "
                f"({self.training.steps}) with placement {self.moe.placement}"
            )
        if self.lora.train_experts and self.moe.placement == "hot":
            raise ValueError("lora.trainExperts requires moe.placement: host-only or auto")
        if self.lora.train_experts and self.moe.host_dtype in ("int8", "float8_e4m3fn"):
            raise ValueError(
                f"lora.trainExperts cannot train 8-bit experts (moe.hostDtype "
                f"{self.moe.host_dtype}): the expert weights are frozen and quantised on the host "
                f"(no gradient, nowhere to keep full-precision updates); use hostDtype bfloat16 "
                f"or float32 to train them"
            )
        if self.moe.host_dtype in ("int8", "float8_e4m3fn") and (
            self.moe.experts_kernel != "npu_lora_stream"
        ):
            raise ValueError(
                f"moe.hostDtype {self.moe.host_dtype} needs moe.expertsKernel npu_lora_stream "
                f"(the only kernel that computes on 8-bit experts), not {self.moe.experts_kernel}"
            )
        d = self.distributed
        if (
            d is not None
            and d.ranks_per_worker is not None
            and 0 < self.device.cards < d.ranks_per_worker
        ):
            raise ValueError(
                f"distributed.ranksPerWorker ({d.ranks_per_worker}) must be at most "
                f"device.cards ({self.device.cards}): one training rank per card"
            )
        if d is not None and d.world_size(self.device.cards) > 1 and self.benchmark is not None:
            raise ValueError("distributed: more than one rank is not supported with benchmark")
        self._partition_fits()
        return self

    def _partition_fits(self) -> None:
        """A preset's device-side weights must fit one ``device.partition`` (each rank holds
        them whole); a model given by path is checked by the worker's own device."""
        node, part = self.device.node_backend, self.device.partition
        if node is None or part is None or not self.model.preset:
            return
        from npu_lora.api import memory

        cfg = memory.preset_config(self.model.preset)
        need = (
            memory.device_weight_bytes(self, memory.text_config(cfg, self.model.layers))
            if cfg
            else None
        )
        have = node.node.memory_gb(part)  # type: ignore[union-attr]
        if need is not None and have is not None and need > have * 10**9:
            raise ValueError(
                f"device.partition {part!r} holds {have} GB, but one rank's device weights of "
                f"{self.model.preset} in {self.device.dtype} are {need / 1e9:.1f} GB: choose a "
                "larger partition, device.dtype bfloat16, or whole cards"
            )

    model_config = ConfigDict(json_schema_extra=lambda schema: _spec_schema_extra(schema))


def spec_fields(
    on_update: OnUpdate | None = None, *, cluster_only: bool | None = None
) -> tuple[str, ...]:
    """The camelCase names of the :class:`MoEFinetuneSpec` fields tagged ``on_update`` (and,
    when ``cluster_only`` is given, with / without :data:`CLUSTER_ONLY`), in declaration order."""
    out = []
    for name, info in MoEFinetuneSpec.model_fields.items():
        if on_update is not None and on_update not in info.metadata:
            continue
        if cluster_only is not None and (CLUSTER_ONLY in info.metadata) != cluster_only:
            continue
        out.append(info.alias or name)
    return tuple(out)


def immutable_rule() -> dict[str, Any]:
    """The CEL transition rule on ``spec``: the :attr:`OnUpdate.IMMUTABLE` fields never change."""
    names = spec_fields(OnUpdate.IMMUTABLE)
    optional = {
        info.alias or name
        for name, info in MoEFinetuneSpec.model_fields.items()
        if info.default is None and info.default_factory is None
    }

    def same(n: str) -> str:
        if n not in optional:  # defaulted by the schema: always present
            return f"self.{n} == oldSelf.{n}"
        return f"has(self.{n}) == has(oldSelf.{n}) && (!has(self.{n}) || self.{n} == oldSelf.{n})"

    return cel(
        " && ".join(same(n) for n in names),
        f"{', '.join(names[:-1])} and {names[-1]} are immutable once created",
    )


def managed_by_rule() -> dict[str, Any]:
    """The CEL transition rule on ``spec``: ``managedBy`` never changes (a controller hand-over
    mid-run would leave two writers or none). Not an ``OnUpdate.IMMUTABLE`` field: a run
    directory does not record who managed the run."""
    return cel(
        "self.managedBy == oldSelf.managedBy", "managedBy is immutable", field_path=".managedBy"
    )


def _spec_schema_extra(schema: dict[str, Any]) -> None:
    schema["x-kubernetes-validations"] = [
        cel(
            "has(self.benchmark) || self.moe.placement == 'host-only' "
            "|| has(self.training.epochs) "
            f"|| self.moe.warmupSteps < (has(self.training.steps) ? self.training.steps : "
            f"{DEFAULT_STEPS})",
            "moe.warmupSteps must be less than training.steps with placement hot or auto",
            field_path=".moe.warmupSteps",
        ),
        cel(
            "!self.lora.trainExperts || self.moe.placement != 'hot'",
            "lora.trainExperts requires moe.placement: host-only or auto",
            field_path=".lora.trainExperts",
        ),
        cel(
            "!has(self.distributed) || !has(self.distributed.ranksPerWorker) "
            "|| self.device.cards == 0 || self.distributed.ranksPerWorker <= self.device.cards",
            "distributed.ranksPerWorker must be at most device.cards: one training rank per card",
            field_path=".distributed.ranksPerWorker",
        ),
        cel(
            "!has(self.distributed) || !has(self.benchmark) || (self.distributed.workers == 1 "
            "&& (has(self.distributed.ranksPerWorker) ? self.distributed.ranksPerWorker : "
            "(self.device.cards > 1 ? self.device.cards : 1)) == 1)",
            "distributed: more than one rank is not supported with benchmark",
            field_path=".distributed",
        ),
        *path_rules(),
        immutable_rule(),
        managed_by_rule(),
    ]


def _relative(expr: str) -> str:
    """CEL: the string ``expr`` is a relative path that never climbs (no leading ``/``, no
    ``..`` component)."""
    return f"!{expr}.startsWith('/') && !{expr}.matches('(^|/)[.][.](/|$)')"


def path_rules() -> list[dict[str, Any]]:
    """CEL rules of a cluster run's path fields (issue 38): each is relative to its section's
    volume, never absolute, never climbing (the operator's policy checks the same, see
    ``npu_lora_operator.policy.paths``). Local ``npu-lora run`` manifests keep their local
    paths: pydantic does not apply these."""
    m, d = "self.model", "self.data"
    return [
        cel(
            f"!has({m}.path) || (has({m}.volume) && {_relative(m + '.path')})",
            "model.path must be relative to model.volume (set the volume; no leading '/', no '..')",
            field_path=".model.path",
        ),
        cel(
            f"!has({m}.tokenizer) || (has({m}.volume) && {_relative(m + '.tokenizer')})",
            "model.tokenizer must be relative to model.volume (set the volume; no leading "
            "'/', no '..')",
            field_path=".model.tokenizer",
        ),
        cel(
            f"{d}.path.startsWith('example:') ? {d}.path.matches('^example:[a-z0-9][-a-z0-9]*$') "
            f": (has({d}.volume) && {_relative(d + '.path')})",
            "data.path must be relative to data.volume (set the volume; no leading '/', no "
            "'..') or name a packaged example (example:<name>)",
            field_path=".data.path",
        ),
        cel(
            f"!has(self.eval) || !has(self.eval.path) || (has({d}.volume) && "
            f"{_relative('self.eval.path')})",
            "eval.path must be relative to data.volume (set the volume; no leading '/', no '..')",
            field_path=".eval.path",
        ),
        cel(
            "!has(self.output.path) || !self.output.path.startsWith('/')",
            "output.path must be relative to the output volume (no leading '/')",
            field_path=".output.path",
        ),
        cel(
            f"!has(self.resumeFrom) || ({_relative('self.resumeFrom')} && "
            "self.resumeFrom.matches('[^./]'))",
            "resumeFrom must be a run directory relative to the output volume (no leading "
            "'/', no '..', not the volume root)",
            field_path=".resumeFrom",
        ),
    ]
