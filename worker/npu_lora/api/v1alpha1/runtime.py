"""Where and how a run executes: the ``device``, ``distributed``, ``output``, ``checkpoint``,
``reporting``, ``podTemplate`` and ``resources`` sections of the spec."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from npu_lora.api import backends as registry
from npu_lora.api.v1alpha1.base import (
    DNS_SUBDOMAIN_PATTERN,
    MAX_PATH,
    RESOURCE_QUANTITY_PATTERN,
    VolumeRef,
    _Model,
    cel,
    quantity_bytes,
)

#: ``device.precompile: true`` without a cache to compile into (CEL and pydantic)
PRECOMPILE_NEEDS_CACHE = (
    "device.precompile: true needs device.compileCache (the volume the graphs are compiled "
    "into and the training pod reads)"
)


class DeviceSpec(_Model):
    """The accelerator."""

    backend: Literal[registry.choices()] = Field(  # type: ignore[valid-type]
        "auto",
        description=registry.describe(),
    )
    cards: int = Field(
        1,
        ge=0,
        le=8,
        description=(
            f"Accelerator cards requested from Kubernetes (`{registry.card_resource()}`). 0: "
            f"none (not with backend {' or '.join(registry.accelerators())})."
        ),
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description=(
            "dtype of the device side (embeddings, attention, norms, head, LoRA). Every device "
            "graph compiles for RNGD in float32 (tiny widths, checked with `npu-lora "
            "rngd-check`); bfloat16 halves device memory and transfers."
        ),
    )
    compile_cache: VolumeRef | None = Field(
        None,
        description="Volume for the furiosa compile cache, so a restarted run does not recompile.",
    )
    precompile: bool | None = Field(
        None,
        description=(
            "Compile the run's device graphs (`npu-lora compile-plan`) before the training Job, "
            "one pod per graph of an Indexed Job on CPU nodes (no card requested), into "
            "`compileCache` (a ReadWriteMany claim, required with `true`); graphs already there "
            "are skipped. A YAML boolean: `true` or `false`; omitted: auto (on for backend "
            "`furiosa` when `compileCache` is set, off elsewhere)."
        ),
    )

    product: Literal[registry.products()] | None = Field(  # type: ignore[valid-type]
        None,
        description=(
            "The card product the run must land on: a required node affinity on the node "
            "label the backend's feature discovery sets ("
            + "; ".join(
                f"{e.name}: `{e.node.product_label}`"
                for e in registry.node_facts()  # type: ignore[union-attr]
            )
            + "), beside the family label every run of the backend requires. Also a part of "
            "the compile plan's keys: graphs compiled for one product never serve another. "
            "Default: any product of the family."
        ),
    )
    partition: Literal[registry.partitions()] | None = Field(  # type: ignore[valid-type]
        None,
        description=(
            "Request partitions of cards instead of whole cards (the device plugin's "
            "partitioned resources: "
            + "; ".join(
                ", ".join(
                    f"`{e.partition_resource(p)}` ({n} a card)"
                    for p, n in e.node.partitions  # type: ignore[union-attr]
                )
                for e in registry.node_facts()
            )
            + "): `cards` then counts partitions, one training rank each. The device side of "
            "the model must fit one partition's memory (checked for presets)."
        ),
    )

    @field_validator("precompile", mode="before")
    @classmethod
    def _precompile_bool(cls, v: Any) -> Any:
        """Only YAML booleans: the string form (``"true"``, ``"auto"``) of v1alpha1's first
        release is refused with the form to write instead (a structural schema cannot take
        both a boolean and a string)."""
        if isinstance(v, str):
            hint = (
                "omit the field for auto"
                if v.strip().lower() == "auto"
                else f"write precompile: {v.strip().lower()} without quotes"
                if v.strip().lower() in ("true", "false")
                else "write precompile: true or precompile: false, or omit it for auto"
            )
            raise ValueError(
                f"device.precompile is a YAML boolean now, not the string {v!r}: {hint}"
            )
        return v

    @property
    def precompile_enabled(self) -> bool:
        """``precompile`` resolved: omitted (auto) is on for ``furiosa`` (and ``auto`` with
        cards)."""
        if self.precompile is not None:
            return self.precompile
        if self.backend == "auto":
            return self.cards > 0
        return registry.entry(self.backend).precompile

    @model_validator(mode="after")
    def _precompile_needs_cache(self) -> DeviceSpec:
        if self.precompile and self.compile_cache is None:
            raise ValueError(PRECOMPILE_NEEDS_CACHE)
        return self

    @model_validator(mode="after")
    def _cards_for_accelerators(self) -> DeviceSpec:
        if self.backend in registry.accelerators() and self.cards < 1:
            raise ValueError(f"device.cards must be at least 1 with backend {self.backend}")
        return self

    @model_validator(mode="after")
    def _node_facts(self) -> DeviceSpec:
        node = registry.node_backend(self.backend, self.cards)
        for key in ("product", "partition"):
            value = getattr(self, key)
            if value is None:
                continue
            if node is None:
                raise ValueError(
                    f"device.{key} {value!r} needs backend "
                    f"{' or '.join(e.name for e in registry.node_facts())} (or auto with cards); "
                    f"backend {self.backend} with {self.cards} card(s) has no {key}s"
                )
            allowed = node.node.products if key == "product" else dict(node.node.partitions)  # type: ignore[union-attr]
            if value not in allowed:
                raise ValueError(
                    f"device.{key} {value!r} is not one of backend {node.name}'s: {tuple(allowed)}"
                )
        return self

    @property
    def node_backend(self) -> registry.BackendEntry | None:
        """The backend whose node labels and resources this run uses (None: no card backend)."""
        return registry.node_backend(self.backend, self.cards)

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    *registry.card_rule(),
                    field_path=".cards",
                ),
                cel(
                    "!has(self.precompile) || !self.precompile || has(self.compileCache)",
                    PRECOMPILE_NEEDS_CACHE,
                    field_path=".precompile",
                ),
                *registry.node_rules(),
            ]
        }
    )


class DistributedSpec(_Model):
    """Data-parallel training on ``torch.distributed``: ``workers`` pods (one Indexed Job with a
    headless Service for the rendezvous when more than one) × ``ranksPerWorker`` ranks each, one
    training rank per card. Every rank trains on its own ``training.batchSize`` sequences of
    each micro-batch (a global batch of ``batchSize`` × world size); the LoRA gradients and the
    routing counts are all-reduced (gloo, on the host) every optimizer step; rank 0 alone writes
    the run directory and reports status."""

    workers: int = Field(
        1, ge=1, le=256, description="Worker pods (nodes); more than one: an Indexed Job."
    )
    ranks_per_worker: int | None = Field(
        None,
        ge=1,
        le=8,
        description=(
            "Training ranks (processes) in each worker, one per card; at most `device.cards` "
            "when cards are requested. Default: `device.cards` (at least 1). The ranks of one "
            "worker share one copy of the host expert weights."
        ),
    )
    rendezvous_timeout_seconds: int = Field(
        300,
        ge=5,
        le=86400,
        description=(
            "Fail the run (exit code 4, condition reason RendezvousTimeout) when not every rank "
            "has joined the process group within this many seconds."
        ),
    )
    port: int = Field(
        29500, ge=1024, le=65535, description="TCP port of the rendezvous on worker 0 (rank 0)."
    )
    shared_pass: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "One host expert pass per worker: its ranks hand each layer's routed tokens to one "
            "pass over their union (local rank 0 runs it with all their threads), so the "
            "worker reads each hit expert's weights once per layer and direction instead of "
            "once per rank; results are bitwise those of each rank alone with "
            "`npu_lora_stream`. `auto`: on with more than one rank per worker, shared expert "
            "weights (no `lora.trainExperts`) and `moe.expertsKernel: npu_lora_stream`; "
            "`on`: with any kernel (shared weights still needed); `off`: every rank streams "
            "its own."
        ),
    )

    def ranks(self, cards: int) -> int:
        """Ranks per worker: ``ranksPerWorker``, else ``cards`` (at least 1)."""
        return self.ranks_per_worker if self.ranks_per_worker is not None else max(1, cards)

    def world_size(self, cards: int) -> int:
        return self.workers * self.ranks(cards)


class OutputSpec(_Model):
    """The run directory (config.yaml, metrics.jsonl, adapter/, checkpoint/, summary.json)."""

    path: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_PATH,
        description=(
            "Run directory. Relative to the volume root when `volume` is set. Default: "
            "`runs/<name>` locally, `<name>` inside the output volume in a cluster."
        ),
    )
    volume: VolumeRef | None = Field(
        None, description="Volume for the run directory (a cluster run without one loses it)."
    )

    @field_validator("path")
    @classmethod
    def _own_directory(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = [p for p in v.replace("\\", "/").split("/") if p not in ("", ".")]
        if not parts:
            raise ValueError(
                "output.path must name a directory of its own, not the volume root "
                "(e.g. the run's name)"
            )
        if ".." in parts or "\x00" in v:
            raise ValueError("output.path must not contain '..'")
        return v

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.path) || (self.path.matches('[^./]') && "
                    "!self.path.matches('(^|/)[.][.](/|$)'))",
                    "path must name a directory of its own (not the volume root, no '..')",
                    field_path=".path",
                )
            ]
        }
    )


class CheckpointSpec(_Model):
    every_steps: int = Field(
        50, ge=1, description="Write a checkpoint every N optimizer steps (and at the end)."
    )


class ReportingSpec(_Model):
    every_steps: int = Field(
        1, ge=1, description="Patch the resource's status at most every N steps."
    )
    min_interval_seconds: float = Field(
        5.0, ge=0.0, description="...and at most once per this many seconds (the last step always)."
    )


class PodTemplateSpec(_Model):
    """Scheduling and pod-level settings copied to the Job's pod template."""

    node_selector: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        None, max_length=32, description="Pod nodeSelector."
    )
    tolerations: list[dict[str, Any]] | None = Field(
        None, max_length=32, description="Pod tolerations (core/v1 Toleration objects)."
    )
    affinity: dict[str, Any] | None = Field(None, description="Pod affinity (core/v1 Affinity).")
    priority_class_name: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Pod priorityClassName."
    )
    service_account_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Run the worker under this ServiceAccount instead of the per-run one "
        "(it then needs get/patch on this run's moefinetunes/status itself).",
    )
    image_pull_secrets: list[dict[str, str]] | None = Field(
        None, max_length=16, description="Pod imagePullSecrets (`[{name: ...}]`)."
    )
    env: list[dict[str, Any]] | None = Field(
        None,
        max_length=128,
        description="Extra environment variables for the worker container (core/v1 EnvVar). "
        "The operator's policy refuses names the worker owns and `valueFrom` sources it does "
        "not allow.",
    )
    env_from: list[dict[str, Any]] | None = Field(
        None,
        max_length=16,
        description="Environment from ConfigMaps/Secrets the operator's policy allows "
        "(core/v1 EnvFromSource; a `prefix` is required).",
    )
    volumes: list[dict[str, Any]] | None = Field(
        None,
        max_length=32,
        description="Extra pod volumes (core/v1 Volume); mount them with `volumeMounts`.",
    )
    volume_mounts: list[dict[str, Any]] | None = Field(
        None,
        max_length=32,
        description="Extra volume mounts for the worker container (core/v1 VolumeMount).",
    )


#: a non-negative resource quantity: an integer or a quantity string
ResourceQuantity = (
    Annotated[int, Field(ge=0)]
    | Annotated[str, Field(pattern=RESOURCE_QUANTITY_PATTERN, max_length=64)]
)


class ResourceRequirements(_Model):
    """core/v1 ResourceRequirements of the worker container (the RNGD request is added).
    ``hugepages-2Mi`` (its limit; a request must equal it, as Kubernetes requires) puts the host
    expert weights on reserved 2 MiB pages, and ``memory: auto`` leaves the bytes they hold out
    of the memory limit (hugetlb pages are charged to the pod's hugetlb limit)."""

    requests: dict[str, ResourceQuantity] | None = Field(
        None, max_length=16, description="Resource requests, e.g. {cpu: '8', memory: 64Gi}."
    )
    limits: dict[str, ResourceQuantity] | None = Field(
        None,
        max_length=16,
        description="Resource limits, e.g. {memory: 96Gi, hugepages-2Mi: 60Gi}.",
    )

    def hugepages_bytes(self, name: str = "hugepages-2Mi") -> int:
        """Bytes of huge pages ``name`` asked for (its limit, else its request); 0 if none."""
        for part in (self.limits, self.requests):
            if part and name in part:
                return quantity_bytes(str(part[name]))
        return 0

    @model_validator(mode="after")
    def _hugepages(self) -> ResourceRequirements:
        req, lim = self.requests or {}, self.limits or {}
        for name in sorted({*req, *lim}):
            if not name.startswith("hugepages-"):
                continue
            where = f"spec.resources.limits.{name}"
            if name not in lim:
                raise ValueError(f"{where} must be set: huge pages are requested as limits")
            try:
                size = quantity_bytes(str(lim[name]))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if name in req and quantity_bytes(str(req[name])) != size:
                raise ValueError(
                    f"spec.resources.requests.{name} must equal {where} (Kubernetes does not "
                    "overcommit huge pages)"
                )
            page = quantity_bytes(name.removeprefix("hugepages-"))
            if size % page:
                raise ValueError(f"{where} must be a whole number of {page >> 20} MiB pages")
        return self
