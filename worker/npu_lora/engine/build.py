"""``build_engine``: a ``MoEFinetuneSpec`` to a ready :class:`~npu_lora.engine.hybrid.HybridEngine`
(model, backend, host dtype, expert pages, the base's fingerprint), then ``assemble``: the
engine's parts, each from its own spec section."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from npu_lora.api.sizing import tokens_per_pass
from npu_lora.api.v1alpha1 import MoEFinetuneSpec
from npu_lora.backends import Backend, get_backend
from npu_lora.engine.hooks import EngineHooks
from npu_lora.engine.hotset import HotSet
from npu_lora.engine.hybrid import HybridEngine
from npu_lora.engine.mode import ModeControl
from npu_lora.engine.placement import place_on_device
from npu_lora.engine.state import AdapterState
from npu_lora.models.build import build_model, causal_lm, to_dtype
from npu_lora.moe.host_mlp import install_host_mlp
from npu_lora.moe.node_pass import LocalPass, install_pass

__all__ = ["assemble", "build_engine", "keep_graph_auto"]

log = logging.getLogger(__name__)


def build_engine(
    spec: MoEFinetuneSpec,
    *,
    vocab_size: int | None = None,
    backend: Backend | str | None = None,
    experts_implementation: str | None = None,
    model_root: str | Path | None = None,
    device_dtype: torch.dtype | None = None,
    hooks: EngineHooks | None = None,
) -> HybridEngine:
    """Build model (``spec.model``, ``spec.lora``), backend (``spec.device.backend`` unless
    ``backend`` is given) and engine. ``vocab_size``: the tokenizer's size (the embedding grows
    to it). ``experts_implementation``: the host experts kernel (a key of transformers'
    ``ALL_EXPERTS_FUNCTIONS``; default ``spec.moe.expertsKernel``). ``device_dtype``: dtype of
    everything but the MoE blocks (embeddings, attention, norms, head, LoRA; default
    ``spec.device.dtype``). ``hooks``: the bench's strategies (``engine.hooks``; default: the
    engine's own way). ``moe.hostThreads`` sets ``torch.set_num_threads`` (process-wide).
    ``moe.keepGraph`` omitted (auto) keeps every layer's graph until :func:`keep_graph_auto` sizes it."""
    experts_implementation = experts_implementation or spec.moe.experts_kernel
    if experts_implementation.startswith("npu_lora_"):
        from npu_lora.moe import experts as sorted_experts

        sorted_experts.register()
    from npu_lora.moe.host_dtype import resolve_host_dtype

    host_choice = resolve_host_dtype(spec.moe.host_dtype, experts_implementation)
    from npu_lora.moe.host_dtype import Q8_DTYPES

    # 8-bit experts: the block is built in the compute dtype, then its experts are quantised
    q8_wide = host_choice.compute_dtype if host_choice.dtype in Q8_DTYPES else None
    if device_dtype is None:
        device_dtype = to_dtype(spec.device.dtype)
    if spec.moe.host_threads:
        torch.set_num_threads(spec.moe.host_threads)
    be = backend if isinstance(backend, Backend) else get_backend(backend or spec.device.backend)
    model, _config = build_model(
        spec.model,
        spec.lora,
        seed=spec.training.seed,
        vocab_size=vocab_size,
        host_dtype=to_dtype(q8_wide or host_choice.dtype),
        experts_implementation=experts_implementation,
        model_root=model_root,
        device_dtype=device_dtype,
        quantize=host_choice.dtype if q8_wide else None,
    )
    if q8_wide:  # status.host / summary.json: which 8-bit layout runs and where it came from
        from dataclasses import replace

        from npu_lora.models.build import moe_blocks
        from npu_lora.models.quant import layout_of

        host_choice = replace(host_choice, layout=layout_of(moe_blocks(model)))
    from npu_lora.models.build import moe_blocks
    from npu_lora.models.fingerprint import base_fingerprint
    from npu_lora.moe.pages import place_experts

    fingerprint = base_fingerprint(model)  # the base as built, before any adapter is loaded

    experts_pages = place_experts(moe_blocks(model))  # before anything reads or copies them
    return assemble(
        spec,
        model,
        be,
        host_compute_dtype=to_dtype(host_choice.compute_dtype),
        hooks=hooks,
        host_choice=host_choice,
        experts_pages=experts_pages,
        fingerprint=fingerprint,
    )


def assemble(
    spec: MoEFinetuneSpec,
    model: torch.nn.Module,
    backend: Backend,
    *,
    host_compute_dtype: torch.dtype | None = None,
    hooks: EngineHooks | None = None,
    host_choice: Any = None,
    experts_pages: dict[str, Any] | None = None,
    fingerprint: dict[str, Any] | None = None,
) -> HybridEngine:
    """The engine's parts around a built ``model``, each from its own spec section: the mode
    control from ``moe`` + ``lora`` (:meth:`ModeControl.from_spec`), the MoE blocks on the host
    (``HostMLP``, reading the mode from it), the hot set from ``moe`` (:meth:`HotSet.from_spec`,
    with the tokens per pass of ``training``), the adapter over the trainable state."""
    modes = ModeControl.from_spec(spec.moe, spec.lora)
    mlps = install_host_mlp(model, backend, mode=modes, compute_dtype=host_compute_dtype)
    # every kernel call goes through the pass, which counts the streamed bytes
    # (expert_bytes); the launcher swaps in the node's shared pass (moe/node_pass.py)
    install_pass(mlps, LocalPass())
    place_on_device(model, list(mlps), backend)
    hotset = HotSet.from_spec(
        spec.moe,
        mlps,
        backend,
        tokens=tokens_per_pass(spec.training.batch_size, spec.training.seq_len),
        top_k=int(model.config.num_experts_per_tok),
        device_dtype=causal_lm(model).model.embed_tokens.weight.dtype,
    )
    adapter = AdapterState(model, mlps, fingerprint)  # adapter/npu_lora_base.json, summary.json
    return HybridEngine(
        model,
        backend,
        modes,
        hotset,
        adapter,
        hooks,
        host_choice=host_choice,  # summary.json machine.host, status.host
        experts_pages=experts_pages,  # summary.json machine.experts_pages
    )


def keep_graph_auto(
    engine: HybridEngine,
    spec: MoEFinetuneSpec,
    memory_limit: tuple[int | None, str],
    examples: int = 0,
) -> dict[str, Any]:
    """``moe.keepGraph`` omitted (auto): keep the MoE graph in the most layers whose estimate
    (:func:`npu_lora.api.memory.kept_graph_layers`) fits ``memory_limit`` (``(bytes or None,
    where it came from)``, ``train.preflight.memory_limit``; None: every layer), with
    ``examples`` (the data's share of the estimate). Logs the choice; returns it (summary.json
    ``keep_graph``)."""
    from npu_lora.api.memory import GiB, estimate, kept_graph_layers, model_widths

    limit, source = memory_limit
    choice = getattr(engine, "host_choice", None)
    host_dtype = choice.dtype if choice is not None else None
    L = engine.num_layers
    cfg = model_widths(spec)
    n = L if cfg is None else kept_graph_layers(spec, cfg, limit, examples, host_dtype)
    kept = engine.keep_graph_layers(n)
    est = None if cfg is None else estimate(spec, cfg, examples, host_dtype, kept_layers=n)
    where = "no memory limit known" if limit is None else f"limit {limit / GiB:.1f} GiB ({source})"
    log.warning(
        "moe.keepGraph auto: %d of %d layers keep their MoE graph%s (estimate %s; %s)",
        n,
        L,
        ""
        if n == L
        else f" (layers {kept[0]}..{L - 1}; the others recompute)"
        if kept
        else " (every layer recomputes its block in backward)",
        "unknown" if est is None else f"{est.total / GiB:.2f} GiB",
        where,
    )
    return {
        "kept_layers": n,
        "layers": L,
        "kept": kept,
        "limit_bytes": limit,
        "limit_source": source,
        "estimate_bytes": None if est is None else est.total,
    }
