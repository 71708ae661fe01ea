"""The variant grammar of ``npu-lora bench`` (torch-free: the API validates manifests with it).

``Variant.parse`` is the one parser: the CLI's ``--variants``, ``spec.benchmark.variants`` of a
``MoEFinetune`` (``npu_lora.api.v1alpha1.BenchmarkSpec``) and the harness all use it, so a
variant a manifest admits is one the bench runs. It lives in ``api`` (the lowest layer, see
docs/architecture.md) so the API imports it without reaching up; ``npu_lora.bench.variant``
re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HOST_MODIFIERS", "PEER_MODIFIERS", "Q8_MODIFIERS", "Variant"]

#: Modifiers of ``host-only``/``hot`` variants and of ``peer`` variants.
HOST_MODIFIERS = (
    "keep_graph",
    "sequential",
    "padmax",
    "overlap",
    "torch_head",
    "fp32",
    "4k",
    "int8",
    "fp8",
)
#: ``+int8`` / ``+fp8``: the 8-bit format each names (``moe.hostDtype``'s names,
#: ``npu_lora.models.quant.FORMATS``)
Q8_MODIFIERS = {"int8": "int8", "fp8": "float8_e4m3fn"}
PEER_MODIFIERS = ("fp32", "sdpa")


@dataclass(frozen=True)
class Variant:
    """``<placement>[+keep_graph][+sequential][+fp32|+int8|+fp8][@<experts_impl>]`` or ``peer[+fp32][@...]``.

    The A/B modifiers (``+torch_head``, ``+padmax``, ``+fp32``, ``+4k``) are the
    bench's strategies, carried out through the engine's one seam
    (``npu_lora.bench.hooks.VariantHooks``, an ``npu_lora.engine.EngineHooks``), not engine flags.
    ``+overlap``: hot placement with the overlapped device call (``HostMLP.overlap``; only
    differs on a non-CPU device); ``+sequential``: without it (the default, named explicitly).
    ``+padmax``: hot groups padded to
    the largest group (``HotLayer.capacity="max"``, no host overflow) instead of the cost rule.
    (``+legacy``, the copies and gathers before issue 13, is gone: measured in
    experiments/2026-12-01-hot-traffic.md, the engine keeps no old path for it.)
    ``+torch_head``: the LM head computed by ``lm_head`` itself (torch's ``mm``) instead of the
    backend's ``frozen_linear`` (the streaming kernel on ``cpu``), for A/B.
    ``+fp32``: the variant with fp32 expert weights whatever ``hostDtype`` the engine holds (an
    fp32 copy of each MoE block, made once and kept for the run: 2x the bf16 experts' bytes).
    ``peer+fp32``: on a CPU without native bf16 (AVX2) torch's bf16 matmuls are the cliff of
    issue 10, so a user of stock transformers + peft there runs fp32: the fair peer for our bf16.
    ``host-only+fp32``: our engine with fp32 instead of bf16 expert storage in the same run (the
    engine's expert tensors are pointed at the fp32 copy for that variant's steps), so bf16 vs
    fp32 storage is an A/B in one process; host-only placement only (the hot set's device copy
    was made from the stored weights).
    ``+4k``: the variant with its expert weights in the allocator's memory (a copy, made once)
    instead of where the engine placed them (huge pages where THP is ``madvise``,
    :mod:`npu_lora.moe.pages`), so the placement is an A/B in one process; host-only only,
    combinable with ``+fp32``.
    ``+int8`` / ``+fp8``: our engine with its experts in 8 bits (``moe.hostDtype`` ``int8``: per
    output channel; ``float8_e4m3fn``: 128 x 128 blocks; ``npu_lora.models.quant``) in the same
    run as the engine's own dtype: an 8-bit copy of each MoE layer's experts, quantised from the
    engine's own once and kept for the run (the engine's expert tensors, scales and
    ``quant_block`` are pointed at it for that variant's steps; the bf16 tensors are put back
    untouched after). Host-only placement only, on the ``npu_lora_stream`` kernel only, not with
    ``+fp32`` or ``+4k``, one of the two per variant; the bench also reports each layer's output
    and dX error against the engine's own dtype (``npu_lora.bench.q8``).
    ``peer+sdpa``: the stock model with transformers' default attention (``sdpa``: torch's
    ``scaled_dot_product_attention``, a fused CPU kernel) instead of ``eager``, the
    implementation the engine's models are built with (our device graphs write eager attention
    out, the form RNGD compiles). A user of stock transformers + peft who sets nothing gets
    ``sdpa``; combinable with ``+fp32``."""

    name: str
    placement: str  # host-only | hot | peer
    keep_graph: bool
    experts_impl: str | None  # None: the bench default
    sequential: bool = False
    padmax: bool = False
    overlap: bool = False
    torch_head: bool = False
    fp32: bool = False  # fp32 expert weights (an fp32 copy when hostDtype is bf16)
    plain_pages: bool = False  # +4k: expert weights in the allocator's memory, not placed
    sdpa: bool = False  # peer+sdpa: the stock model on transformers' sdpa attention
    q8: str | None = None  # +int8 / +fp8: the 8-bit format (``int8`` / ``float8_e4m3fn``)

    @property
    def is_peer(self) -> bool:
        return self.placement == "peer"

    @classmethod
    def parse(cls, text: str) -> Variant:
        name = text.strip()
        base, _, impl = name.partition("@")
        parts = base.split("+")
        placement, flags = parts[0], set(parts[1:])
        if placement not in ("host-only", "hot", "peer"):
            raise ValueError(f"variant {name!r}: placement must be host-only, hot or peer")
        allowed = set(PEER_MODIFIERS if placement == "peer" else HOST_MODIFIERS)
        if "legacy" in flags:
            raise ValueError(
                f"variant {name!r}: +legacy was removed (the hot path before issue 13; "
                "experiments/2026-12-01-hot-traffic.md has its figures)"
            )
        if placement == "peer" and flags & set(Q8_MODIFIERS):
            raise ValueError(
                f"variant {name!r}: +{min(flags & set(Q8_MODIFIERS))} applies to host-only "
                "placement only (stock transformers + peft cannot compute on 8-bit experts)"
            )
        if flags - allowed:
            raise ValueError(
                f"variant {name!r}: unknown modifiers {sorted(flags - allowed)} "
                f"(allowed with {placement}: {sorted(allowed)})"
            )
        hot_only = flags & {"sequential", "padmax", "overlap"}
        if {"sequential", "overlap"} <= flags:
            raise ValueError(f"variant {name!r}: +sequential and +overlap exclude each other")
        if hot_only and placement != "hot":
            raise ValueError(f"variant {name!r}: +{min(hot_only)} applies to hot placement only")
        if "fp32" in flags and placement == "hot":
            raise ValueError(f"variant {name!r}: +fp32 applies to host-only placement and peers")
        if "4k" in flags and placement != "host-only":
            raise ValueError(f"variant {name!r}: +4k applies to host-only placement only")
        q8 = sorted(flags & set(Q8_MODIFIERS))
        if len(q8) > 1:
            raise ValueError(f"variant {name!r}: +int8 and +fp8 exclude each other (one format)")
        if q8 and placement != "host-only":
            raise ValueError(
                f"variant {name!r}: +{q8[0]} applies to host-only placement only (the hot set's "
                "device copy was made from the engine's own weights)"
            )
        if q8 and "fp32" in flags:
            raise ValueError(
                f"variant {name!r}: +{q8[0]} and +fp32 exclude each other (the experts are held "
                "in one dtype: 8 bits, or an fp32 copy)"
            )
        if q8 and "4k" in flags:
            raise ValueError(
                f"variant {name!r}: +{q8[0]} and +4k exclude each other (the 8-bit copy is "
                "placed as the engine places its own weights)"
            )
        return cls(
            name,
            placement,
            "keep_graph" in flags,
            impl or None,
            "sequential" in flags,
            "padmax" in flags,
            "overlap" in flags,
            "torch_head" in flags,
            "fp32" in flags,
            "4k" in flags,
            "sdpa" in flags,
            Q8_MODIFIERS[q8[0]] if q8 else None,
        )
