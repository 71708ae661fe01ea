"""A/B harness: HostMLP variants (and stock peers) interleaved in one process, on one model.

Design (why it looks like this):

- **One model, one set of weights.** The engine is built once (seed fixed); variants switch its
  mode (``engine.modes.set``) and experts kernel in place (``VariantRunner.apply``), so
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
- **Verdicts from rounds** (``verdicts.judge``): every target is judged on the median of its
  per-round paired figures, quoted with the rounds on the target's side, the per-round range and
  the rounds disturbed by other processes; never on the best of several samples. Each round
  samples the read-only and copy bandwidth before its steps and records its load average and
  other processes' CPU time (``disturbance``).

Modules: ``config`` (``BenchConfig``, spec, batches), ``runner`` (``VariantRunner``: switching
and stepping variants), ``rounds`` (the measured rounds, bandwidth samples, ``bench.jsonl``),
``disturbance``, ``stats`` (medians, paired comparisons), ``verdicts``, ``report`` (``bench.md``,
``bench.png``); this module runs them in order (``run_bench``) and re-exports their public names.
- No optimizer step: gradients are cleared after every step so every variant sees the same
  weights and routing (the LoRA AdamW update is negligible next to a step).

Outputs (``out`` directory): ``bench.jsonl`` (one record per measured step, plus ``kind`` =
``meta`` / ``limits`` / ``round`` / ``memory`` / ``summary`` records), ``bench.md`` (the table),
``bench.png`` (per-variant stacked timing breakdown).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from npu_lora.api.sizing import attention_impl
from npu_lora.bench.config import (
    DEFAULT_PEERS,
    DEFAULT_VARIANTS,
    BenchConfig,
    build_spec,
    make_batches,
)
from npu_lora.bench.host_layer import pass_lines, probe_lines, run_probe, supported
from npu_lora.bench.report import plot, render_table, write_report
from npu_lora.bench.rounds import Emitter, bandwidth_after, bandwidth_before, run_rounds
from npu_lora.bench.runner import (
    VariantRunner,
    available_bytes,
    check_copy_memory,
    copy_bytes,
    measure_kept_graph_bytes,
    stream_compute_dtype,
)
from npu_lora.bench.stats import PROFILE_COLUMNS, hot_dispatch_lines, paired, summarize
from npu_lora.bench.variant import Variant
from npu_lora.bench.verdicts import Verdict, derived_targets, judge, peer_fairness
from npu_lora.machine import cpu_capabilities, machine_facts

__all__ = [
    "DEFAULT_PEERS",
    "DEFAULT_VARIANTS",
    "PROFILE_COLUMNS",
    "BenchConfig",
    "Variant",
    "VariantRunner",
    "Verdict",
    "available_bytes",
    "build_spec",
    "check_copy_memory",
    "copy_bytes",
    "derived_targets",
    "hot_dispatch_lines",
    "judge",
    "make_batches",
    "measure_kept_graph_bytes",
    "paired",
    "peer_fairness",
    "plot",
    "render_table",
    "run_bench",
    "stream_compute_dtype",
    "summarize",
]


def _variants(cfg: BenchConfig) -> tuple[list[Variant], str]:
    """The variants to run (peers appended) and the baseline's name. Rows our engine runs on
    sdpa (``api.sizing.attention_impl``: S >= ``SDPA_MIN_SEQ`` on cpu) get each peer twice: as
    built (eager attention, the seed's peer) and ``peer+sdpa`` (transformers' default attention,
    the same attention core as ours): the fair peer at long S."""
    variants = [Variant.parse(v) for v in cfg.variants]
    if cfg.peers:
        have = {v.name for v in variants}
        peers = [f"peer@{i}" for i in cfg.peer_impls]
        if attention_impl(cfg.backend, cfg.seq_len) == "sdpa":
            peers += [f"peer+sdpa@{i}" for i in cfg.peer_impls]
        variants += [Variant.parse(p) for p in peers if p not in have]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate variants: {names}")
    baseline = cfg.baseline or names[0]
    if baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
    return variants, baseline


def resolve_run_defaults(cfg: BenchConfig) -> tuple[BenchConfig, str]:
    """``cfg`` with ``host_dtype`` ``auto`` resolved as ``npu-lora run`` resolves it on this CPU
    (for the default experts kernel), and the header line saying what the bench runs: kernel
    (with the compiled kernel's ISA), host dtype and why, threads, and whether that is what
    ``npu-lora run`` runs by default (``moe.expertsKernel``, ``moe.hostDtype``, all cores)."""
    from npu_lora.api.v1alpha1.sections import MoESpec
    from npu_lora.moe.host_dtype import resolve_host_dtype

    run_kernel = MoESpec.model_fields["experts_kernel"].default
    run_dtype = MoESpec.model_fields["host_dtype"].default
    requested = cfg.host_dtype
    choice = resolve_host_dtype(requested, cfg.experts_impl, log_it=False)
    dtype, why, backend = choice.dtype, choice.reason, choice.kernel_backend
    if requested == "auto":
        cfg = replace(cfg, host_dtype=dtype)
    differs = []
    if cfg.experts_impl != run_kernel:
        differs.append(f"experts kernel {cfg.experts_impl} (run: {run_kernel})")
    if requested != run_dtype:
        differs.append(f"host dtype {requested} (run: {run_dtype})")
    if cfg.threads:
        differs.append(f"threads {cfg.threads} (run: all cores unless moe.hostThreads)")
    kernel = f"{cfg.experts_impl} ({backend})" if backend else cfg.experts_impl
    header = (
        f"bench runs: experts kernel {kernel}, host dtype {dtype} ({why}), "
        f"{torch.get_num_threads()} threads: "
        + (
            "what `npu-lora run` runs by default"
            if not differs
            else "not `npu-lora run`'s defaults: " + "; ".join(differs)
        )
    )
    return cfg, header


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
    emit: Emitter,
    log: Callable[[str], None],
) -> None:
    """As the engine does it: host-only steps counting routing, then ``select_hot_experts``."""
    engine, cfg = runner.engine, runner.cfg
    runner.apply(Variant("warmup", "host-only", True, None))
    for i in range(cfg.hot_warmup_steps):
        engine.forward_backward(batches[i % len(batches)])
        runner._clear_grads()
    engine.modes.set(replace(engine.modes.mode, placement="hot"))
    info = engine.select_hot_experts(cfg.hot_warmup_steps)
    runner.hot_layers = [m.hot for m in engine.mlps]
    emit({"kind": "hot", "experts": info.get("experts"), "per_layer": info.get("per_layer")})
    log(f"hot set: {info.get('experts')} experts over {engine.num_layers} layers")


def _measure_memory(
    runner: VariantRunner, variants: list[Variant], emit: Emitter, log: Callable[[str], None]
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


def _layer_probe(
    runner: VariantRunner,
    variants: list[Variant],
    batch: dict[str, torch.Tensor],
    emit: Emitter,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """``host_layer.run_probe`` on the engine switched to host-only + keep_graph with the stream
    kernel (when a variant runs it), after the rounds; else why not."""
    from npu_lora.moe.host_dtype import STREAM

    cfg = runner.cfg
    if not any((v.experts_impl or cfg.experts_impl) == STREAM for v in variants if not v.is_peer):
        return {"kind": "layer_probe_summary", "why": f"no {STREAM} variant in this run"}
    runner.apply(Variant(f"probe@{STREAM}", "host-only", True, STREAM))
    why = supported(runner.engine)
    if why:
        return {"kind": "layer_probe_summary", "why": why}
    return run_probe(runner.engine, batch, rounds=cfg.rounds, emit=emit, log=log, seed=cfg.seed)


def _peak_rss(
    cfg: BenchConfig, names: list[str], emit: Emitter, log: Callable[[str], None]
) -> list[dict]:
    """``--peak-rss``: each host-only/peer variant's peak RSS in a process of its own
    (:mod:`npu_lora.bench.peak_rss`), before this process builds its engine."""
    from npu_lora.bench.peak_rss import measure

    recs = measure(cfg, names, log)
    for r in recs:
        emit(r)
    return recs


def _q8_errors(
    runner: VariantRunner,
    variants: list[Variant],
    emit: Emitter,
    log: Callable[[str], None],
) -> list[dict]:
    """``+int8`` / ``+fp8``: each layer's output and dX error against the engine's own experts
    (:func:`npu_lora.bench.q8.layer_errors`), once per 8-bit variant, on ``batch·seqLen`` tokens;
    one ``q8_error`` record per layer."""
    from npu_lora.bench.q8 import layer_errors

    cfg = runner.cfg
    errors: list[dict] = []
    own = runner.own_weights()
    reference = str(own[0][0].dtype).removeprefix("torch.") if own else "?"
    for v in variants:
        if not v.q8:
            continue
        runner.apply(Variant(f"{v.name} (own)", "host-only", True, v.experts_impl))
        base_compute = runner.engine.mlps[0].compute_dtype
        runner.apply(v)
        q8_compute = runner.engine.mlps[0].compute_dtype
        rows = layer_errors(
            runner.engine,
            own,
            runner.q8_weights(v.q8),
            cfg.batch * cfg.seq_len,
            cfg.seed,
            (base_compute, q8_compute),
        )
        for r in rows:
            rec = {"kind": "q8_error", "variant": v.name, "format": v.q8, "reference": reference}
            rec.update(r)
            emit(rec)
            errors.append(rec)
        worst = max(max(r["out"]["max_rel"], r["dx"]["max_rel"]) for r in rows)
        log(f"{v.name}: per-layer error vs {reference} experts, worst max {worst:.2%}")
    return errors


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
    cfg, header = resolve_run_defaults(cfg)
    log(header)
    torch.manual_seed(cfg.seed)
    variants, baseline = _variants(cfg)
    any_hot = any(v.placement == "hot" for v in variants)
    emit = Emitter(out / "bench.jsonl")
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
    rss = _peak_rss(cfg, names, emit, log) if cfg.peak_rss and engine is None else []
    limits = bandwidth_before(emit, log) if cfg.limits else None
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
    from npu_lora.bench.q8 import check_q8

    check_q8(engine, engine.expert_weights(), variants, cfg.experts_impl)  # before any copy or step
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
    q8_errors = _q8_errors(runner, variants, emit, log)
    records = run_rounds(runner, variants, batches, emit, log, on_round)
    probe = _layer_probe(runner, variants, batches[0], emit, log) if cfg.layer_probe else None
    if limits is not None:
        bandwidth_after(limits, emit, [r for r in records if r.get("kind") == "round"])
    summary = summarize(records, names, baseline)
    summary["targets"] = derived_targets(summary, limits, memory)
    fair = peer_fairness(cfg.host_dtype, cpu_capabilities()["native_bf16"], names)
    if fair:
        summary["targets"].append(fair)
    if probe is not None:
        summary["layer_probe"] = probe
        summary["targets"] += probe_lines(probe)
        summary["targets"] += pass_lines(engine, probe)
    summary["limits"] = limits
    summary["memory"] = memory
    if q8_errors:
        summary["q8_errors"] = q8_errors
    if rss:
        summary["peak_rss"] = rss
    emit({"kind": "summary", **summary})
    emit.close()
    write_report(cfg, summary, records, names, log)
    return summary
