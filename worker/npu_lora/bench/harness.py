"""A/B harness: HostMLP variants (and stock peers) interleaved in one process, on one model.

Design (why it looks like this):

- **One model, one set of weights.** The engine is built once (seed fixed); variants switch its
  mode (``HybridEngine.set_mode``) and experts kernel in place (``VariantRunner.apply``), so
  every variant runs exactly the same weights on exactly the same batches. Peers (stock transformers + peft) run the
  *same* peft model with the HostMLP wrappers swapped back to the stock MoE blocks
  (``peer_step``), so they share the weights too and cost no extra memory.
- **Warm-up excluded.** First the hot set is chosen as the engine does it (``warmupSteps``
  host-only steps counting routing, then ``select_hot_experts``); then every variant runs
  ``warmup`` unmeasured steps.
- **Rounds, alternating order.** ``rounds`` rounds; each runs every variant for
  ``steps_per_round`` steps; odd rounds run the variants in reverse order, so slow drifts of a
  shared machine (thermal, neighbours, bandwidth) hit every variant from both sides.
- **Paired statistics.** Per variant the median of every profile column; per round the delta of
  each variant's mean step time against the baseline's in the *same round*; reported as the
  median delta and how many rounds agree in sign with it.
- No optimizer step: gradients are cleared after every step so every variant sees the same
  weights and routing (the LoRA AdamW update is negligible next to a step).

Outputs (``out`` directory): ``bench.jsonl`` (one record per measured step, plus ``kind`` =
``meta`` / ``limits`` / ``memory`` / ``summary`` records), ``bench.md`` (the table),
``bench.png`` (per-variant stacked timing breakdown).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from npu_lora.api import record as step_record
from npu_lora.bench.variant import Variant
from npu_lora.machine import machine_facts
from npu_lora.moe.experts import expert_bytes
from npu_lora.moe.host_dtype import STREAM
from npu_lora.moe.mode import EngineMode

DEFAULT_VARIANTS = ("host-only", "host-only+keep_graph", "hot", "hot+keep_graph")
DEFAULT_PEERS = ("peer@grouped_mm", "peer@eager")
#: Per-variant medians of the engine's profile (the step record's bench columns).
PROFILE_COLUMNS = step_record.BENCH_COLUMNS


# ----------------------------------------------------------------------------- configuration


@dataclass
class BenchConfig:
    preset: str | None = "tiny-qwen3-moe"
    config: str | None = None  # a MoEFinetune manifest / bare spec (overrides preset)
    layers: int | None = None
    seq_len: int = 128
    batch: int = 1
    hot_fraction: float = 0.25
    hot_warmup_steps: int = 2  # host-only steps counting routing before the hot set is chosen
    warmup: int = 1  # unmeasured steps per variant
    steps_per_round: int = 1
    rounds: int = 6
    host_dtype: str = "float32"
    backend: str = "cpu"
    threads: int | None = None
    experts_impl: str = "grouped_mm"
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    baseline: str | None = None  # default: the first variant
    peers: bool = True
    peer_impls: list[str] = field(default_factory=lambda: ["grouped_mm", "eager"])
    limits: bool = True
    memory: bool = True
    answer_tokens: int = 8  # label positions per sequence (at its end)
    seed: int = 0
    out: str = "bench-out"
    title: str | None = None


# ----------------------------------------------------------------------------- engine set-up


def build_spec(cfg: BenchConfig, *, placement: str) -> Any:
    """The ``MoEFinetuneSpec`` the engine is built from (manifest or preset + bench overrides)."""
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec

    if cfg.config:
        from npu_lora.api.load import load_manifest

        base = load_manifest(cfg.config).spec.model_dump(
            by_alias=True, exclude_none=True, mode="json"
        )
    else:
        base = {
            "model": {"preset": cfg.preset or "tiny-qwen3-moe"},
            "data": {"path": "example:bench"},
        }
    if cfg.layers is not None:
        base["model"]["layers"] = cfg.layers
    base.setdefault("moe", {}).update(
        placement=placement,
        keepGraph=True,
        hotFraction=cfg.hot_fraction,
        warmupSteps=cfg.hot_warmup_steps,
        hostDtype=cfg.host_dtype,
    )
    if cfg.threads:
        base["moe"]["hostThreads"] = cfg.threads
    base.setdefault("training", {}).update(seqLen=cfg.seq_len, batchSize=cfg.batch, seed=cfg.seed)
    base.setdefault("device", {})["backend"] = cfg.backend
    return MoEFinetuneSpec.model_validate(base)


def make_batches(
    n: int, *, batch: int, seq_len: int, vocab: int, answer_tokens: int, seed: int
) -> list[dict]:
    """``n`` fixed random batches; labels (= ids) on the last ``answer_tokens`` positions."""
    g = torch.Generator().manual_seed(seed)
    out = []
    a = max(1, min(answer_tokens, seq_len - 1))
    for _ in range(n):
        ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, -a:] = ids[:, -a:]
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


class _CastBlock(torch.nn.Module):
    """The stock MoE block with the host-dtype cast HostMLP also does (fp32 model, bf16 experts)."""

    def __init__(self, block: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.block = block
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x.to(self.dtype)).to(x.dtype)


def _set_experts_impl(engine: Any, impl: str) -> None:
    from npu_lora.models.build import causal_lm

    lm = causal_lm(engine.model)
    if lm.config._experts_implementation != impl:
        lm.set_experts_implementation(impl)
    # the experts modules hold a reference to the (same) config; make sure
    for m in engine.mlps:
        cfg = getattr(m.experts, "config", None)
        if cfg is not None and cfg._experts_implementation != impl:
            cfg._experts_implementation_internal = impl


def stream_compute_dtype(host_dtype: torch.dtype) -> torch.dtype:
    """The block's compute dtype with ``npu_lora_stream`` and weights in ``host_dtype`` on this
    CPU (as ``build_engine`` would resolve it for that kernel)."""
    from npu_lora.moe.host_dtype import resolve_host_dtype

    name = "bfloat16" if host_dtype == torch.bfloat16 else "float32"
    return getattr(torch, resolve_host_dtype(name, STREAM, log_it=False).compute_dtype)


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
        f"variants {[v.name for v in variants if v.fp32 or v.plain_pages]}: their weight copies "
        f"need {sum(need.values()) / gib:.1f} GiB ({parts}), more than 90 % of the "
        f"{avail / gib:.1f} GiB still available ({source}). Run fewer +fp32/+4k variants per "
        "process (e.g. one storage dtype per run) or fewer --layers; NPU_LORA_MEMORY_LIMIT=none "
        "skips this check."
    )


class VariantRunner:
    """Switches one engine between variants and runs one measured step of any of them."""

    def __init__(self, engine: Any, cfg: BenchConfig, hot_layers: list[Any] | None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.hot_layers = hot_layers
        self.params = engine.trainable_parameters()
        self._fp32_blocks: list[torch.nn.Module] | None = None
        self._plain: dict[bool, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # +4k, by fp32
        # the engine's own expert tensors, restored after a +fp32 variant
        self._stored = [
            (m.experts.gate_up_proj.data, m.experts.down_proj.data) for m in engine.mlps
        ]

    def fp32_blocks(self) -> list[torch.nn.Module]:
        """Per layer, an fp32 copy of the stock MoE block (``peer+fp32``), made on first use."""
        if self._fp32_blocks is None:
            import copy

            blocks = []
            for m in self.engine.mlps:
                # the copy shares the model config, so the peer's experts kernel still follows
                # ``_set_experts_impl``
                cfg = getattr(m.experts, "config", None)
                memo = {id(cfg): cfg} if cfg is not None else {}
                blocks.append(copy.deepcopy(m._block, memo).float())
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

    def _point_experts(self, fp32: bool, plain: bool = False) -> None:
        """The engine's expert parameters on the fp32 copies (``+fp32``), on copies in the
        allocator's memory (``+4k``) or on their own data."""
        weights = self.plain_weights(fp32) if plain else self._weights(fp32)
        for m, (want_gu, want_dn) in zip(self.engine.mlps, weights, strict=True):
            if m.experts.gate_up_proj.data_ptr() != want_gu.data_ptr():
                m.experts.gate_up_proj.data = want_gu
                m.experts.down_proj.data = want_dn

    def apply(self, v: Variant) -> None:
        eng = self.engine
        impl = v.experts_impl or self.cfg.experts_impl
        _set_experts_impl(eng, impl)
        self._point_experts(v.fp32 and not v.is_peer, v.plain_pages)
        host_dtype = eng.mlps[0].experts.gate_up_proj.dtype  # one dtype for every block
        compute = stream_compute_dtype(host_dtype) if impl == STREAM else host_dtype
        for m in eng.mlps:  # fp32 activations with bf16 weights: the stream kernel only
            m.set_compute_dtype(compute)
        if v.is_peer:
            return
        if v.placement == "hot" and not self.hot_layers:
            raise RuntimeError(f"variant {v.name}: no hot set was selected")
        eng.set_mode(EngineMode(v.placement, v.keep_graph, v.overlap))  # type: ignore[arg-type]
        eng.legacy_traffic = v.legacy
        if hasattr(eng.head, "linear"):  # the DeviceHead module (eager backends)
            eng.head.linear = None if v.torch_head else eng.backend.frozen_linear()
        for m in eng.mlps:
            if m.hot is not None:
                m.hot.capacity = "max" if v.padmax else "cost"
                m.hot.legacy = v.legacy

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
        experts = eng.mlps[0].experts  # the stored dtype of this variant (+fp32)
        rec["host_hit_bytes"] = int(hits.sum()) * expert_bytes(
            experts.gate_up_proj, experts.down_proj
        )
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
        from npu_lora.models.build import decoder_layers

        eng = self.engine
        layers = decoder_layers(eng.model)
        saved = [layer.mlp for layer in layers]
        ids, labels = batch["input_ids"], batch["labels"]
        tgt = torch.full_like(labels, -100)
        tgt[:, :-1] = labels[:, 1:]
        first = int((tgt != -100).int().argmax(dim=1).min())  # earliest position with a target
        keep = ids.shape[1] - first
        blocks = (
            [(b, torch.float32) for b in self.fp32_blocks()]
            if v.fp32
            else [(m._block, m.host_dtype) for m in saved]
        )
        # transformers picks the attention function per call from each module's config
        configs = (
            {id(c): c for m in eng.model.modules() if (c := getattr(m, "config", None))}
            if v.sdpa
            else {}
        )
        attn_saved = {k: c._attn_implementation for k, c in configs.items()}
        try:
            for c in configs.values():
                c._attn_implementation = "sdpa"
            for layer, (block, dtype) in zip(layers, blocks, strict=True):
                layer.mlp = _CastBlock(block, dtype)
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = eng.model(
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
        finally:
            for layer, m in zip(layers, saved, strict=True):
                layer.mlp = m
            for k, c in configs.items():
                c._attn_implementation = attn_saved[k]
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


# ----------------------------------------------------------------------------- statistics


def hot_dispatch_lines(records: Sequence[dict[str, Any]], names: Sequence[str]) -> list[str]:
    """Per hot variant, medians per step: hot pairs on the device, overflow pairs computed on
    the host, padded rows sent (the dense tensor's size), and the padding's share."""
    out = []
    for name in names:
        rs = [r for r in records if r.get("variant") == name and "hot_rows_padded" in r]
        if not rs:
            continue
        dev = statistics.median(r["hot_pairs_device"] for r in rs)
        ovf = statistics.median(r["hot_pairs_overflow"] for r in rs)
        rows = statistics.median(r["hot_rows_padded"] for r in rs)
        pad = 1 - dev / rows if rows else math.nan
        out.append(
            f"Hot dispatch {name}: {dev:.0f} pairs on the device in {rows:.0f} padded rows "
            f"({pad:.0%} padding), {ovf:.0f} overflow pairs on the host (medians per step)."
        )
    return ["", *out] if out else []


def _median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else math.nan


def _per_round(steps: list[dict], v: str, col: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for k in sorted({r["round"] for r in steps}):
        xs = [r.get(col) for r in steps if r["variant"] == v and r["round"] == k]
        xs = [x for x in xs if isinstance(x, int | float) and not math.isnan(x)]
        if xs:
            out[k] = statistics.fmean(xs)
    return out


def paired(records: list[dict], a: str, b: str, col: str = "step_s") -> dict[str, Any]:
    """Per-round paired comparison of variant ``a`` against ``b`` on one column."""
    steps = [r for r in records if r.get("kind") == "step"]
    pa, pb = _per_round(steps, a, col), _per_round(steps, b, col)
    common = [k for k in pa if k in pb]
    ds = [pa[k] - pb[k] for k in common]
    ratios = [pa[k] / pb[k] for k in common if pb[k]]
    md = _median(ds)
    same = sum(1 for d in ds if d != 0 and (d > 0) == (md > 0)) if ds else 0
    return {
        "median_delta": md,
        "median_ratio": _median(ratios),
        "same_sign_rounds": same,
        "rounds": len(ds),
        "deltas": ds,
        "ratios": ratios,
    }


def summarize(records: list[dict], variants: list[str], baseline: str) -> dict[str, Any]:
    """Per-variant medians of every column, and paired per-round deltas vs ``baseline``."""
    steps = [r for r in records if r.get("kind") == "step"]
    med: dict[str, dict[str, float]] = {}
    for v in variants:
        rs = [r for r in steps if r["variant"] == v]
        cols = (
            *PROFILE_COLUMNS,
            "cpu_s",
            "host_hit_bytes",
            "host_fwd_gbs",
            "host_fwd_copy_fraction",
            "copy_gbs_round",
            "loss",
            "fwd_s",
            "bwd_s",
            "loadavg1",
        )
        med[v] = {c: _median([r.get(c) for r in rs]) for c in cols}
        med[v]["n"] = len(rs)
    deltas: dict[str, dict[str, Any]] = {}
    for v in variants:
        p = paired(records, v, baseline)
        deltas[v] = {
            "median_delta_s": p["median_delta"],
            "median_ratio": p["median_ratio"],
            "same_sign_rounds": p["same_sign_rounds"],
            "rounds": p["rounds"],
            "deltas_s": p["deltas"],
        }
    pairs: dict[str, dict[str, Any]] = {}
    names = set(variants)
    for a, b, col in (
        ("host-only+keep_graph", "host-only", "host_bwd_s"),
        ("hot+keep_graph", "hot", "host_bwd_s"),
        *[
            (a, v, col)
            for a in variants
            if a.split("@")[0] == "host-only+keep_graph"
            for v in variants
            if v.startswith("peer")
            for col in ("step_s", "cpu_s")
        ],
        *[
            (v, "host-only+keep_graph", "step_s")
            for v in variants
            if "@" in v and not v.startswith("peer")
        ],
        *[
            (v, "host-only+keep_graph", "host_fwd_s")
            for v in variants
            if "@" in v and not v.startswith("peer")
        ],
        *[
            (v, "host-only+keep_graph", "host_bwd_s")
            for v in variants
            if "@" in v and not v.startswith("peer")
        ],
    ):
        if a in names and b in names:
            pairs[f"{a} / {b} : {col}"] = paired(records, a, b, col)
    return {"medians": med, "deltas": deltas, "baseline": baseline, "pairs": pairs}


def _fmt(x: float | None, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{nd}f}"


def _mb(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{x / 1e6:.3f}"


def _copy_s(m: dict[str, Any]) -> str:
    a, b = m.get("to_device_s"), m.get("to_host_s")
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return "—"
    return f"{a + b:.4f}"


def render_table(summary: dict[str, Any], variants: list[str]) -> str:
    base = summary["baseline"]
    lines = [
        f"| variant | s/step | attn+head | HostMLP fwd | HostMLP bwd | recompute | calls/layer | Δ vs {base} (same-sign rounds) | ratio | CPU s/step | →dev MB | →host MB | copy s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in variants:
        m, d = summary["medians"][v], summary["deltas"][v]
        delta = (
            "—"
            if v == base
            else f"{d['median_delta_s']:+.3f} s ({d['same_sign_rounds']}/{d['rounds']})"
        )
        ratio = "1.00" if v == base else _fmt(d["median_ratio"], 2)
        lines.append(
            f"| {v} | {_fmt(m['step_s'])} | {_fmt(m['attn_head_s'])} | {_fmt(m['host_fwd_s'])} | "
            f"{_fmt(m['host_bwd_s'])} | {_fmt(m['recompute_s'])} | {_fmt(m['device_calls_per_layer'], 1)} | {delta} | {ratio} | {_fmt(m.get('cpu_s'))} | "
            f"{_mb(m.get('to_device_bytes'))} | {_mb(m.get('to_host_bytes'))} | {_copy_s(m)} |"
        )
    return "\n".join(lines)


def derived_targets(
    summary: dict[str, Any], limits: dict | None, memory: list[dict] | None
) -> list[str]:
    """The project's targets, evaluated on this run (paired per-round ratios), or 'not measured'."""
    med = summary["medians"]
    pairs = summary.get("pairs", {})
    out = []

    def get(v: str, c: str) -> float:
        return med.get(v, {}).get(c, math.nan)

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    for key, p in pairs.items():
        r, n, same = p["median_ratio"], p["rounds"], p["same_sign_rounds"]
        if math.isnan(r):
            continue
        if key.endswith(": host_bwd_s") and "@" not in key:
            out.append(
                f"HostMLP bwd {key.split(' :')[0]} = {r:.2f} (paired median over {n} rounds, {same}/{n} same sign; target ≤ 0.60): {verdict(r <= 0.60)}"
            )
        elif "/ peer" in key and key.endswith("step_s"):
            out.append(
                f"step (wall) {key.split(' :')[0]} = {r:.2f} (paired median over {n} rounds, {same}/{n} same sign; target ≤ 0.75): {verdict(r <= 0.75)}"
            )
        else:
            out.append(f"{key} = {r:.2f} (paired median over {n} rounds, {same}/{n} same sign)")
    if not any("peer" in k for k in pairs):
        why = (
            "needs a host-only+keep_graph[@kernel] variant"
            if any(v.startswith("peer") for v in med)
            else "no peer variant in this run"
        )
        out.append(f"step vs stock transformers+peft: not measured ({why})")
    if limits:
        copy = limits.get("copy_gbs", math.nan)
        for v in med:
            if v.startswith("peer"):
                continue
            hot_s = get(v, "hot_s")
            hb, fs = (
                get(v, "host_hit_bytes"),
                get(v, "host_fwd_s") - (0.0 if math.isnan(hot_s) else hot_s),
            )
            if hb and not math.isnan(hb) and not math.isnan(fs) and fs > 0:
                bw = hb / fs / 1e9
                frac_r = get(v, "host_fwd_copy_fraction")
                per_round = (
                    ""
                    if math.isnan(frac_r)
                    else f"; per step against the same round's copy sample: median {frac_r:.0%}"
                )
                out.append(
                    f"host MoE fwd {v}: {bw:.1f} GB/s = {bw / copy:.0%} of copy {copy:.1f} GB/s{per_round} (target ≥ 60%): "
                    f"{verdict(max(bw / copy, 0 if math.isnan(frac_r) else frac_r) >= 0.6)} (bytes = hit experts' weights, all layers; time = host_fwd_s − hot_s, incl. router and dispatch)"
                )
    else:
        out.append("host MoE fwd bandwidth fraction: not measured (--no-limits)")
    for mem in memory or []:
        out.append(
            f"keep_graph saved tensors per layer {mem['layer_saved_bytes'] / 2**20:.1f} MiB vs analytic "
            f"T·K·(D+3I) {mem['analytic_bytes'] / 2**20:.1f} MiB = {mem['ratio']:.2f}× (target ≤ 1.5×; "
            f"autograd saved-tensor bytes of one layer's kept graph with `{mem['experts_impl']}`, not a process peak): "
            f"{verdict(mem['ratio'] <= 1.5)}"
        )
    if not memory:
        out.append("keep_graph memory: not measured (--no-memory)")
    return out


# ----------------------------------------------------------------------------- plot


def plot(summary: dict[str, Any], variants: list[str], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = summary["medians"]
    parts = [
        ("attn+head", lambda m: m["attn_head_s"]),
        ("HostMLP fwd", lambda m: m["host_fwd_s"]),
        ("HostMLP bwd (excl. recompute)", lambda m: m["host_bwd_s"] - m["recompute_s"]),
        ("recompute", lambda m: m["recompute_s"]),
        ("stock fwd (peers)", lambda m: m["fwd_s"]),
        ("stock bwd (peers)", lambda m: m["bwd_s"]),
    ]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(variants) + 4.5), 4.8))
    bottoms = [0.0] * len(variants)
    for label, f in parts:
        vals = []
        for v in variants:
            try:
                x = f(med[v])
            except (KeyError, TypeError):
                x = math.nan
            vals.append(0.0 if x is None or math.isnan(x) else max(x, 0.0))
        ax.bar(variants, vals, bottom=bottoms, label=label)
        bottoms = [b + x for b, x in zip(bottoms, vals, strict=True)]
    other = [
        max(med[v]["step_s"] - b, 0.0) if not math.isnan(med[v]["step_s"]) else 0.0
        for v, b in zip(variants, bottoms, strict=True)
    ]
    ax.bar(
        variants,
        other,
        bottom=bottoms,
        label="other (step − parts)",
        color="lightgray",
    )
    for i, v in enumerate(variants):
        ax.text(
            i, med[v]["step_s"], f"{med[v]['step_s']:.2f}", ha="center", va="bottom", fontsize=8
        )
    ax.set_ylabel("seconds per step (medians; parts are medians too)")
    ax.set_title(title or "npu-lora bench")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- run


def _variants(cfg: BenchConfig) -> tuple[list[Variant], str]:
    """The variants to run (peers appended) and the baseline's name."""
    variants = [Variant.parse(v) for v in cfg.variants]
    if cfg.peers:
        have = {v.name for v in variants}
        variants += [Variant.parse(f"peer@{i}") for i in cfg.peer_impls if f"peer@{i}" not in have]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate variants: {names}")
    baseline = cfg.baseline or names[0]
    if baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
    return variants, baseline


class _Emitter:
    """``bench.jsonl``: one JSON record per line, flushed as written."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("w")

    def __call__(self, rec: dict) -> None:
        self._f.write(json.dumps(rec, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _bandwidth_before(emit: _Emitter, log: Callable[[str], None]) -> dict[str, Any]:
    from npu_lora.bench.limits import stream_bandwidth

    bw = stream_bandwidth()
    limits = {"kind": "limits", "when": "before", **bw.to_dict()}
    emit(limits)
    log(
        f"bandwidth: copy {bw.copy_gbs:.1f} GB/s, triad {bw.triad_gbs:.1f} GB/s ({bw.threads} threads, load {bw.loadavg})"
    )
    return limits


def _bandwidth_after(limits: dict[str, Any], emit: _Emitter) -> None:
    from npu_lora.bench.limits import stream_bandwidth

    bw2 = stream_bandwidth()
    emit({"kind": "limits", "when": "after", **bw2.to_dict()})
    limits["copy_gbs_after"] = bw2.copy_gbs
    limits["triad_gbs_after"] = bw2.triad_gbs
    # the reference for the fraction: the better (quieter) of the two measurements
    limits["copy_gbs"] = max(limits["copy_gbs"], bw2.copy_gbs)


def _build_engine(
    cfg: BenchConfig, any_hot: bool, log: Callable[[str], None], experts_impl: str | None = None
) -> Any:
    """The engine, built for ``experts_impl`` (default: the bench default); variants switch the
    kernel later, but the build resolves ``hostDtype`` (and warns) for this one."""
    from npu_lora.engine import build_engine

    spec = build_spec(cfg, placement="hot" if any_hot else "host-only")
    t0 = time.perf_counter()
    engine = build_engine(spec, experts_implementation=experts_impl or cfg.experts_impl)
    log(
        f"engine built in {time.perf_counter() - t0:.1f} s ({engine.num_layers} layers, backend {engine.backend.name})"
    )
    return engine


def _select_hot_set(
    runner: VariantRunner,
    batches: list[dict[str, torch.Tensor]],
    emit: _Emitter,
    log: Callable[[str], None],
) -> None:
    """As the engine does it: host-only steps counting routing, then ``select_hot_experts``."""
    engine, cfg = runner.engine, runner.cfg
    runner.apply(Variant("warmup", "host-only", True, None))
    for i in range(cfg.hot_warmup_steps):
        engine.forward_backward(batches[i % len(batches)])
        runner._clear_grads()
    engine.set_mode(replace(engine.mode, placement="hot"))
    info = engine.select_hot_experts(cfg.hot_warmup_steps)
    runner.hot_layers = [m.hot for m in engine.mlps]
    emit({"kind": "hot", "experts": info.get("experts"), "per_layer": info.get("per_layer")})
    log(f"hot set: {info.get('experts')} experts over {engine.num_layers} layers")


def _measure_memory(
    runner: VariantRunner, variants: list[Variant], emit: _Emitter, log: Callable[[str], None]
) -> list[dict]:
    """The kept graph's bytes per experts kernel (host-only + keep_graph)."""
    cfg = runner.cfg
    memory: list[dict] = []
    impls = dict.fromkeys(v.experts_impl or cfg.experts_impl for v in variants if not v.is_peer)
    for impl in impls:
        runner.apply(Variant(f"memory@{impl}", "host-only", True, impl))
        try:
            rec = measure_kept_graph_bytes(runner.engine, cfg)
            memory.append(rec)
            emit(rec)
        except Exception as e:  # diagnostics must not kill the benchmark
            log(f"memory measurement ({impl}) failed: {e!r}")
    return memory


def _measured_step(
    runner: VariantRunner,
    v: Variant,
    batch: dict[str, torch.Tensor],
    where: tuple[int, int, int],
    round_copy: float,
) -> dict[str, Any]:
    """One measured step's record (``where``: round, position in it, step in the round), with
    the host forward's achieved bandwidth."""
    rec = runner.step(v, batch)
    rnd, pos, s = where
    rec.update(
        kind="step",
        variant=v.name,
        round=rnd,
        order_pos=pos,
        step_in_round=s,
        loadavg=os.getloadavg(),
    )
    rec["loadavg1"] = rec["loadavg"][0]
    rec["copy_gbs_round"] = round_copy
    fwd = rec.get("host_fwd_s", 0.0) - rec.get("hot_s", 0.0)
    if rec.get("host_hit_bytes") and fwd > 0:
        rec["host_fwd_gbs"] = rec["host_hit_bytes"] / fwd / 1e9
        rec["host_fwd_copy_fraction"] = rec["host_fwd_gbs"] / round_copy
    rec["experts_impl"] = v.experts_impl or runner.cfg.experts_impl
    return rec


def _rounds(
    runner: VariantRunner,
    variants: list[Variant],
    batches: list[dict[str, torch.Tensor]],
    emit: _Emitter,
    log: Callable[[str], None],
    on_round: Callable[[int, list[dict]], None] | None = None,
) -> list[dict]:
    """``cfg.rounds`` rounds, alternating order; a short copy-bandwidth sample per round.
    ``on_round(rounds_done, records)`` after each round (progress reporting)."""
    cfg = runner.cfg
    records: list[dict] = []
    probe = None
    for rnd in range(cfg.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        round_copy = math.nan
        if cfg.limits:  # a short copy-bandwidth sample per round: the machine drifts
            from npu_lora.bench.limits import CopyProbe

            probe = probe or CopyProbe()  # buffers allocated once for all rounds
            bw_r = probe.measure(repeats=3)
            round_copy = bw_r.copy_gbs
            emit({"kind": "limits", "when": f"round {rnd}", **bw_r.to_dict()})
        for pos, v in enumerate(order):
            runner.apply(v)
            for s in range(cfg.steps_per_round):
                batch = batches[s % len(batches)]
                rec = _measured_step(runner, v, batch, (rnd, pos, s), round_copy)
                records.append(rec)
                emit(rec)
        log(
            f"round {rnd + 1}/{cfg.rounds} ({'forward' if rnd % 2 == 0 else 'reverse'}): "
            + ", ".join(f"{r['variant']} {r['step_s']:.2f}s" for r in records if r["round"] == rnd)
            + f" | load {os.getloadavg()[0]:.1f}"
        )
        if on_round is not None:
            on_round(rnd + 1, records)
    return records


def _write_report(
    cfg: BenchConfig,
    summary: dict[str, Any],
    records: list[dict],
    names: list[str],
    log: Callable[[str], None],
) -> None:
    """``bench.md`` (table, bandwidth, hot dispatch, targets) and ``bench.png``."""
    out = Path(cfg.out)
    limits = summary["limits"]
    md = [f"# {cfg.title or 'npu-lora bench'}", "", render_table(summary, names), ""]
    if limits:
        md.append(
            f"Bandwidth (torch, {limits['threads']} threads): copy {limits['copy_gbs']:.1f} GB/s "
            f"(before {limits['copy_samples_gbs'] and statistics.median(limits['copy_samples_gbs']):.1f}, after {limits.get('copy_gbs_after', math.nan):.1f}), "
            f"triad {limits['triad_gbs']:.1f} GB/s."
        )
    md += hot_dispatch_lines(records, names)
    md += ["", "Targets:", *[f"- {t}" for t in summary["targets"]], ""]
    (out / "bench.md").write_text("\n".join(md))
    try:
        plot(summary, names, out / "bench.png", title=cfg.title or "")
    except Exception as e:  # pragma: no cover - plotting is a convenience
        log(f"plot failed: {e!r}")
    log("\n".join(md))


def bench_plan_record(cfg: BenchConfig, engine: Any, any_hot: bool) -> dict[str, Any]:
    """The bench's device graphs: the compile plan (``npu_lora.compile.plan``) of the spec the
    engine was built from, on its backend: the same list ``compile-plan``, ``precompile`` and
    ``rngd-check --plan`` use (names and keys; a plan error is recorded, never fatal)."""
    from npu_lora.compile.plan import PLAN_BACKENDS, compile_plan

    try:
        spec = build_spec(cfg, placement="hot" if any_hot else "host-only")
        name = engine.backend.name
        plan = compile_plan(spec, backend=name if name in PLAN_BACKENDS else None)
    except Exception as e:
        return {"kind": "compile_plan", "error": f"{type(e).__name__}: {e}"}
    return {
        "kind": "compile_plan",
        "backend": plan.backend,
        "compiler": plan.compiler,
        "graphs": [{"name": e.name, "key": e.key} for e in plan.entries],
    }


def run_bench(
    cfg: BenchConfig,
    *,
    log: Callable[[str], None] = print,
    engine: Any = None,
    on_round: Callable[[int, list[dict]], None] | None = None,
) -> dict[str, Any]:
    """Run the whole A/B benchmark; returns the summary (also written to ``cfg.out``);
    ``on_round(rounds_done, records)`` is called after every round."""
    from npu_lora.moe.experts import register

    register()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    variants, baseline = _variants(cfg)
    any_hot = any(v.placement == "hot" for v in variants)
    emit = _Emitter(out / "bench.jsonl")
    names = [v.name for v in variants]
    emit(
        {
            "kind": "meta",
            "config": asdict(cfg),
            "variants": names,
            "baseline": baseline,
            "machine": machine_facts(),
        }
    )
    limits = _bandwidth_before(emit, log) if cfg.limits else None
    if engine is None:
        # built for the first variant's kernel, so that the build's hostDtype resolution and its
        # warnings are those of what runs (e.g. no grouped_mm bf16 warning for stream variants)
        ours = [v.experts_impl or cfg.experts_impl for v in variants if not v.is_peer]
        engine = _build_engine(cfg, any_hot, log, ours[0] if ours else None)
    built = machine_facts(engine)  # with the engine: hostDtype as resolved, experts' pages
    emit({"kind": "engine", **{k: built[k] for k in ("host", "experts_pages") if k in built}})
    emit(bench_plan_record(cfg, engine, any_hot))
    if "experts_pages" in built:
        log(f"expert weights: {built['experts_pages']}")
    if engine.backend.device.type != "cpu" and any(v.is_peer for v in variants):
        # the stock peer runs the whole model on one device; here the MoE blocks are on the host
        log("peers need the cpu backend (the whole stock model on the host): peers dropped")
        variants = [v for v in variants if not v.is_peer]
        names = [v.name for v in variants]
        if baseline not in names:
            baseline = names[0]
    copies = check_copy_memory(engine, variants)
    if copies:
        log("weight copies: " + ", ".join(f"{k} {b / 2**30:.2f} GiB" for k, b in copies.items()))
    batches = make_batches(
        max(cfg.steps_per_round, 1),
        batch=cfg.batch,
        seq_len=cfg.seq_len,
        vocab=int(engine.config.vocab_size),
        answer_tokens=cfg.answer_tokens,
        seed=cfg.seed,
    )
    runner = VariantRunner(engine, cfg, None)
    if any_hot:  # hot-set selection (part of the warm-up)
        _select_hot_set(runner, batches, emit, log)
    memory = _measure_memory(runner, variants, emit, log) if cfg.memory else []
    for v in variants:  # per-variant warm-up (unmeasured)
        runner.apply(v)
        for i in range(cfg.warmup):
            runner.step(v, batches[i % len(batches)])
    records = _rounds(runner, variants, batches, emit, log, on_round)
    if limits is not None:
        _bandwidth_after(limits, emit)
    summary = summarize(records, names, baseline)
    summary["targets"] = derived_targets(summary, limits, memory)
    summary["limits"] = limits
    summary["memory"] = memory
    emit({"kind": "summary", **summary})
    emit.close()
    _write_report(cfg, summary, records, names, log)
    return summary
