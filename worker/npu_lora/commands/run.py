"""``npu-lora run FILE.yaml``: train locally (or as the operator's Job) from a manifest or bare spec.

Everything is validated before the run directory is touched (manifest and overrides, an
existing run directory's config for resume, the data file, the tokenizer, the model): an invalid
input exits with code 2 and writes nothing. Exit codes: 0 success, 2 invalid configuration or
input (``EXIT_CONFIG_ERROR``), 3 non-finite loss (``EXIT_NONFINITE_LOSS``), 1 anything else,
130 interrupted.

Environment:
- ``NPU_LORA_RESOURCE_NAME`` (set by the operator): also report to the MoEFinetune's status
  (``npu_lora.report.status.StatusReporter``).
- ``NPU_LORA_TERMINATION_LOG``: where to write the termination message (default
  ``/dev/termination-log`` when writable).
- ``NPU_LORA_DETERMINISTIC=1``: ``torch.use_deterministic_algorithms(True)`` (bitwise
  reproducible runs and resumes on the CPU; slower).
- ``spec.distributed`` with more than one rank: ``JOB_COMPLETION_INDEX``, ``MASTER_ADDR``,
  ``MASTER_PORT`` (or torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``), see
  :mod:`npu_lora.distributed`; exit code 4 (``EXIT_RENDEZVOUS_TIMEOUT``) when the ranks did not
  all join within ``spec.distributed.rendezvousTimeoutSeconds``.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from npu_lora.api.load import SpecError
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR
from npu_lora.commands.common import EXIT_ERROR, EXIT_INTERRUPTED, add_overrides, fail
from npu_lora.distributed.group import RendezvousTimeout
from npu_lora.train.preflight import check_model

log = logging.getLogger("npu_lora.run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE.yaml", help="MoEFinetune manifest or bare spec")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="run directory (default: spec.output.path, else runs/<metadata.name>); an existing "
        "run directory with the same training config is resumed from its last checkpoint",
    )
    parser.add_argument("--steps", type=int, metavar="N", help="override spec.training.steps")
    add_overrides(parser)
    parser.add_argument(
        "--ranks",
        type=int,
        metavar="N",
        help="data-parallel ranks on this machine (same as --set distributed.ranksPerWorker=N)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument("--no-plot", action="store_true", help="do not write step_times.png")
    parser.add_argument(
        "--no-tensorboard",
        action="store_true",
        help="do not write TensorBoard event files to the run directory",
    )


# ---------------------------------------------------------------------------------------------
# seams (tests replace these)


def build_engine(spec: Any, vocab_size: int) -> Any:
    """The engine for ``spec`` (``npu_lora.engine.build_engine``)."""
    from npu_lora.engine import build_engine as _build

    return _build(spec, vocab_size=vocab_size)


def _status_reporter(ctx: Any) -> Any | None:
    """``StatusReporter`` when the operator started us (``NPU_LORA_RESOURCE_NAME``)."""
    if not os.environ.get("NPU_LORA_RESOURCE_NAME"):
        return None
    from npu_lora.report.status import StatusReporter

    try:
        return StatusReporter.from_env(ctx)
    except Exception as e:  # reporting never stops training
        log.warning("status reporting disabled: %s", e)
        return None


def check_compile_cache(spec: Any, engine: Any, *, compile_misses: bool = True) -> Any:
    """Before the first step, with a graph cache (``NPU_LORA_COMPILE_CACHE``, or
    ``spec.device.compileCache``): look every key of the run's compile plan up, count hits and
    misses, compile the misses into the cache (on ``furiosa`` or with ``device.precompile``
    on; else only count: the cpu engine runs its graphs eagerly; ``NPU_LORA_COMPILE_MISSES=0|1``
    decides instead), and return the record for summary.json (``compile``). None without a
    cache. A precompiled run compiles nothing here. A plan or compile error is recorded and logged, never fatal here:
    the engine still compiles what it needs (furiosa: at the first call)."""
    from npu_lora.compile import cache

    root = cache.cache_root(spec)
    if root is None:
        return None
    from npu_lora.api import backends as registry
    from npu_lora.compile.plan import PLAN_BACKENDS, compile_plan

    name = getattr(getattr(engine, "backend", None), "name", None)
    try:
        plan = compile_plan(spec, backend=name if name in PLAN_BACKENDS else None)
        from npu_lora.compile.precompile import ensure_plan

        env = os.environ.get("NPU_LORA_COMPILE_MISSES")
        wanted = spec.device.precompile_enabled or registry.entry(plan.backend).precompile
        misses_ok = compile_misses and (wanted if env is None else env != "0")
        rec = ensure_plan(plan, root, compile_misses=misses_ok)
    except Exception as e:  # never stops training
        log.warning("compile cache check failed: %s", e)
        return {"cache": str(root), "error": f"{type(e).__name__}: {e}"}
    print(
        f"compile cache {root}: {rec['hits']}/{rec['total']} graphs present, "
        f"{rec['compiled']} compiled here ({rec['seconds']:.1f} s)",
        file=sys.stderr,
    )
    return rec


# ---------------------------------------------------------------------------------------------


def resolve_out(args: argparse.Namespace, manifest: Any) -> Path:
    if args.out:
        return Path(args.out).expanduser()
    out = manifest.spec.output
    if out.path:
        p = Path(out.path).expanduser()
        if out.volume is not None and not p.is_absolute():
            from npu_lora.data.tokenizer import volume_root

            p = volume_root("output") / p
        return p
    return Path("runs") / (manifest.metadata.name or "run")


def _fail(message: str, code: int, callbacks: Any = None, ctx: Any = None) -> int:
    from npu_lora.train.termination import write_termination_message

    fail("run", message, code)  # and, for the operator, the termination message and status
    write_termination_message(f"exit {code}: {message}")
    if callbacks is not None and ctx is not None:
        callbacks.on_error(message, code, ctx)
    return code


def run(args: argparse.Namespace) -> int:
    from npu_lora.api.load import load_manifest

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
    )
    overrides = list(args.overrides or [])
    if args.steps is not None:
        if args.steps < 1:
            return _fail(f"--steps: must be at least 1 (got {args.steps})", EXIT_CONFIG_ERROR)
        overrides.append(f"training.steps={args.steps}")
        overrides.append("training.epochs=null")  # --steps replaces epochs
    if getattr(args, "ranks", None) is not None:
        if args.ranks < 1:
            return _fail(f"--ranks: must be at least 1 (got {args.ranks})", EXIT_CONFIG_ERROR)
        overrides.append(f"distributed.ranksPerWorker={args.ranks}")
    try:
        manifest = load_manifest(args.file, overrides)
    except SpecError as e:
        return _fail(str(e), EXIT_CONFIG_ERROR)

    if manifest.spec.benchmark is not None:
        return _benchmark(manifest, resolve_out(args, manifest))

    from npu_lora.distributed import rank_info

    try:
        info = rank_info(manifest.spec)
    except SpecError as e:
        return _fail(str(e), EXIT_CONFIG_ERROR)
    if info.distributed and info.rank is None:  # the launcher: spawn the local ranks
        from npu_lora.distributed.launch import launch

        return launch(args, info, manifest.spec, run)

    from npu_lora.train.callbacks import CallbackList, ProgressBar, RunContext

    spec = manifest.spec
    run_dir = resolve_out(args, manifest)
    # training.epochs: the steps are known once the data is read (_train)
    ctx = RunContext(manifest=manifest, run_dir=run_dir, total_steps=spec.training.steps or 0)
    ctx.extra["rank_info"] = info
    callbacks = CallbackList([])
    if info.is_rank0:  # rank 0 alone reports (progress, TensorBoard, status)
        callbacks.append(ProgressBar(disable=args.quiet))
        if not getattr(args, "no_tensorboard", False):
            from npu_lora.train.tensorboard import TensorBoardLogger

            callbacks.append(TensorBoardLogger())
        reporter = _status_reporter(ctx)
        if reporter is not None:
            callbacks.append(reporter)

    try:
        return _train(args, manifest, ctx, callbacks)
    except SpecError as e:
        return _fail(str(e), EXIT_CONFIG_ERROR, callbacks, ctx)
    except RendezvousTimeout as e:
        return _fail(str(e), e.exit_code, callbacks, ctx)
    except KeyboardInterrupt:
        _remove_temporaries(run_dir)
        return _fail("interrupted", EXIT_INTERRUPTED, callbacks, ctx)
    except OSError as e:
        if e.errno not in _STORAGE_ERRNOS or not e.filename:
            raise
        # disk full, quota, read-only, I/O error: name the path, no traceback
        _remove_temporaries(run_dir)
        text = str(e) if type(e) is not OSError else f"cannot write {e.filename}: {e.strerror}"
        return _fail(text, EXIT_ERROR, callbacks, ctx)
    except Exception as e:
        passes = sys.modules.get("npu_lora.moe.node_pass")  # imported once a pass exists
        if passes is not None and isinstance(e, passes.NodePassBroken):
            # a local rank died or stalled in the node expert pass (timeout: exit 4)
            return _fail(str(e), e.exit_code, callbacks, ctx)
        traceback.print_exc()
        return _fail(f"{type(e).__name__}: {e}", EXIT_ERROR, callbacks, ctx)


def _benchmark(manifest: Any, run_dir: Path) -> int:
    """``spec.benchmark``: the A/B harness instead of training (``npu_lora.bench.resource``)."""
    from npu_lora.train.termination import write_termination_message

    try:
        check_model(manifest.spec)
        from npu_lora.bench.resource import BenchmarkReporter, markdown, run_benchmark

        status = run_benchmark(manifest, run_dir, reporter=BenchmarkReporter.from_env())
    except SpecError as e:
        return _fail(str(e), EXIT_CONFIG_ERROR)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except Exception as e:
        traceback.print_exc()
        return _fail(f"{type(e).__name__}: {e}", EXIT_ERROR)
    print(markdown(status))
    print(f"run directory: {run_dir}")
    import json

    keys = ("best", "bestStepSeconds", "bestRatio", "roundsDone")
    write_termination_message(json.dumps({k: status.get(k) for k in keys}))
    return 0


_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.EACCES}


def _remove_temporaries(run_dir: Path) -> None:
    """After a failed write: this process's temporary files and directories in the run dir."""
    import shutil

    pid = os.getpid()
    for pattern in (f"checkpoint.tmp-{pid}", f".*.tmp-{pid}", ".adapter.tmp", ".adapter-best.tmp"):
        for p in run_dir.glob(pattern):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _world_note(run_plan: Any, world: int, global_rows: int) -> str | None:
    """The line printed when a checkpoint written by another world size is resumed (the config
    check, :func:`npu_lora.train.rundir.config_differences`, has made sure that the global
    micro-batch is the same)."""
    ckpt = run_plan.copy_from or run_plan.resume.checkpoint  # spec.resumeFrom: the source
    if ckpt is None:
        return None
    import json

    try:
        state = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    saved = int(state.get("world_size") or 1)
    if saved == world:
        return None
    return (
        f"the checkpoint was written by {saved} rank(s), this run has {world}: same global "
        f"micro-batch ({global_rows} rows), the rows re-sharded over {world} rank(s)"
    )


def memory_record(
    spec: Any, examples: int, host: Any, keep_graph: dict[str, Any] | None
) -> dict[str, Any] | None:
    """summary.json ``memory``: the run's estimate (:mod:`npu_lora.api.memory`, with the host
    dtype the engine chose and the kept-graph layers) and ``memory: auto``'s limit for it;
    logged. None without the model's widths."""
    from npu_lora.api.memory import estimate, model_widths

    cfg = model_widths(spec)
    if cfg is None:
        return None
    kept = keep_graph.get("kept_layers") if keep_graph else None
    est = estimate(spec, cfg, examples, host.dtype if host is not None else None, kept)
    if est is None:
        return None
    log.info("memory: %s", est.with_limit())
    return {
        "estimate_bytes": est.total,
        "auto_limit_bytes": est.limit,
        "terms": {
            "weights": est.weights,
            "trainable": est.trainable,
            "activations": est.activations,
            "data": est.data,
            "runtime": est.runtime,
            "transient": est.transient,
        },
        "host_dtype": est.host_dtype,
        "ranks": est.ranks,
    }


def total_steps(spec: Any, examples: int, world: int, plan: Any) -> int:
    """The run's optimizer steps (``training.steps``, or ``epochs`` over ``examples``); checks
    ``moe.warmupSteps``, ``training.warmupSteps`` and the checkpoint against it (SpecError)."""
    t = spec.training
    total = t.total_steps(examples, world)
    field = "spec.training.steps" if t.epochs is None else "spec.training.epochs"
    if t.warmup_steps is not None and t.warmup_steps >= total:
        # refused, not warned: the learning rate would never reach training.learningRate, and
        # the run's whole cost would go into a schedule the author did not ask for
        raise SpecError(
            f"spec.training.warmupSteps: {t.warmup_steps} is not less than the run's {total} "
            "steps, so the learning-rate warm-up would never end within the run; set fewer "
            "warm-up steps (or training.warmupRatio)"
        )
    if spec.moe.placement != "host-only" and spec.moe.warmup_steps >= total:
        raise SpecError(
            f"{field}: the run has {total} steps, not more than moe.warmupSteps "
            f"({spec.moe.warmup_steps}) with placement {spec.moe.placement}"
        )
    step = getattr(plan, "checkpoint_step", 0) or 0
    if getattr(plan, "checkpoint", None) is not None and step > total:
        raise SpecError(
            f"{field}: the run has {total} steps, less than the step of the checkpoint "
            f"({step}); use at least {step} steps"
        )
    return total


def _train(args: argparse.Namespace, manifest: Any, ctx: Any, callbacks: Any) -> int:
    spec = manifest.spec
    info = ctx.extra["rank_info"]
    # 1. validate everything that can be checked without writing
    from npu_lora.train.identity import apply_plan, plan_run
    from npu_lora.train.preflight import check_memory, check_out_writable
    from npu_lora.train.rundir import ResumePlan

    run_plan = None
    plan = ResumePlan(exists=False)
    if info.is_rank0:  # the other ranks never touch the run directory
        check_out_writable(ctx.run_dir)
        run_plan = plan_run(ctx.run_dir, manifest)
        plan = run_plan.resume
        from npu_lora.train.rundir import global_batch

        note = _world_note(run_plan, info.world_size, global_batch(manifest))
        if note is not None:
            run_plan.notes.append(note)
    check_model(spec)
    check_memory(spec)
    from npu_lora.data import prepare_data

    dataset, tok = prepare_data(spec)
    check_memory(spec, examples=len(dataset))
    ctx.total_steps = total_steps(spec, len(dataset), info.world_size, plan)
    from npu_lora.evaluate.heldout import HeldOutEval, prepare_eval

    evalset = prepare_eval(spec, tok) if info.is_rank0 else None
    evaluator = HeldOutEval(spec, evalset) if evalset is not None else None

    import torch

    from npu_lora.train.loop import Trainer, seed_everything
    from npu_lora.train.summary import timing_table
    from npu_lora.train.termination import write_termination_message

    if os.environ.get("NPU_LORA_DETERMINISTIC", "") not in ("", "0"):
        torch.use_deterministic_algorithms(True)
    dp = None
    if info.distributed:
        from npu_lora.distributed.group import DataParallel, init_group

        init_group(info)  # RendezvousTimeout: exit 4, nothing written
        dp = DataParallel(info)
    seed_everything(spec.training.seed)
    from npu_lora.distributed.launch import build_shared

    # SpecError (bad model/backend) still writes nothing
    engine = build_shared(lambda: build_engine(spec, len(tok)), spec)
    if spec.moe.keep_graph is None and hasattr(engine, "keep_graph_layers"):
        from npu_lora.engine.build import keep_graph_auto
        from npu_lora.train.preflight import memory_limit

        # the kept graphs sized to this process's limit; summary.json "keep_graph"
        ctx.extra["keep_graph"] = keep_graph_auto(engine, spec, memory_limit(), len(dataset))
    compiled = check_compile_cache(spec, engine, compile_misses=info.is_rank0)
    if compiled is not None:  # summary.json "compile"
        ctx.extra["compile"] = compiled
    host = getattr(engine, "host_choice", None)
    mem = memory_record(spec, len(dataset), host, ctx.extra.get("keep_graph"))
    if mem is not None:  # summary.json "memory" (peak_rss_bytes added at the end)
        ctx.extra["memory"] = mem
    if host is not None:  # status.host (the reporter's on_start); the log line is in the engine
        ctx.extra["host"] = host.status()
        if host.warning:
            print(f"warning: {host.warning}", file=sys.stderr)

    # 2. train (creates / resumes the run directory)
    if run_plan is not None:
        for note in run_plan.notes:
            print(note, file=sys.stderr)
        apply_plan(run_plan, ctx.run_dir)
    if plan.checkpoint is not None:
        done = plan.checkpoint_step is not None and plan.checkpoint_step >= ctx.total_steps
        print(
            f"resuming {ctx.run_dir} from the checkpoint at step {plan.checkpoint_step}"
            + (
                f": the run had finished ({ctx.total_steps} steps), nothing to train; to start "
                "fresh use another --out DIR or remove that directory"
                if done
                else ""
            ),
            file=sys.stderr,
        )
    trainer = Trainer(
        ctx,
        engine,
        dataset,
        plan=plan,
        callbacks=callbacks,
        plot=not args.no_plot,
        dist=dp,
        evaluator=evaluator,
    )
    result = None
    try:
        result = trainer.run()
    finally:
        if dp is not None:
            from npu_lora.distributed.group import destroy_group

            destroy_group(synchronize=result is not None and result.exit_code == 0)
    if not info.is_rank0:
        return result.exit_code
    if result.exit_code != 0:
        message = result.message
        if ctx.extra.get("stop_reason"):  # the run was deleted (see StatusReporter)
            message = f"{ctx.extra['stop_reason']}: {message}"
        print(f"npu-lora run: error: {message}", file=sys.stderr)
        write_termination_message(f"exit {result.exit_code}: {message}")
        return result.exit_code
    summary = result.summary or {}
    print(timing_table(summary))
    print(f"run directory: {ctx.run_dir}")
    write_termination_message(summary)
    return 0
