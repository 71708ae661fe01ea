"""The training loop: AdamW, gradient accumulation, clipping, hot-expert selection, checkpoints.

Per optimizer step ``s`` (1-based)::

    torch.manual_seed(step_seed(seed, s, rank))  # dropout: a function of (seed, step, rank)
    for m in range(gradAccumulation): engine.forward_backward(batch(s, m), loss_scale=1/accum)
    clip_grad_norm_(trainable, maxGradNorm); opt.step(); sched.step(); opt.zero_grad();
    engine.hotset.sync_weights()
    spec.eval, every eval.everySteps and at the end: evaluate (no grad, training state untouched)
        → eval.jsonl, adapter-best/ on a new best eval loss, the step record gains ``eval_s``
    record → metrics.jsonl (flushed + fsynced) → callbacks.on_step (→ callbacks.on_eval)
    engine.select_hot_experts(s)      # hot/auto: picks the hot set once s == warmupSteps; then
                                      # refreshes it (hotRefreshSteps) or runs the auto trials
    checkpoint every checkpoint.everySteps steps and at the end

Learning rate: AdamW at ``training.learningRate`` times the schedule (transformers'
``get_scheduler``: ``constant_with_warmup``, ``linear`` or ``cosine`` with the warm-up of
``training.warmupSteps|warmupRatio`` over ``ctx.total_steps``); the record's ``lr`` is the rate
the step's update used. The scheduler's state is in every checkpoint (``state.json``), so a
resumed run continues the same schedule.

The record of a step sums the micro-batches' timings, device calls and tokens; ``loss`` is their
mean (unscaled). A non-finite loss or gradient norm writes that step's record (``loss`` null when
not finite, ``nonfinite`` says which) and stops with :class:`NonFiniteLoss` before the optimizer
touches the weights.

SIGTERM (pod deletion, node drain, preemption) lets the step in flight finish, writes a
checkpoint of it and exits with 143 (128 + 15); a SIGKILL loses the steps since the last checkpoint
(they are re-run on resume). Either way a rerun of the same command resumes.

Data parallel (``dist``: :class:`npu_lora.distributed.group.DataParallel`): each rank trains on
its shard of every micro-batch; the collectives of a step are listed in
:mod:`npu_lora.distributed.group`. Only rank 0 touches the run directory (lock, metrics.jsonl,
checkpoints, adapter, summary) and runs the callbacks (status, TensorBoard, progress); the
record gains :data:`npu_lora.distributed.group.RECORD_KEYS`.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from npu_lora.api import record as step_record
from npu_lora.api.timefmt import rfc3339
from npu_lora.api.v1alpha1 import EXIT_NONFINITE_LOSS
from npu_lora.train import rundir
from npu_lora.train.callbacks import CallbackList, RunContext, TrainCallback, placement_line
from npu_lora.train.checkpoint import clean_stale, fsync_dir, load_checkpoint, save_checkpoint
from npu_lora.train.summary import build_summary, plot_step_times

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from npu_lora.data.dataset import TokenizedDataset
    from npu_lora.engine.profile import StepProfile


class TrainAdapter(Protocol):
    """The trainable state (:class:`npu_lora.engine.state.AdapterState`)."""

    def parameters(self) -> list[torch.nn.Parameter]: ...
    def save(self, path: str | Path) -> None: ...
    def state_dict(self) -> dict[str, torch.Tensor]: ...


class TrainHotSet(Protocol):
    """The routing counts and the device copies (:class:`npu_lora.engine.hotset.HotSet`)."""

    def routing_counts(self) -> torch.Tensor: ...
    def load_routing_counts(self, counts: torch.Tensor) -> None: ...
    def sync_weights(self) -> None: ...


class TrainEngine(Protocol):
    """What the loop needs of an engine (:class:`npu_lora.engine.HybridEngine`; the tests'
    stand-in runs the plain peft model behind the same interface): one micro-batch, the hot
    set's choice and state, and the parts that own the trainable state (``adapter``) and the
    routing counts (``hotset``)."""

    backend: Any
    adapter: TrainAdapter
    hotset: TrainHotSet

    def forward_backward(
        self, batch: dict[str, torch.Tensor], loss_scale: float = 1.0
    ) -> StepProfile: ...
    def select_hot_experts(self, step: int) -> dict[str, Any]: ...
    def hot_state(self) -> dict[str, Any] | None: ...
    def load_hot_state(self, state: dict[str, Any] | None) -> None: ...


class Stopped(RuntimeError):
    """A stop signal arrived; the step in flight was finished and checkpointed."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NonFiniteLoss(RuntimeError):
    """The loss (or gradient norm) became NaN/inf; exit code 3."""

    exit_code = EXIT_NONFINITE_LOSS


@dataclass
class TrainResult:
    exit_code: int
    summary: dict[str, Any] | None
    message: str = ""


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """The seed of optimizer step ``step`` on rank ``rank``: the loop seeds torch's generators
    with it before the step, so the step's random draws (LoRA dropout) are a function of
    ``(training.seed, step, rank)`` alone. A resume needs no RNG state for them, and the ranks of
    a data-parallel run draw independent masks (before: every rank continued rank 0's stream,
    the same masks on every rank). The masks depend on the world size (a rank's rows and its
    stream change with it): docs/distributed.md."""
    import hashlib

    digest = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _iso(t: float) -> str:
    return rfc3339(t, millis=True)


def _peak_rss() -> int | None:
    """This process's peak resident set so far (bytes; getrusage ``ru_maxrss``, KiB on Linux)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _deterministic() -> bool:
    import torch

    return bool(torch.are_deterministic_algorithms_enabled())


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def label_count(batch: dict[str, Any]) -> int:
    """Label tokens of a micro-batch as the loss counts them (HF shift: ``labels[:, 1:]``); the
    data-parallel loss weights (``DataParallel.loss_weights``) are computed from these."""
    labels = batch["labels"]
    return int((labels[:, 1:] != -100).sum())


class Trainer:
    """Runs (or resumes) one run in ``ctx.run_dir`` with an already built engine and dataset."""

    def __init__(
        self,
        ctx: RunContext,
        engine: TrainEngine,
        dataset: TokenizedDataset,
        *,
        plan: rundir.ResumePlan | None = None,
        callbacks: list[TrainCallback] | CallbackList | None = None,
        plot: bool = True,
        dist: Any = None,
        evaluator: Any = None,
    ) -> None:
        self.ctx = ctx
        self.spec = ctx.spec
        self.engine = engine
        self.dataset = dataset
        self.plan = plan or rundir.ResumePlan(exists=False)
        self.callbacks = (
            callbacks if isinstance(callbacks, CallbackList) else CallbackList(callbacks)
        )
        self.plot = plot
        self.records: list[dict[str, Any]] = []
        self.hot_info: dict[str, Any] | None = None
        self._stop_signal: int | None = None
        self.dist = dist
        self.rank0 = dist is None or dist.is_rank0
        #: spec.eval (:class:`npu_lora.evaluate.heldout.HeldOutEval`); rank 0 alone evaluates
        self.evaluator = evaluator if self.rank0 else None
        self.sched: Any = None
        if dist is not None and hasattr(engine, "agree_placement_with"):
            engine.agree_placement_with(dist.agree)  # every rank keeps rank 0's placement choice

    # ------------------------------------------------------------------------------------------
    def _make_optimizer(self) -> Any:
        import torch

        t = self.spec.training
        params = list(self.engine.adapter.parameters())
        if not params:
            raise RuntimeError("the engine has no trainable parameters")
        return torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay)

    def _make_scheduler(self, opt: Any) -> Any:
        """transformers' schedule for ``training.scheduler`` over ``ctx.total_steps``."""
        from transformers import get_scheduler

        t = self.spec.training
        total = self.ctx.total_steps
        name = {"constant": "constant_with_warmup"}.get(t.scheduler, t.scheduler)
        return get_scheduler(
            name, opt, num_warmup_steps=t.warmup_for(total), num_training_steps=total
        )

    def _restore_scheduler(self, state: dict[str, Any] | None, done: int) -> None:
        if state:
            self.sched.load_state_dict(state)
            return
        for _ in range(done):  # a checkpoint without its schedule (older runs): replay it
            self.sched.step()

    def _prepare_dir(self) -> int:
        """Create/resume the run directory; returns the last completed step (0: fresh)."""
        run_dir = self.ctx.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._lock(run_dir)
        clean_stale(run_dir)
        start = self.plan.checkpoint_step if self.plan.checkpoint is not None else 0
        self.records = rundir.truncate_metrics(run_dir / rundir.METRICS, start)
        rundir.write_text_atomic(run_dir / rundir.CONFIG, rundir.manifest_yaml(self.ctx.manifest))
        return start

    def _lock(self, run_dir: Path) -> None:
        """One process per run directory (advisory ``flock`` on ``.lock``, released at exit)."""
        import fcntl

        from npu_lora.api.load import SpecError

        self._lock_file = open(run_dir / ".lock", "a+")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecError(
                f"--out: {run_dir} is in use by another npu-lora run (lock {run_dir / '.lock'})"
            ) from None
        except OSError:  # a filesystem without flock: go on unlocked
            pass

    def _eval_writer(self, done: int) -> rundir.MetricsWriter | None:
        """``eval.jsonl`` (rank 0 with spec.eval), cut to the evaluations up to step ``done``."""
        if self.evaluator is None:
            return None
        from npu_lora.evaluate.heldout import EVAL_FILE

        path = self.ctx.run_dir / EVAL_FILE
        rundir.truncate_metrics(path, done)
        return rundir.MetricsWriter(path)

    def _evaluate(self, step: int, writer: rundir.MetricsWriter) -> dict[str, Any]:
        """Evaluate after ``step``: eval.jsonl, adapter-best/ on a new best, ctx.extra['eval']."""
        from npu_lora.evaluate.heldout import BEST_ADAPTER

        assert self.evaluator is not None
        rec = self.evaluator.run(self.engine, step)
        writer.write(rec)
        if rec["best"]:
            self._save_adapter(BEST_ADAPTER)
        self.ctx.extra["eval"] = {**rec, "best": self.evaluator.best}
        log.info(
            "eval after step %d: loss %.4f%s (%.1f s)",
            step,
            rec["loss"],
            "" if rec["accuracy"] is None else f", accuracy {rec['accuracy']:.4f}",
            rec["seconds"],
        )
        return rec

    def _save_adapter(self, name: str = rundir.ADAPTER) -> Path:
        run_dir = self.ctx.run_dir
        final = run_dir / name
        tmp = run_dir / f".{name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        self.engine.adapter.save(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        fsync_dir(run_dir)
        return final

    def _checkpoint(self, step: int, opt: Any) -> None:
        if not self.rank0:
            self.ctx.checkpoint_step = step
            return
        path = save_checkpoint(
            self.ctx.run_dir,
            step,
            self.engine,
            opt,
            extra={
                "hot": self.hot_info,
                "name": self.ctx.name,
                "scheduler": self.sched.state_dict() if self.sched is not None else None,
                **({"eval": self.evaluator.state()} if self.evaluator is not None else {}),
                **({"world_size": self.dist.world} if self.dist is not None else {}),
            },
        )
        self.ctx.checkpoint_step = step
        self.callbacks.on_checkpoint(step, str(path), self.ctx)

    def _step(self, step: int, opt: Any) -> dict[str, Any]:
        import torch

        t = self.spec.training
        accum = t.grad_accumulation
        t0 = time.perf_counter()
        agg: dict[str, Any] = {k: step_record.zero(k) for k in step_record.SUMMED}
        losses: list[float] = []
        tokens = 0
        last: dict[str, Any] = {}
        dist = self.dist
        torch.manual_seed(step_seed(t.seed, step, 0 if dist is None else dist.rank))
        if dist is None:
            batches = [self.dataset.batch(step, m, t.batch_size, accum) for m in range(accum)]
            weights = [1.0] * accum
        else:
            batches = [
                self.dataset.batch(step, m, t.batch_size, accum, rank=dist.rank, world=dist.world)
                for m in range(accum)
            ]
            weights = dist.loss_weights([label_count(b) for b in batches])
            counts_before = self.engine.hotset.routing_counts()
        for m, batch in enumerate(batches):
            last = self.engine.forward_backward(batch, loss_scale=weights[m] / accum).to_dict()
            losses.append(float(last["loss"]))
            tokens += int(last.get("tokens") or 0)
            for k in step_record.SUMMED:
                agg[k] = step_record.add(agg[k], last.get(k))
        loss = sum(losses) / len(losses)
        params = [p for p in opt.param_groups[0]["params"]]
        comm = None
        if dist is not None:
            # the global batch's gradient, loss, tokens and routing counts on every rank
            compute_s = time.perf_counter() - t0
            nbytes, ar_s = dist.reduce_gradients(params)
            dist.reduce_routing_counts(self.engine, counts_before)
            share = sum(w * x for w, x in zip(weights, losses, strict=True)) / accum
            comm = dist.step_end(
                compute_s, self._stop_signal is not None, share, tokens, agg["expert_bytes"]
            )
            comm.allreduce_bytes, comm.allreduce_s = nbytes, ar_s
            loss, tokens = comm.loss, comm.tokens
            if comm.stop and self._stop_signal is None:
                self._stop_signal = signal.SIGTERM  # another rank was stopped: stop together
        grad_norm: float | None = None
        nonfinite = None
        t_opt = time.perf_counter()
        lr = opt.param_groups[0]["lr"]  # the rate this step's update uses
        if not _finite(loss):
            nonfinite = "loss"
        else:
            max_norm = t.max_grad_norm if t.max_grad_norm is not None else float("inf")
            gn = torch.nn.utils.clip_grad_norm_(params, max_norm)
            grad_norm = float(gn)
            if not _finite(grad_norm):
                nonfinite = "grad_norm"
            else:
                opt.step()
                if self.sched is not None:
                    self.sched.step()
                self.engine.hotset.sync_weights()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        rec = step_record.ordered(
            {
                **agg,
                "step": step,
                "loss": loss if _finite(loss) else None,
                "step_s": t1 - t0,
                "tokens": tokens,
                "hot_experts": int(last.get("hot_experts") or 0),
                "keep_graph": bool(last.get("keep_graph", self.spec.moe.keep_graph)),
                "placement": str(last.get("placement", self.spec.moe.placement)),
                **self._host_columns(),
                "lr": lr,
                "grad_norm": grad_norm if grad_norm is None or _finite(grad_norm) else None,
                "time": _iso(time.time()),
                "opt_s": t1 - t_opt,
                "micro_batches": accum,
                # the worker's ranks together (one process: its own)
                "node_expert_bytes": agg["expert_bytes"]
                if comm is None
                else comm.node_expert_bytes,
            }
        )
        if comm is not None:
            rec.update(comm.record(dist.world))
        if nonfinite:
            rec["nonfinite"] = nonfinite
            rec["nonfinite_value"] = repr(loss if nonfinite == "loss" else grad_norm)
        return rec

    def _host_columns(self) -> dict[str, str | None]:
        """The record's ``expert_dtype`` / ``expert_layout``: the engine's host choice
        (``status.host``); the spec's ``moe.hostDtype`` and null without one."""
        choice = getattr(self.engine, "host_choice", None)
        if choice is None:
            return {"expert_dtype": str(self.spec.moe.host_dtype), "expert_layout": None}
        return {"expert_dtype": str(choice.dtype), "expert_layout": choice.layout}

    # ------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Train from the start or the last checkpoint to ``ctx.total_steps``."""
        try:
            return self._run()
        finally:
            lock = getattr(self, "_lock_file", None)
            if lock is not None:
                lock.close()  # releases the flock
                self._lock_file = None

    def _run(self) -> TrainResult:
        ctx, spec = self.ctx, self.spec
        t_start = time.perf_counter()
        opt = self._make_optimizer()
        self.sched = self._make_scheduler(opt)
        done = self._prepare_dir() if self.rank0 else 0
        sched_state: dict[str, Any] | None = None
        if self.rank0 and self.plan.checkpoint is not None:
            state = load_checkpoint(self.ctx.run_dir / "checkpoint", self.engine, opt)
            done = int(state["step"])
            sched_state = state.get("scheduler")
            self._restore_scheduler(sched_state, done)
            if self.evaluator is not None:
                self.evaluator.load_state(state.get("eval"))
                if self.evaluator.last:
                    ctx.extra["eval"] = {**self.evaluator.last, "best": self.evaluator.best}
            ctx.resumed_from = done
            ctx.checkpoint_step = done
            self.hot_info = state.get("hot")
            ctx.hot = self.hot_info
            choice = self._placement_choice()
            if choice and choice.get("chosen"):
                ctx.extra["placement"] = choice
        if self.dist is not None:  # rank 0's start (fresh or resumed) on every rank
            got = self.dist.broadcast_start(
                self.engine,
                opt,
                {
                    "done": done,
                    "hot": self.hot_info,
                    "resumed_from": ctx.resumed_from,
                    "scheduler": self.sched.state_dict(),
                },
            )
            done, self.hot_info = int(got["done"]), got["hot"]
            if not self.rank0:
                self._restore_scheduler(got.get("scheduler"), done)
            ctx.resumed_from, ctx.checkpoint_step, ctx.hot = got["resumed_from"], done, got["hot"]
        ctx.start_step = done + 1
        total = ctx.total_steps
        hot_mode = spec.moe.placement != "host-only"  # hot or auto
        if ctx.extra.get("memory") is not None:  # what the load held, before any step
            ctx.extra["memory"]["start_peak_rss_bytes"] = _peak_rss()
        self.callbacks.on_start(ctx)
        self._install_signals()
        metrics = rundir.MetricsWriter(ctx.run_dir / rundir.METRICS) if self.rank0 else None
        evals = self._eval_writer(done)
        try:
            if hot_mode and done == 0:
                self._maybe_select_hot(0)
            for step in range(done + 1, total + 1):
                rec = self._step(step, opt)
                ev = None
                if evals is not None and "nonfinite" not in rec and self.evaluator.due(step, total):
                    ev = self._evaluate(step, evals)
                    rec["eval_s"] = ev["seconds"]
                if metrics is not None:
                    metrics.write(rec)
                self.records.append(rec)
                self.callbacks.on_step(rec, ctx)
                if ev is not None:
                    self.callbacks.on_eval(ev, ctx)
                if "nonfinite" in rec:
                    what = "loss" if rec["nonfinite"] == "loss" else "gradient norm"
                    raise NonFiniteLoss(
                        f"non-finite {what} ({rec['nonfinite_value']}) at step {step}; the "
                        f"step's record is in {ctx.run_dir / rundir.METRICS}. Lower "
                        "spec.training.learningRate or set spec.training.maxGradNorm."
                    )
                if hot_mode:
                    self._maybe_select_hot(step)
                every = spec.checkpoint.every_steps
                if step % every == 0 or step == total or self._stop_signal is not None:
                    self._checkpoint(step, opt)
                if self._stop_signal is not None and step < total:
                    raise Stopped(
                        f"stopped by signal {self._stop_signal} after step {step}; checkpoint "
                        f"written: rerun the same command to resume",
                        128 + self._stop_signal,
                    )
        except Stopped as e:
            if metrics is not None:
                metrics.close()
            self.callbacks.on_error(str(e), e.exit_code, ctx)
            return TrainResult(e.exit_code, None, str(e))
        except NonFiniteLoss as e:
            if metrics is not None:
                metrics.close()
            summary = self._finish(t_start, status="failed", error=str(e), plot=True)
            self.callbacks.on_error(str(e), e.exit_code, ctx)
            return TrainResult(e.exit_code, summary, str(e))
        finally:
            if metrics is not None:
                metrics.close()
            if evals is not None:
                evals.close()
            self._restore_signals()
        if not self.rank0:
            return TrainResult(0, None)
        if ctx.checkpoint_step != total:  # a rerun of a finished run: make sure the end is saved
            self._checkpoint(total, opt)
        self._save_adapter()
        summary = self._finish(t_start, status="succeeded")
        self.callbacks.on_end(summary, ctx)
        return TrainResult(0, summary)

    def _install_signals(self) -> None:
        """SIGTERM (pod deletion, preemption): finish the step, checkpoint, exit 143."""
        self._old_handlers: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Any) -> None:
            self._stop_signal = signum

        for sig in (signal.SIGTERM,):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_signals(self) -> None:
        for sig, old in getattr(self, "_old_handlers", {}).items():
            signal.signal(sig, old)
        self._old_handlers = {}

    def _warmup_for_medians(self) -> int:
        """The steps before the medians: moe.warmupSteps, or (placement auto) the trials too."""
        choice = self._placement_choice()
        if choice and choice.get("decided_at_step") is not None:
            return int(choice["decided_at_step"])
        return self.spec.moe.warmup_steps

    def _placement_choice(self) -> dict[str, Any] | None:
        fn = getattr(self.engine, "placement_choice", None)
        return fn() if callable(fn) else None

    def _maybe_select_hot(self, step: int) -> None:
        info = self.engine.select_hot_experts(step)
        if info:
            self.hot_info = {k: v for k, v in dict(info).items() if k != "per_layer"}
            self.hot_info.setdefault("selected_at_step", step)
            self.ctx.hot = self.hot_info
            self.callbacks.on_hot_selected(dict(info), self.ctx)
        choice = self._placement_choice()
        if choice and choice.get("decided_at_step") == step:
            log.info(placement_line(choice))
            self.ctx.extra["placement"] = choice
            self.callbacks.on_placement(dict(choice), self.ctx)

    def _finish(
        self, t_start: float, *, status: str, error: str | None = None, plot: bool = True
    ) -> dict[str, Any]:
        ctx = self.ctx
        if not self.rank0:
            return {}
        extra: dict[str, Any] = {
            "run_dir": str(ctx.run_dir),
            "resumed_from": ctx.resumed_from,
            "data": getattr(getattr(self.dataset, "stats", None), "to_dict", dict)(),
            "deterministic": _deterministic(),
            "base_fingerprint": getattr(getattr(self.engine, "adapter", None), "fingerprint", None),
        }
        if error:
            extra["error"] = error
        if ctx.extra.get("compile") is not None:  # the graph cache check (commands.run)
            extra["compile"] = ctx.extra["compile"]
        if ctx.extra.get("keep_graph") is not None:  # moe.keepGraph omitted: auto (engine.build)
            extra["keep_graph"] = ctx.extra["keep_graph"]
        if ctx.extra.get("memory") is not None:  # the estimate (commands.run) and the peak
            extra["memory"] = {**ctx.extra["memory"], "peak_rss_bytes": _peak_rss()}
        t = self.spec.training
        extra["schedule"] = {
            "scheduler": t.scheduler,
            "warmup_steps": t.warmup_for(ctx.total_steps),
            "epochs": t.epochs,
            "examples": len(self.dataset),
        }
        if self.evaluator is not None:
            extra["eval"] = self.evaluator.summary()
        summary = build_summary(
            self.records,
            name=ctx.name,
            total_steps=ctx.total_steps,
            warmup_steps=self._warmup_for_medians(),
            hot=self.hot_info,
            status=status,
            wall_s=time.perf_counter() - t_start,
            engine=self.engine,
            extra=extra,
        )
        import json

        rundir.write_text_atomic(
            ctx.run_dir / rundir.SUMMARY,
            json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n",
        )
        if self.plot and plot:
            try:
                plot_step_times(self.records, ctx.run_dir / rundir.PLOT)
            except Exception as e:  # a plot never fails a run
                summary["plot_error"] = str(e)
        return summary
