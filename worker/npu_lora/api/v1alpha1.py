"""MoEFinetune ``npu-lora.io/v1alpha1``: spec and status models.

Rules for this file (the CRD generator and the docs test depend on them):
- every field has a ``description``; bounds and enums are expressed as pydantic constraints /
  ``Literal`` so they become OpenAPI ``minimum``/``maximum``/``enum``;
- cross-field rules are written twice, on purpose: as CEL (``x-kubernetes-validations`` in
  ``json_schema_extra``, enforced by the apiserver before the operator sees the object) and as
  pydantic ``model_validator`` (enforced by ``npu-lora run`` without a cluster); tests check
  both agree on examples;
- every field of :class:`MoEFinetuneSpec` is tagged with what a change does to a created run
  (``Annotated[T, OnUpdate.X]``, see :class:`OnUpdate`); the CEL immutability rule, the operator
  (which change it copies to the Job, to the worker config, or only warns about), the worker
  config and the run directory's resume check read those tags (:func:`spec_fields`);
- YAML keys are camelCase (``alias``), Python attributes snake_case.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from npu_lora.api import record
from npu_lora.api.variant import HOST_MODIFIERS, PEER_MODIFIERS, Variant

GROUP = "npu-lora.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MoEFinetune"
PLURAL = "moefinetunes"
SINGULAR = "moefinetune"
SHORT_NAME = "mft"
#: ``training.steps`` when neither ``steps`` nor ``epochs`` is set.
DEFAULT_STEPS = 100

#: Exit code of the worker for an invalid configuration or input (not retried: the Job's
#: podFailurePolicy fails the Job at once).
EXIT_CONFIG_ERROR = 2
#: Exit code of the worker when the loss became non-finite (not retried either).
EXIT_NONFINITE_LOSS = 3
#: Exit code of a data-parallel worker whose ranks did not all join the process group within
#: ``spec.distributed.rendezvousTimeoutSeconds`` (the Job fails at once: condition reason
#: ``RendezvousTimeout``).
EXIT_RENDEZVOUS_TIMEOUT = 4

#: The worker container's environment naming the MoEFinetune it runs for: set by the operator's
#: Job builder, read by the worker's status reporter.
ENV_NAME = "NPU_LORA_RESOURCE_NAME"
ENV_NAMESPACE = "NPU_LORA_RESOURCE_NAMESPACE"
ENV_UID = "NPU_LORA_RESOURCE_UID"
#: Content type of the JSON merge patches that the operator and the worker send to the API
#: (each owns a disjoint subtree of ``status``).
MERGE_PATCH = "application/merge-patch+json"

#: ``metadata.name`` (and ``namespace``): a DNS-1123 label, because the name becomes the Job's,
#: and ``<name>-worker`` / ``<name>-config`` the ServiceAccount's and ConfigMap's.
NAME_MAX_LENGTH = 63
NAME_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE_MESSAGE = (
    "must be a DNS-1123 label: at most 63 characters, only lowercase letters, digits and '-', "
    "starting and ending with a letter or digit (it names the run's Job)"
)
_NAME_RE = re.compile(NAME_PATTERN)


def is_dns_label(name: str) -> bool:
    """``name`` is a valid run name (:data:`NAME_PATTERN`, at most :data:`NAME_MAX_LENGTH`)."""
    return len(name) <= NAME_MAX_LENGTH and _NAME_RE.fullmatch(name) is not None


def dns_label_name(text: str) -> str:
    """A valid run name made from ``text`` (a file stem): lowercased, other characters → ``-``."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:NAME_MAX_LENGTH].strip("-")
    return name or "run"


class OnUpdate(StrEnum):
    """What changing a :class:`MoEFinetuneSpec` field does to a created run (one tag a field)."""

    #: rejected by the server (CEL transition rule on ``spec``); also what a run directory must
    #: match to be resumed (:mod:`npu_lora.train.rundir`)
    IMMUTABLE = "immutable"
    #: applied to the run's existing Job by the operator
    JOB = "job"
    #: rewrites the worker ConfigMap: takes effect with the next worker pod (a retry, a resume)
    WORKER_CONFIG = "worker-config"
    #: cannot change the created Job (its pod template is immutable): the operator warns; takes
    #: effect only in a new run (delete and re-create)
    NEW_RUN = "new-run"


class _ClusterOnly:
    """Tag of a spec field that only shapes the Kubernetes Job: ``npu-lora run`` ignores it, so
    the operator leaves it out of the worker config."""

    def __repr__(self) -> str:
        return "CLUSTER_ONLY"


CLUSTER_ONLY = _ClusterOnly()


def cel(rule: str, message: str, *, reason: str | None = None, field_path: str | None = None):
    """One ``x-kubernetes-validations`` entry."""
    out: dict[str, Any] = {"rule": rule, "message": message}
    if reason:
        out["reason"] = reason
    if field_path:
        out["fieldPath"] = field_path
    return out


#: CEL rules at the root of the CRD schema (only there can a rule see ``self.metadata.name``).
METADATA_CEL_RULES = [
    cel(
        "!has(self.metadata.name) || (size(self.metadata.name) <= 63 && "
        f"self.metadata.name.matches('{NAME_PATTERN}'))",
        f"metadata.name {NAME_RULE_MESSAGE}",
    )
]


#: DNS-1123 subdomain (names of PersistentVolumeClaims, ConfigMaps, ServiceAccounts, classes)
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: a Kubernetes label value (``queueName`` becomes one)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: a relative path that never climbs: no leading ``/``, no ``..`` component (RE2: no lookahead)
_COMPONENT = r"(\.|\.\.[^/]+|\.?[^./][^/]*)"
RELATIVE_PATH_PATTERN = rf"^{_COMPONENT}(/{_COMPONENT})*/?$"
#: a non-negative Kubernetes resource quantity (``8``, ``500m``, ``64Gi``, ``1.5``, ``1e3``)
RESOURCE_QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE]\+?[0-9]+))?$"
)
#: an image reference: no whitespace, no control characters
IMAGE_PATTERN = r"^[^\s]+$"
#: longest free path string (PATH_MAX)
MAX_PATH = 4096


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        allow_inf_nan=False,
    )

    def to_api(self) -> dict[str, Any]:
        """camelCase dict as it appears in YAML/JSON, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class VolumeRef(_Model):
    """Where a directory comes from inside the cluster. Exactly one of claimName / hostPath."""

    claim_name: str | None = Field(
        None,
        description="Name of a PersistentVolumeClaim in the run's namespace to mount.",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    host_path: str | None = Field(
        None,
        description="A directory on the node (hostPath volume); for single-node or dev clusters.",
        min_length=1,
        max_length=MAX_PATH,
        pattern="^/",
    )
    sub_path: str | None = Field(
        None,
        description="Sub-directory of the volume to mount instead of its root (relative, no `..`).",
        max_length=MAX_PATH,
        pattern=RELATIVE_PATH_PATTERN,
    )
    read_only: bool | None = Field(
        None,
        description="Mount read-only (default: true for model and data, false for output and cache).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> VolumeRef:
        if (self.claim_name is None) == (self.host_path is None):
            raise ValueError("set exactly one of claimName or hostPath")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.claimName) != has(self.hostPath)",
                    "set exactly one of claimName or hostPath",
                )
            ]
        }
    )


class ModelSpec(_Model):
    """The base model: a Hugging Face model directory, or a preset built from a config."""

    path: str | None = Field(
        None,
        description=(
            "Hugging Face model directory (config.json + safetensors, sharded or not, and its "
            "tokenizer). Relative to the volume root when `volume` is set, else a path in the "
            "worker's filesystem."
        ),
        min_length=1,
        max_length=MAX_PATH,
    )
    preset: Literal["tiny-qwen3-moe", "qwen3-30b-a3b"] | None = Field(
        None,
        description=(
            "Build the model from a named config with random weights and a fixed seed, no download: "
            "`tiny-qwen3-moe` (tests, laptops; a few MB) or `qwen3-30b-a3b` (the real Qwen3-30B-A3B "
            "widths; use `layers` to reduce depth)."
        ),
    )
    layers: int | None = Field(
        None,
        ge=1,
        le=128,
        description="Override the number of decoder layers (presets and local configs).",
    )
    tokenizer: str | None = Field(
        None,
        description=(
            "Tokenizer directory (tokenizer.json, or vocab.json + merges.txt). Default: the model "
            "directory; for presets, a byte-level tokenizer the project builds offline. Relative to "
            "the volume root when `volume` is set. The embedding grows to the tokenizer's size."
        ),
        min_length=1,
        max_length=MAX_PATH,
    )
    volume: VolumeRef | None = Field(None, description="Volume holding the model directory.")

    @model_validator(mode="after")
    def _path_or_preset(self) -> ModelSpec:
        if (self.path is None) == (self.preset is None):
            raise ValueError("set exactly one of model.path or model.preset")
        if self.volume is not None and self.path is None:
            raise ValueError("model.volume needs model.path (the directory inside the volume)")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("has(self.path) != has(self.preset)", "set exactly one of path or preset"),
                cel("!has(self.volume) || has(self.path)", "volume needs path"),
            ]
        }
    )


class DataSpec(_Model):
    """Training data: NSMC TSV, JSONL, chat or alpaca rows (also from parquet / JSON / CSV files
    and `datasets.save_to_disk` directories), tokenised to a fixed length (docs/data.md)."""

    path: str = Field(
        ...,
        min_length=1,
        max_length=MAX_PATH,
        description=(
            "Data file or directory. Relative to the volume root when `volume` is set. "
            "`.tsv`/`.txt`: NSMC; `.jsonl`: JSON lines; `.parquet`, `.json`, `.csv` and a "
            "`datasets.save_to_disk` directory are read with Hugging Face `datasets`. "
            "`example:<name>` picks a dataset shipped inside the package (`example:nsmc-mini`, "
            "`example:jsonl-mini`, `example:chat-mini`)."
        ),
    )
    format: Literal["auto", "nsmc", "jsonl", "chat", "alpaca"] = Field(
        "auto",
        description=(
            "`nsmc`: `id<TAB>document<TAB>label` (TSV with a header, no quoting; or `document` + "
            '`label` columns); `jsonl`: rows `{"text": ...}` or `{"prompt": ..., "completion": '
            '...}`; `chat`: rows `{"messages": [{"role", "content"}, ...]}` (or the sharegpt '
            '`{"conversations": [{"from", "value"}, ...]}`), rendered with the tokenizer\'s chat '
            "template, loss on assistant tokens only; `alpaca`: rows `{instruction, input, "
            "output}`, loss on the output only; `auto`: `.tsv`/`.txt` → nsmc, else by the first "
            "row's fields (messages/conversations → chat, instruction + output → alpaca, "
            "document + label → nsmc, else jsonl)."
        ),
    )
    template: str | None = Field(
        None,
        max_length=4096,
        description=(
            "Prompt template for classification data (NSMC); `{text}` is replaced by the document "
            "and the answer (label word) follows. Default: a short Korean sentiment prompt."
        ),
    )
    overflow: Literal["truncate", "drop"] = Field(
        "truncate",
        description=(
            "An example longer than `training.seqLen`: `truncate` keeps its first seqLen tokens "
            "(NSMC / prompt rows: the document or prompt is cut, the answer kept), `drop` leaves "
            "it out. Both are counted in the summary's data stats (`truncated`, `dropped`)."
        ),
    )
    packing: bool = Field(
        False,
        description=(
            "Pack several examples into one seqLen row (best-fit decreasing) with attention kept "
            "inside each example (block-diagonal causal mask, positions restart per example): "
            "fewer padding tokens per step, same static shapes."
        ),
    )
    max_examples: int | None = Field(
        None, ge=1, description="Use at most this many examples (after shuffling with the seed)."
    )
    volume: VolumeRef | None = Field(None, description="Volume holding the data file.")


class LoraSpec(_Model):
    """LoRA adapters (peft) on the attention projections."""

    r: int = Field(16, ge=1, le=1024, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha (scaling = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        min_length=1,
        max_length=64,
        description="Module names to adapt (peft `target_modules`), e.g. q_proj, k_proj, v_proj, o_proj.",
    )
    train_experts: bool = Field(
        False,
        description=(
            "Also train the expert weights in full (full fine-tuning of `experts.gate_up_proj` and "
            "`experts.down_proj`) besides the LoRA adapters. Requires `moe.placement: host-only` or `auto` (then host-only)."
        ),
    )


#: A Kubernetes quantity of bytes (``12Gi``, ``512Mi``, ``1.5G``, ``2000000000``).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_QUANTITY_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    **{u: 1024 ** (i + 1) for i, u in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def quantity_bytes(text: str) -> int:
    """``12Gi`` → 12884901888 (binary and decimal suffixes; no milli, no exponent)."""
    m = _QUANTITY_RE.fullmatch(str(text).strip())
    if m is None:
        raise ValueError(
            f"{text!r} is not a quantity of bytes: use digits with an optional suffix Ki, Mi, "
            "Gi, Ti, Pi, Ei (powers of 1024) or k, M, G, T, P, E (powers of 1000), e.g. 12Gi"
        )
    unit = m.group(2) or ""
    return int(
        float(str(text).strip()[: len(str(text).strip()) - len(unit)]) * _QUANTITY_UNITS[unit]
    )


class MoESpec(_Model):
    """Where the MoE blocks run and how HostMLP keeps its graph."""

    placement: Literal["auto", "host-only", "hot"] = Field(
        "auto",
        description=(
            "`host-only`: every expert runs on the host CPU; `hot`: after `warmupSteps` the "
            "most-routed experts (`hotFraction` of each layer, or `hotMemory` across layers) "
            "move to the device; `auto`: choose the hot set like `hot`, then run 3 rounds of "
            "one host-only and one hot step (alternating order) and keep the placement with the "
            "lower median step (log, `status.placement`, summary.json). With "
            "`lora.trainExperts` auto means host-only."
        ),
    )
    hot_fraction: float = Field(
        0.25,
        gt=0.0,
        le=1.0,
        description="Fraction of each layer's experts moved to the device (placement `hot`).",
    )
    warmup_steps: int = Field(
        4, ge=0, description="Host-only steps that count routing before the hot set is chosen."
    )
    hot_memory: str | None = Field(
        None,
        description=(
            "Device memory for hot experts (a quantity, e.g. `12Gi`): instead of `hotFraction` "
            "per layer, the most-routed experts across all layers that fit (in the device "
            "dtype). summary.json reports the bytes used and the routed-token coverage vs the "
            "per-layer rule with the same budget."
        ),
        json_schema_extra={"pattern": QUANTITY_PATTERN},
    )
    hot_refresh_steps: int | None = Field(
        None,
        ge=1,
        description=(
            "Re-choose the hot set every N steps from a routing histogram that halves each "
            "period; only the experts that change are copied (counted in the `move_bytes` and "
            "copy columns). Null: the hot set is chosen once."
        ),
    )
    keep_graph: bool = Field(
        True,
        description=(
            "HostMLP keeps the MoE block's autograd graph from forward to backward (no recompute); "
            "costs the block's saved activations until that layer's backward."
        ),
    )
    overlap: bool = Field(
        False,
        description=(
            "Placement `hot` on a cuda/furiosa device: issue the hot-expert call asynchronously "
            "and compute the cold experts on the host meanwhile. Off by default: on an H200 it "
            "gave no gain (0.99-1.07x the sequential step, S=512) and its gradients matched the "
            "sequential path to rounding, not bit for bit."
        ),
    )
    host_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "dtype of the expert weights on the host. `auto` picks per CPU (recorded in "
            "summary.json `machine.host`): bfloat16 with `npu_lora_stream` (bf16 operands widened "
            "to fp32 in registers, fp32 accumulation) or on CPUs with native bf16, else float32. "
            "An explicit bfloat16 known to "
            "be slow on the CPU logs a warning and sets `status.host.warning`."
        ),
    )
    experts_kernel: Literal["grouped_mm", "eager", "npu_lora_sorted", "npu_lora_stream"] = Field(
        "npu_lora_stream",
        description=(
            "Host experts kernel: `npu_lora_stream` (C++ streaming kernel, each hit expert's "
            "weights read once per direction, torch fallback where it cannot build), "
            "transformers' `grouped_mm` or `eager`, or `npu_lora_sorted` (tokens sorted by "
            "expert, torch ops, deterministic backward)."
        ),
    )
    host_threads: int | None = Field(
        None, ge=1, le=1024, description="torch intra-op threads for the host (default: all cores)."
    )
    bucket_sizes: list[int] | None = Field(
        None,
        min_length=1,
        description=(
            "Static token-group sizes for the batched hot-expert call (default: powers of two up "
            "to the tokens per step). Per call every hot expert's tokens are padded to one "
            "bucket, chosen to minimise padded bytes plus host reads of the experts whose tokens "
            "overflow it; overflow tokens are computed on the host."
        ),
    )

    @field_validator("hot_memory")
    @classmethod
    def _check_hot_memory(cls, v: str | None) -> str | None:
        if v is not None and quantity_bytes(v) <= 0:
            raise ValueError(f"{v!r} must be more than 0 bytes")
        return v

    @property
    def hot_memory_bytes(self) -> int | None:
        return None if self.hot_memory is None else quantity_bytes(self.hot_memory)


class TrainingSpec(_Model):
    """The optimisation loop."""

    steps: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description=(
            "Optimizer steps to run. Exclusive with `epochs`; when neither is set, 100 steps."
        ),
    )
    epochs: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description=(
            "Passes over the training data instead of `steps`: steps = ceil(epochs × examples / "
            "(batchSize × gradAccumulation × ranks)), computed when the data is read (held-out "
            "`eval.fraction` rows excluded). Exclusive with `steps`."
        ),
    )
    scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description=(
            "Learning-rate schedule after the warm-up (transformers' scheduler functions): "
            "`constant`, `linear` decay to 0, or `cosine` decay to 0 at the last step."
        ),
    )
    warmup_ratio: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description=(
            "Linear learning-rate warm-up over this fraction of the steps (rounded up). "
            "Exclusive with `warmupSteps`; default: no warm-up."
        ),
    )
    warmup_steps: int | None = Field(
        None,
        ge=0,
        le=10_000_000,
        description="Linear learning-rate warm-up over this many steps. Exclusive with `warmupRatio`.",
    )
    seq_len: int = Field(
        128, ge=8, le=32768, description="Fixed sequence length (static shapes; pad/truncate)."
    )
    batch_size: int = Field(1, ge=1, le=4096, description="Sequences per micro-batch.")
    grad_accumulation: int = Field(
        1, ge=1, le=4096, description="Micro-batches accumulated per optimizer step."
    )
    learning_rate: float = Field(2e-4, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    max_grad_norm: float | None = Field(
        1.0, gt=0.0, description="Clip the global gradient norm to this value (null: no clipping)."
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for init, data order and dropout.")

    @model_validator(mode="before")
    @classmethod
    def _default_steps(cls, data: Any) -> Any:
        """``steps: 100`` when neither ``steps`` nor ``epochs`` is given (no schema default: the
        apiserver would fill it in next to ``epochs``)."""
        if isinstance(data, dict) and all(data.get(k) is None for k in ("steps", "epochs")):
            return {**data, "steps": DEFAULT_STEPS}
        return data

    @field_validator("epochs")
    @classmethod
    def _steps_or_epochs(cls, v: float | None, info: Any) -> float | None:
        if v is not None and info.data.get("steps") is not None:
            raise ValueError(
                f"exclusive with training.steps (got steps {info.data['steps']} and epochs {v}): "
                "set exactly one"
            )
        return v

    @field_validator("warmup_steps")
    @classmethod
    def _warmup_one_way(cls, v: int | None, info: Any) -> int | None:
        if v is not None and info.data.get("warmup_ratio") is not None:
            raise ValueError(
                f"exclusive with training.warmupRatio (got warmupRatio {info.data['warmup_ratio']} "
                f"and warmupSteps {v}): set at most one"
            )
        return v

    def total_steps(self, examples: int, world: int = 1) -> int:
        """Optimizer steps of the run: ``steps``, or ``epochs`` over ``examples`` training rows."""
        if self.steps is not None:
            return self.steps
        per_step = self.batch_size * self.grad_accumulation * max(world, 1)
        return max(1, math.ceil(float(self.epochs or 1) * examples / per_step - 1e-9))

    def warmup_for(self, total: int) -> int:
        """Warm-up steps of a run of ``total`` steps."""
        if self.warmup_steps is not None:
            return min(self.warmup_steps, total)
        if self.warmup_ratio is not None:
            return min(math.ceil(self.warmup_ratio * total), total)
        return 0

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.steps) && has(self.epochs))",
                    "set exactly one of steps or epochs",
                    field_path=".epochs",
                ),
                cel(
                    "!(has(self.warmupRatio) && has(self.warmupSteps))",
                    "set at most one of warmupRatio or warmupSteps",
                    field_path=".warmupSteps",
                ),
            ]
        }
    )


class EvalSpec(_Model):
    """Held-out evaluation: a file, or a seeded fraction of the training data."""

    path: str | None = Field(
        None,
        min_length=1,
        description=(
            "Evaluation data file, read like `data.path`: same format, template and reader, on "
            "the data volume when `data.volume` is set. Exclusive with `fraction`."
        ),
    )
    fraction: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description=(
            "Hold out this fraction of the training examples (a seeded shuffle, "
            "`training.seed`): scored, never trained on. Exclusive with `path`."
        ),
    )
    every_steps: int | None = Field(
        None,
        ge=1,
        description="Evaluate every N optimizer steps (and always after the last step).",
    )
    max_examples: int | None = Field(
        None,
        ge=1,
        description="Score at most this many examples (after shuffling with the seed).",
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Sequences per eval forward (default: training.batchSize, the same shapes).",
    )
    calibrate: bool = Field(
        False,
        description=(
            "Classification accuracy from calibrated log-likelihoods: each answer's "
            "log-likelihood after the prompt minus after the same prompt with an empty document "
            "(removes the bias of answer length and class prior that dominates a weak model). "
            "Default: the total log-likelihood."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> EvalSpec:
        if (self.path is None) == (self.fraction is None):
            raise ValueError("set exactly one of eval.path or eval.fraction")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("has(self.path) != has(self.fraction)", "set exactly one of path or fraction"),
            ]
        }
    )


class DeviceSpec(_Model):
    """The accelerator."""

    backend: Literal["auto", "cpu", "cuda", "furiosa"] = Field(
        "auto",
        description=(
            "`furiosa` (RNGD via furiosa-torch), `cuda`, `cpu` (the host stands in for the device), "
            "or `auto` (the first available of furiosa, cuda, cpu)."
        ),
    )
    cards: int = Field(
        1,
        ge=0,
        le=8,
        description=(
            "Accelerator cards requested from Kubernetes (`furiosa.ai/rngd`). 0: none (not with "
            "backend furiosa or cuda)."
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
    precompile: Literal["auto", "true", "false"] = Field(
        "auto",
        description=(
            "Compile the run's device graphs (`npu-lora compile-plan`) before the training Job, "
            "one pod per graph of an Indexed Job on CPU nodes (no card requested), into "
            "`compileCache` (a ReadWriteMany claim); graphs already there are skipped. `auto`: "
            'on for backend `furiosa`, off elsewhere. Quote `"true"`/`"false"` in YAML '
            "(booleans are accepted by `npu-lora run`)."
        ),
    )

    @field_validator("precompile", mode="before")
    @classmethod
    def _precompile_bool(cls, v: Any) -> Any:
        return ("true" if v else "false") if isinstance(v, bool) else v

    @property
    def precompile_enabled(self) -> bool:
        """``precompile`` resolved: ``auto`` is on for ``furiosa`` (and ``auto`` with cards)."""
        if self.precompile != "auto":
            return self.precompile == "true"
        return self.backend == "furiosa" or (self.backend == "auto" and self.cards > 0)

    @model_validator(mode="after")
    def _cards_for_accelerators(self) -> DeviceSpec:
        if self.backend in ("furiosa", "cuda") and self.cards < 1:
            raise ValueError(f"device.cards must be at least 1 with backend {self.backend}")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(self.backend == 'furiosa' || self.backend == 'cuda') || self.cards >= 1",
                    "cards must be at least 1 with backend furiosa or cuda",
                    field_path=".cards",
                )
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
    """core/v1 ResourceRequirements of the worker container (the RNGD request is added)."""

    requests: dict[str, ResourceQuantity] | None = Field(
        None, max_length=16, description="Resource requests, e.g. {cpu: '8', memory: 64Gi}."
    )
    limits: dict[str, ResourceQuantity] | None = Field(
        None, max_length=16, description="Resource limits, e.g. {memory: 96Gi}."
    )


#: The seed's four variants (``npu-lora bench``'s default).
BENCHMARK_VARIANTS = ("host-only", "host-only+keep_graph", "hot", "hot+keep_graph")
#: ``npu-lora bench``'s variant grammar (``npu_lora.api.variant``) as a regular expression, for
#: the CRD's admission check; the combination rules (e.g. ``+sequential`` only with ``hot``) are
#: ``Variant.parse``'s, applied by ``BenchmarkSpec``.
VARIANT_PATTERN = (
    rf"^((host-only|hot)(\+({'|'.join(HOST_MODIFIERS)}))*|peer(\+({'|'.join(PEER_MODIFIERS)}))*)"
    r"(@[a-z_]+)?$"
)


class BenchmarkSpec(_Model):
    """Run the A/B benchmark (``npu-lora bench``) on this spec's model and device instead of
    training: the variants interleaved in rounds (order reversed every other round), per-variant
    medians and paired per-round ratios against the baseline, for every combination of
    ``seqLens`` × ``hostDtypes`` × ``hotFractions`` (one case each). The batches are fixed
    random token ids (labels on the last 8 positions), the same for every variant."""

    variants: list[Annotated[str, Field(pattern=VARIANT_PATTERN, max_length=64)]] = Field(
        default_factory=lambda: list(BENCHMARK_VARIANTS),
        min_length=1,
        max_length=16,
        description=(
            "Variants: `<host-only|hot>[+keep_graph][+sequential|+overlap][+padmax][+legacy]"
            "[+torch_head][+fp32][+4k][@kernel]` or `peer[+fp32][+sdpa][@kernel]` (stock "
            "transformers + peft, cpu backend only); `+fp32` and `+4k` with host-only only, "
            "`+sequential`, `+overlap`, `+padmax` with hot only (`npu-lora bench` modifiers). "
            "Default: the seed's four (host-only, host-only+keep_graph, hot, hot+keep_graph)."
        ),
    )
    baseline: str | None = Field(
        None, description="The variant the others are compared with (default: the first)."
    )
    rounds: int = Field(6, ge=1, le=200, description="Rounds; each runs every variant.")
    steps_per_round: int = Field(
        1, ge=1, le=100, description="Measured steps of each variant per round."
    )
    warmup: int = Field(1, ge=0, le=100, description="Unmeasured steps per variant first.")
    seq_lens: list[Annotated[int, Field(ge=8, le=32768)]] = Field(
        default_factory=lambda: [128],
        min_length=1,
        max_length=8,
        description="Sequence lengths to sweep (one case each).",
    )
    host_dtypes: list[Literal["float32", "bfloat16"]] = Field(
        default_factory=lambda: ["float32"],
        min_length=1,
        max_length=2,
        description="Host expert dtypes to sweep (one case each).",
    )
    hot_fractions: list[Annotated[float, Field(gt=0.0, le=1.0)]] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="Hot fractions to sweep (default: [moe.hotFraction]).",
    )
    batch_size: int = Field(1, ge=1, le=64, description="Sequences per step.")
    layers: int | None = Field(
        None, ge=1, description="Use only the first N decoder layers of the model (default: all)."
    )
    peers: bool = Field(
        False, description="Also run stock transformers + peft (`peer@grouped_mm`, `peer@eager`)."
    )
    bandwidth: bool = Field(
        True,
        description="Measure the host's copy/triad bandwidth before, per round and after.",
    )

    @model_validator(mode="after")
    def _baseline_is_a_variant(self) -> BenchmarkSpec:
        for i, v in enumerate(self.variants):
            try:
                Variant.parse(v)
            except ValueError as e:
                raise ValueError(f"variants[{i}]: {e}") from None
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"variants: duplicates in {self.variants}")
        if self.baseline is not None and self.baseline not in self.variants:
            raise ValueError(f"baseline {self.baseline!r} is not one of the variants")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.baseline) || self.baseline in self.variants",
                    "baseline must be one of the variants",
                    field_path=".baseline",
                ),
            ]
        }
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
    pod_template: Annotated[PodTemplateSpec | None, OnUpdate.NEW_RUN, CLUSTER_ONLY] = Field(
        None, description="Pod scheduling and extra settings."
    )
    resume_from: Annotated[str | None, OnUpdate.WORKER_CONFIG] = Field(
        None,
        min_length=1,
        max_length=MAX_PATH,
        description=(
            "Start from the last checkpoint of this run directory although another run wrote it "
            "(a deleted and re-created run, or a run of another namespace). Relative to the "
            "output root (the output volume in a cluster, the run directory's parent locally). "
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
        return self

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
        immutable_rule(),
    ]


# ---------------------------------------------------------------------------------------------
# status


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


_PY_TYPES: dict[str, type] = {"int": int, "float": float}


class _LenientModel(_Model):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


def _step_record_model() -> type[BaseModel]:
    """``status.lastStep``: the status columns of the step record (:mod:`npu_lora.api.record`)."""
    fields: dict[str, Any] = {}
    for c in record.STATUS_FIELDS:
        py = _PY_TYPES[c.kind]
        if c.required:
            fields[c.name] = (py, Field(..., description=c.status_doc))
        else:
            fields[c.name] = (py | None, Field(None, description=c.status_doc))
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
    seconds: float | None = Field(None, description="Wall seconds of the evaluation.")
    best: EvalBest | None = Field(None, description="The lowest eval loss so far.")


class DistributedStatus(_Model):
    """Data-parallel progress of the last reported step (worker, rank 0; spec.distributed)."""

    world_size: int = Field(..., description="Training ranks in the process group.")
    workers: int = Field(..., description="Worker pods.")
    ranks_per_worker: int = Field(..., description="Ranks in each worker pod.")
    step: int | None = Field(
        None, description="Last step every rank finished (the ranks step together)."
    )
    rank_compute_seconds: list[float] | None = Field(
        None, description="Per rank: seconds of forward/backward of the last step, by rank."
    )
    slowest_rank: int | None = Field(None, description="The rank with the most compute seconds.")
    skew_seconds: float | None = Field(
        None, description="Slowest minus fastest rank's compute seconds (the others' wait)."
    )
    allreduce_seconds: float | None = Field(
        None, description="Gradient all-reduce seconds of the last step (rank 0)."
    )
    allreduce_bytes: int | None = Field(None, description="Gradient bytes all-reduced per step.")


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


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None


class MoEFinetune(_Model):
    """The full object, as a manifest."""

    api_version: Literal["npu-lora.io/v1alpha1"] = Field(API_VERSION, description="API version.")
    kind: Literal["MoEFinetune"] = Field(KIND, description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: MoEFinetuneSpec = Field(..., description="Desired run.")
    status: MoEFinetuneStatus | None = Field(None, description="Observed state.")
