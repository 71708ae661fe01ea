"""Callbacks of the training loop.

The operator's status reporter (``npu_lora.report.status.StatusReporter``) and the CLI's progress
bar implement :class:`TrainCallback`. A callback that raises is logged and otherwise ignored:
reporting never stops training.

Order of calls in a run::

    on_start(ctx)
    for each step: on_step(record, ctx)       # after the record is in metrics.jsonl
                   on_hot_selected(info, ctx) # after step == moe.warmupSteps (placement hot/auto),
                                              # and after each refresh that changed the set
                   on_placement(info, ctx)    # placement auto: when it chose (the two medians)
                   on_eval(record, ctx)       # spec.eval: after an evaluation (eval.jsonl line)
                   on_checkpoint(step, path, ctx)
    on_end(summary, ctx)                      # success (summary.json written)
    on_error(message, exit_code, ctx)         # instead of on_end on failure

``record`` is the metrics.jsonl record (its columns: :mod:`npu_lora.api.record`); ``info`` is ``{fraction, experts, selected_at_step, per_layer}``;
``summary`` is summary.json's content.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from npu_lora.api.v1alpha1 import MoEFinetune, MoEFinetuneSpec

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """What a callback may want to know about the run (read-only by convention)."""

    manifest: MoEFinetune
    run_dir: Path
    total_steps: int
    start_step: int = 1  # first step this process runs (> 1 after a resume)
    resumed_from: int | None = None  # checkpoint step resumed from
    checkpoint_step: int | None = None  # last checkpoint written or loaded
    hot: dict[str, Any] | None = None  # hot-set info once selected
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> MoEFinetuneSpec:
        return self.manifest.spec

    @property
    def name(self) -> str | None:
        return self.manifest.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.manifest.metadata.namespace


def placement_line(info: dict[str, Any]) -> str:
    """The log line of an auto placement choice."""

    def f(x: Any) -> str:
        return "-" if x is None else f"{float(x):.4f} s"

    return (
        f"placement auto: host-only median {f(info.get('host_only_median_s'))}, hot median "
        f"{f(info.get('hot_median_s'))} (forward+backward per step) -> {info.get('chosen')} "
        f"from step {int(info.get('decided_at_step') or 0) + 1}"
    )


class TrainCallback:
    """Base class: override what you need; every method is a no-op here."""

    def on_start(self, ctx: RunContext) -> None:
        pass

    def on_step(self, record: dict[str, Any], ctx: RunContext) -> None:
        pass

    def on_hot_selected(self, info: dict[str, Any], ctx: RunContext) -> None:
        pass

    def on_placement(self, info: dict[str, Any], ctx: RunContext) -> None:
        pass

    def on_eval(self, record: dict[str, Any], ctx: RunContext) -> None:
        pass

    def on_checkpoint(self, step: int, path: str, ctx: RunContext) -> None:
        pass

    def on_end(self, summary: dict[str, Any], ctx: RunContext) -> None:
        pass

    def on_error(self, message: str, exit_code: int, ctx: RunContext) -> None:
        pass


class CallbackList(TrainCallback):
    """Dispatch to several callbacks; a failing callback is logged, never raised."""

    def __init__(self, callbacks: list[TrainCallback] | None = None) -> None:
        self.callbacks = list(callbacks or [])

    def append(self, cb: TrainCallback) -> None:
        self.callbacks.append(cb)

    def _call(self, method: str, *args: Any) -> None:
        for cb in self.callbacks:
            try:
                getattr(cb, method)(*args)
            except Exception as e:  # reporting must never stop training
                log.warning("callback %s.%s failed: %s", type(cb).__name__, method, e)

    def on_start(self, ctx: RunContext) -> None:
        self._call("on_start", ctx)

    def on_step(self, record: dict[str, Any], ctx: RunContext) -> None:
        self._call("on_step", record, ctx)

    def on_hot_selected(self, info: dict[str, Any], ctx: RunContext) -> None:
        self._call("on_hot_selected", info, ctx)

    def on_placement(self, info: dict[str, Any], ctx: RunContext) -> None:
        self._call("on_placement", info, ctx)

    def on_eval(self, record: dict[str, Any], ctx: RunContext) -> None:
        self._call("on_eval", record, ctx)

    def on_checkpoint(self, step: int, path: str, ctx: RunContext) -> None:
        self._call("on_checkpoint", step, path, ctx)

    def on_end(self, summary: dict[str, Any], ctx: RunContext) -> None:
        self._call("on_end", summary, ctx)

    def on_error(self, message: str, exit_code: int, ctx: RunContext) -> None:
        self._call("on_error", message, exit_code, ctx)


def terminal_columns(stream: Any = None) -> int:
    """The width of the terminal ``stream`` (default stderr) writes to; 0 when it is not a
    terminal or reports no width (a pod's log, CI, ``script`` without a size)."""
    stream = stream if stream is not None else sys.stderr
    try:
        if not stream.isatty():
            return 0
        return int(os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, OSError, ValueError):
        return 0


class _StepLines:
    """The progress without a terminal width: a plain line every ``every`` steps (and the
    last), which tqdm cannot draw there (it printed nothing in CI logs and under ``script``)."""

    def __init__(self, total: int | None, initial: int, desc: str, disable: bool) -> None:
        self.total, self.n, self.desc, self.disable = total, initial, desc, disable
        self.every = lines_every(total)
        self.postfix: dict[str, Any] = {}
        self.t0 = time.monotonic()

    def set_postfix(self, refresh: bool = False, **kw: Any) -> None:
        self.postfix = kw

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.disable:
            return
        if self.n % self.every == 0 or (self.total is not None and self.n >= self.total):
            of = f"/{self.total}" if self.total else ""
            extra = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            elapsed = time.monotonic() - self.t0
            print(f"{self.desc}: step {self.n}{of} {extra} ({elapsed:.0f} s)", file=sys.stderr)

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file or sys.stderr)

    def close(self) -> None:
        pass


def lines_every(total: int | None) -> int:
    """Steps between two progress lines without a terminal: about 20 lines a run, at most one
    every 100 steps apart (1 for short runs)."""
    if not total:
        return 10
    return max(1, min(100, total // 20))


class ProgressBar(TrainCallback):
    """tqdm bar on stderr with the live loss and seconds per step; without a terminal width
    (a pod's log, CI, ``script``) a line every :func:`lines_every` steps instead."""

    def __init__(self, *, disable: bool = False) -> None:
        self.disable = disable
        self.bar: Any = None

    def on_start(self, ctx: RunContext) -> None:
        from tqdm import tqdm

        desc = ctx.name or "train"
        if terminal_columns() <= 0:
            self.bar = _StepLines(ctx.total_steps, ctx.start_step - 1, desc, self.disable)
            return
        self.bar = tqdm(
            total=ctx.total_steps,
            initial=ctx.start_step - 1,
            desc=desc,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.1,
            disable=self.disable,
        )

    def on_step(self, record: dict[str, Any], ctx: RunContext) -> None:
        if self.bar is None:
            return
        loss = record.get("loss")
        self.bar.set_postfix(
            loss="nan" if loss is None else f"{loss:.4f}",
            s_step=f"{record.get('step_s', 0.0):.3f}",
            hot=record.get("hot_experts", 0),
            refresh=False,
        )
        self.bar.update(1)

    def on_hot_selected(self, info: dict[str, Any], ctx: RunContext) -> None:
        if self.bar is not None and not self.disable:
            if info.get("refreshed_at_step") is not None:
                text = (
                    f"hot experts re-chosen after step {info['refreshed_at_step']}: "
                    f"{info.get('experts')} experts"
                )
            else:
                text = (
                    f"hot experts selected after step {info.get('selected_at_step')}: "
                    f"{info.get('experts')} experts ({info.get('fraction')} of each layer)"
                )
            self.bar.write(text, file=sys.stderr)

    def on_placement(self, info: dict[str, Any], ctx: RunContext) -> None:
        if self.bar is not None and not self.disable:
            self.bar.write(placement_line(info), file=sys.stderr)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_end(self, summary: dict[str, Any], ctx: RunContext) -> None:
        self._close()

    def on_error(self, message: str, exit_code: int, ctx: RunContext) -> None:
        self._close()
