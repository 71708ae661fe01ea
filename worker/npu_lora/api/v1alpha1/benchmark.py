"""``spec.benchmark``: the A/B benchmark instead of training, and its variant pattern."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from npu_lora.api.v1alpha1.base import _Model, cel
from npu_lora.api.variant import HOST_MODIFIERS, PEER_MODIFIERS, Variant

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
            "Variants: `<host-only|hot>[+keep_graph][+sequential|+overlap][+padmax]"
            "[+torch_head][+fp32|+int8|+fp8][+4k][@kernel]` or `peer[+fp32][+sdpa][@kernel]` "
            "(stock transformers + peft, cpu backend only); `+fp32` and `+4k` with host-only "
            "only, `+int8` / `+fp8` (8-bit experts quantised from the engine's own, with each "
            "layer's error against them) with host-only and `npu_lora_stream` only, not with "
            "`+fp32` or `+4k`, "
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
