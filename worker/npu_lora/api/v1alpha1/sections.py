"""What a run trains: the ``model``, ``data``, ``lora``, ``moe``, ``training`` and ``eval``
sections of the spec."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from npu_lora.api.v1alpha1.base import (
    DEFAULT_STEPS,
    MAX_PATH,
    QUANTITY_PATTERN,
    VolumeRef,
    _Model,
    cel,
    quantity_bytes,
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
    max_row_bytes: int = Field(
        4 << 20,
        ge=1024,
        le=256 << 20,
        description=(
            "Longest row in bytes (a line of a TSV/JSONL file, a record's text in a `datasets` "
            "file; the eval file too): a longer one is an error naming `file:line`, raised "
            "before it is tokenised. Default 4 MiB."
        ),
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
    keep_graph: bool | None = Field(
        None,
        description=(
            "HostMLP keeps the MoE block's autograd graph from forward to backward (no recompute); "
            "costs the block's saved activations until that layer's backward. `true`: every "
            "layer keeps it; `false`: every layer recomputes. Omitted (auto): keep it in the most "
            "layers that fit the memory limit (the run's estimate, long rows included; every "
            "layer without a limit; the others recompute; the choice is logged and in "
            "summary.json `keep_graph`)."
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
    host_dtype: Literal["auto", "float32", "bfloat16", "int8", "float8_e4m3fn"] = Field(
        "auto",
        description=(
            "dtype of the expert weights on the host. `auto` picks per CPU (recorded in "
            "summary.json `machine.host`): bfloat16 with `npu_lora_stream` (bf16 operands widened "
            "to fp32 in registers, fp32 accumulation) or on CPUs with native bf16, else float32. "
            "An explicit bfloat16 known to "
            "be slow on the CPU logs a warning and sets `status.host.warning`. "
            "`int8` (symmetric, per output channel) and `float8_e4m3fn` (FP8 e4m3, 128x128 block "
            "scales; an FP8 checkpoint's own scales) hold the frozen experts in 8 bits + fp32 "
            "scales (half the bf16 bytes; `npu_lora_stream` only, dequantised in registers; "
            "router, LoRA and activations keep their dtype; not with `lora.trainExperts`)."
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

    @field_validator("keep_graph", mode="before")
    @classmethod
    def _keep_graph_bool(cls, v: Any) -> Any:
        """Only YAML booleans, omitted for auto (Kubernetes' optional-boolean convention: a
        structural schema cannot take both a boolean and a word)."""
        if isinstance(v, str):
            word = v.strip().lower()
            hint = (
                "omit the field for auto (keep the graph where it fits the memory limit)"
                if word == "auto"
                else f"write keepGraph: {word} without quotes"
                if word in ("true", "false")
                else "write keepGraph: true or keepGraph: false, or omit it for auto"
            )
            raise ValueError(f"moe.keepGraph is a YAML boolean, not the string {v!r}: {hint}")
        return v

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
        max_length=MAX_PATH,
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
