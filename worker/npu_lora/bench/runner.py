"""One engine switched between variants in place, and one measured step of any of them (the
engine's own steps and the stock transformers + peft peers on the same weights); the weight
copies some variants keep, and the kept graph's bytes."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from npu_lora.bench.config import BenchConfig
from npu_lora.bench.hooks import VariantHooks
from npu_lora.bench.variant import Variant
from npu_lora.engine.hooks import ExpertWeights
from npu_lora.models.quant import Q8_DTYPES, expert_nbytes
from npu_lora.moe.host_dtype import STREAM
from npu_lora.moe.mode import EngineMode


def stream_compute_dtype(host_dtype: torch.dtype) -> torch.dtype:
    """The block's compute dtype with ``npu_lora_stream`` and weights in ``host_dtype`` on this
    CPU (as ``build_engine`` would resolve it for that kernel)."""
    from npu_lora.moe.host_dtype import resolve_host_dtype

    name = "bfloat16" if host_dtype == torch.bfloat16 else "float32"
    return getattr(torch, resolve_host_dtype(name, STREAM, log_it=False).compute_dtype)


def q8_compute_dtype(fmt: str) -> torch.dtype:
    """The activations' dtype of 8-bit experts (``fmt``) on the stream kernel on this CPU, as
    ``build_engine`` resolves it for ``moe.hostDtype: fmt``."""
    from npu_lora.moe.host_dtype import resolve_host_dtype

    return getattr(torch, resolve_host_dtype(fmt, STREAM, log_it=False).compute_dtype)


def copy_bytes(engine: Any, variants: Sequence[Variant]) -> dict[str, int]:
    """Bytes of the weight copies the variants make on first use and keep for the run, by copy:
    the fp32 copy of the MoE blocks (``+fp32`` and ``peer+fp32``; one copy shared by both) and
    the ``+4k`` copies of the experts in the allocator's memory (one per storage dtype)."""
    stored = sum(m.experts.gate_up_proj.nbytes + m.experts.down_proj.nbytes for m in engine.mlps)
    elem = engine.mlps[0].experts.gate_up_proj.element_size() if engine.mlps else 4
    fp32 = stored * 4 // elem
    need: dict[str, int] = {}
    if any(v.fp32 for v in variants):
        need["fp32 copy of the experts (+fp32, peer+fp32)"] = fp32
    if any(v.plain_pages and not v.fp32 for v in variants):
        need["+4k copy of the experts"] = stored
    if any(v.plain_pages and v.fp32 for v in variants):
        need["+fp32+4k copy of the experts"] = fp32
    from npu_lora.bench.q8 import q8_copy_bytes

    for fmt in dict.fromkeys(v.q8 for v in variants if v.q8):
        need[f"{fmt} copy of the experts (+{'int8' if fmt == 'int8' else 'fp8'})"] = q8_copy_bytes(
            engine.expert_weights(), fmt
        )
    return need


def available_bytes() -> tuple[int | None, str]:
    """Memory this process can still take: ``npu-lora run``'s memory limit
    (:func:`npu_lora.train.preflight.memory_limit`: ``NPU_LORA_MEMORY_LIMIT``, ``none`` for no
    check, else the cgroup's limit, else ``MemAvailable``) less what this process holds now
    (``MemAvailable`` is already net of it)."""
    from npu_lora.train import preflight

    limit, source = preflight.memory_limit()
    if limit is None or source == preflight.MEMAVAILABLE:
        return limit, source
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    held = pages * os.sysconf("SC_PAGE_SIZE")
    return limit - held, f"{source} less {held / 2**30:.1f} GiB held by this process"


def check_copy_memory(engine: Any, variants: Sequence[Variant]) -> dict[str, int]:
    """Raise ValueError, before any copy is made, when the variants' weight copies
    (:func:`copy_bytes`) would take more than 90 % of the memory still available (a bench that
    the OOM killer ends loses every round; at Qwen3 widths each copy of 2 layers' experts is
    2.4-4.8 GB). The steps' own activations are not counted: a run that passes can still run out."""
    need = copy_bytes(engine, variants)
    avail, source = available_bytes()
    if not need or avail is None or sum(need.values()) <= 0.9 * avail:
        return need
    gib = 1 << 30
    parts = ", ".join(f"{k} {b / gib:.1f} GiB" for k, b in need.items())
    raise ValueError(
        f"variants {[v.name for v in variants if v.fp32 or v.plain_pages or v.q8]}: their "
        "weight copies "
        f"need {sum(need.values()) / gib:.1f} GiB ({parts}), more than 90 % of the "
        f"{avail / gib:.1f} GiB still available ({source}). Run fewer +fp32/+4k variants per "
        "process (e.g. one storage dtype per run; +int8/+fp8 likewise) or fewer --layers; NPU_LORA_MEMORY_LIMIT=none "
        "skips this check."
    )


class VariantRunner:
    """Switches one engine between variants and runs one measured step of any of them. The
    variants' strategies reach the engine through its hooks (:class:`VariantHooks`, installed
    here with ``engine.use_hooks``)."""

    def __init__(self, engine: Any, cfg: BenchConfig, hot_layers: list[Any] | None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.hot_layers = hot_layers
        self.params = engine.adapter.parameters()
        self._fp32_blocks: list[torch.nn.Module] | None = None
        self._plain: dict[bool, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # +4k, by fp32
        self._q8: dict[str, ExpertWeights] = {}  # +int8 / +fp8 copies, by format
        # the engine's own expert tensors, restored after a +fp32 variant
        self._stored = engine.expert_weights()
        self.hooks = VariantHooks()
        engine.use_hooks(self.hooks)

    def fp32_blocks(self) -> list[torch.nn.Module]:
        """Per layer, an fp32 copy of the stock MoE block (``peer+fp32``), made on first use."""
        if self._fp32_blocks is None:
            import copy

            blocks = []
            for block in self.engine.stock_blocks:
                # the copy shares the model config, so the peer's experts kernel still follows
                # ``set_experts_implementation``
                cfg = getattr(block.experts, "config", None)
                memo = {id(cfg): cfg} if cfg is not None else {}
                blocks.append(copy.deepcopy(block, memo).float())
            from npu_lora.moe.pages import place_experts

            place_experts(blocks)  # the same kind of pages as the engine's own weights
            self._fp32_blocks = blocks
        return self._fp32_blocks

    def _weights(self, fp32: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the expert tensors of the engine (or of the fp32 copies, ``+fp32``)."""
        if not fp32:
            return self._stored
        return [(b.experts.gate_up_proj.data, b.experts.down_proj.data) for b in self.fp32_blocks()]

    def plain_weights(self, fp32: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``+4k``: copies of :meth:`_weights` in the allocator's memory, made on first use."""
        if fp32 not in self._plain:
            self._plain[fp32] = [(gu.clone(), dn.clone()) for gu, dn in self._weights(fp32)]
        return self._plain[fp32]

    def q8_weights(self, fmt: str) -> ExpertWeights:
        """``+int8`` / ``+fp8``: an 8-bit copy of the engine's own experts, made on first use
        (:func:`npu_lora.bench.q8.q8_copy`)."""
        if fmt not in self._q8:
            from npu_lora.bench.q8 import q8_copy

            self._q8[fmt] = q8_copy(self._stored, fmt)
        return self._q8[fmt]

    def own_weights(self) -> ExpertWeights:
        """The engine's own expert tensors (as they were when the runner was made)."""
        return self._stored

    def apply(self, v: Variant) -> None:
        """Switch the engine to ``v``: its experts kernel, its hooks' answers (applied now: the
        expert weights on the fp32 copies (``+fp32``), on copies in the allocator's memory
        (``+4k``) or on their own data; the head kernel, the hot path), its mode."""
        eng = self.engine
        impl = v.experts_impl or self.cfg.experts_impl
        eng.set_experts_implementation(impl)
        fp32 = v.fp32 and not v.is_peer
        if v.q8:
            from npu_lora.bench.q8 import check_q8

            check_q8(eng, self._stored, [v], self.cfg.experts_impl)
            weights = self.q8_weights(v.q8)
        else:
            weights = self.plain_weights(fp32) if v.plain_pages else self._weights(fp32)
        self.hooks.use(v, weights)
        eng.apply_hooks()
        host_dtype = eng.mlps[0].experts.gate_up_proj.dtype  # one dtype for every block
        compute = stream_compute_dtype(host_dtype) if impl == STREAM else host_dtype
        if host_dtype in Q8_DTYPES:  # 8-bit experts (``+int8``/``+fp8``, or the engine's own):
            # the activations ``npu-lora run`` resolves for that hostDtype
            compute = q8_compute_dtype(str(host_dtype).removeprefix("torch."))
        for m in eng.mlps:  # fp32 activations with bf16 weights: the stream kernel only
            m.set_compute_dtype(compute)
        if v.is_peer:
            return
        if v.placement == "hot" and not self.hot_layers:
            raise RuntimeError(f"variant {v.name}: no hot set was selected")
        eng.modes.set(EngineMode(v.placement, v.keep_graph, v.overlap))  # type: ignore[arg-type]

    def _clear_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self, v: Variant, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        if v.is_peer:
            return self.peer_step(v, batch)
        eng = self.engine
        before = eng.counts_LE.clone()
        hot_stats0 = self._hot_stats()
        for h in self.hot_layers or []:
            if h.overflow_E is not None:
                h.overflow_E.zero_()
        c0 = time.process_time()
        t0 = time.perf_counter()
        prof = eng.forward_backward(batch, loss_scale=1.0)
        step_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
        self._clear_grads()
        rec = prof.to_dict()
        rec["step_s"] = step_s
        rec["cpu_s"] = cpu_s  # process CPU seconds (all threads): less sensitive to descheduling
        hits = (eng.counts_LE - before) > 0  # [L, E] experts hit in this step's forward
        if v.placement == "hot" and self.hot_layers:
            for i, h in enumerate(self.hot_layers):
                on_device = torch.zeros_like(hits[i])
                on_device[list(h.experts)] = True
                if h.overflow_E is not None:
                    on_device &= ~h.overflow_E  # overflowing hot experts are read on the host
                hits[i, on_device] = False  # hot experts are not read on the host
            d = [b - a for a, b in zip(hot_stats0, self._hot_stats(), strict=True)]
            rec["hot_pairs_device"], rec["hot_pairs_overflow"], rec["hot_rows_padded"] = d
        rec["host_hit_experts"] = int(hits.sum())
        experts = eng.mlps[0].experts  # the stored dtype of this variant (+fp32, +int8, +fp8)
        rec["host_hit_bytes"] = int(hits.sum()) * expert_nbytes(experts)  # 8-bit: + the scales
        return rec

    def _hot_stats(self) -> tuple[int, int, int]:
        hs = self.hot_layers or []
        return (
            sum(h.pairs_device for h in hs),
            sum(h.pairs_overflow for h in hs),
            sum(h.rows_padded for h in hs),
        )

    def peer_step(self, v: Variant, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Stock transformers + peft step on the same model: HostMLP swapped for the stock block,
        logits only for the label positions (``logits_to_keep``: the same LM-head work as the
        engine's head), mean CE over the label tokens, ``backward``."""
        eng = self.engine
        ids, labels = batch["input_ids"], batch["labels"]
        tgt = torch.full_like(labels, -100)
        tgt[:, :-1] = labels[:, 1:]
        first = int((tgt != -100).int().argmax(dim=1).min())  # earliest position with a target
        keep = ids.shape[1] - first
        blocks = (
            [(b, torch.float32) for b in self.fp32_blocks()]
            if v.fp32
            else [(b, m.host_dtype) for b, m in zip(eng.stock_blocks, eng.mlps, strict=True)]
        )
        with eng.stock_model(blocks, attention="sdpa" if v.sdpa else None) as model:
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = model(
                input_ids=ids, attention_mask=batch.get("attention_mask"), logits_to_keep=keep
            )
            logits = out.logits.float()  # [B, keep, V]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), tgt[:, first:].reshape(-1), ignore_index=-100
            )
            t1 = time.perf_counter()
            loss.backward()
            step_s = time.perf_counter() - t0
            bwd_s = time.perf_counter() - t1
            cpu_s = time.process_time() - c0
        self._clear_grads()
        return {
            "loss": float(loss.detach()),
            "step_s": step_s,
            "cpu_s": cpu_s,
            "fwd_s": t1 - t0,
            "bwd_s": bwd_s,
            "tokens": int(ids.numel()),
            "placement": "peer",
            "keep_graph": None,
        }


def measure_kept_graph_bytes(engine: Any, cfg: BenchConfig) -> dict[str, Any]:
    """Bytes of the tensors one layer's kept graph holds (autograd saved tensors, unique storages,
    parameters excluded), on a random block input of the real shape; vs the analytic
    ``T·K·(D + 3I)`` host-dtype values of the docs. Not a process peak (the CPU has no allocator
    statistics); it is what keep_graph keeps alive per layer until that layer's backward."""
    m = engine.mlps[0]
    D = int(engine.config.hidden_size)
    intermediate = int(engine.config.moe_intermediate_size)
    K = int(engine.config.num_experts_per_tok)
    T = cfg.batch * cfg.seq_len
    params = {p.data_ptr() for p in engine.model.parameters()}
    params |= {p.data_ptr() for p in m.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in params and ptr not in seen:
                seen[ptr] = st.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    x = torch.randn(cfg.batch, cfg.seq_len, D, generator=torch.Generator().manual_seed(cfg.seed))
    params.add(x.untyped_storage().data_ptr())  # the block input is alive in the outer graph anyway
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = m.block_forward(x.requires_grad_(True), count=False)
    del y
    measured = sum(seen.values())
    elem = torch.empty(0, dtype=m.host_dtype).element_size()
    analytic = T * K * (D + 3 * intermediate) * elem
    return {
        "kind": "memory",
        "experts_impl": engine.config._experts_implementation,
        "layer_saved_bytes": int(measured),
        "analytic_bytes": int(analytic),
        "ratio": measured / analytic if analytic else math.nan,
        "layers": engine.num_layers,
        "all_layers_saved_bytes": int(measured) * engine.num_layers,
    }
