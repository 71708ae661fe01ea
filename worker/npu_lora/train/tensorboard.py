"""TensorBoard event files in the run directory (``tensorboard --logdir runs/``).

:class:`TensorBoardLogger` is a :class:`~npu_lora.train.callbacks.TrainCallback`: every step
record becomes scalars at ``global_step = step``. The tags are derived from the step record's
definition (:mod:`npu_lora.api.record`), so a new numeric column shows up without a change here:

==========================  ==================================================================
tag                         from
==========================  ==================================================================
``train/<column>``          the unitless float columns: ``loss`` (skipped when not finite),
                            ``lr``, ``grad_norm``
``throughput/tokens_per_s`` ``tokens / step_s``
``time/<column>``           every other column with unit ``s`` (``step_s``, ``attn_head_s``, ...)
``dist/<column>``           the data-parallel columns (``allreduce_s``, ``skew_s``, ...; only
                            in a data-parallel run's records; not the per-rank lists)
``traffic/<column>``        every other column with unit ``bytes`` (``expert_bytes``, ...)
``moe/<column>``            the other numeric columns (``hot_experts``,
                            ``device_calls_per_layer``, ``tokens``, ``micro_batches``)
==========================  ==================================================================

The event files are written next to ``metrics.jsonl``; a resumed run opens a new file with
``purge_step`` = its first step, so TensorBoard drops the previous file's events of the steps run
again. The writer is ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard`` package of
the worker extra); without it the callback logs a warning once and does nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from npu_lora.api import record as step_record
from npu_lora.train.callbacks import RunContext, TrainCallback

log = logging.getLogger(__name__)

__all__ = ["TAGS", "TensorBoardLogger", "scalars", "tag_of"]

_SKIP = ("step",)
_BYTES_UNITS = ("bytes", "B")


def tag_of(column: step_record.Column) -> str | None:
    """The scalar tag of a record column (``None``: not a scalar)."""
    if column.kind not in ("int", "float") or column.name in _SKIP:
        return None
    if column.kind == "float" and column.unit == "":  # loss, lr, grad_norm
        return f"train/{column.name}"
    if column.data_parallel:
        return f"dist/{column.name}"
    if column.unit == "s":
        return f"time/{column.name}"
    if column.unit in _BYTES_UNITS:
        return f"traffic/{column.name}"
    return f"moe/{column.name}"


TOKENS_PER_S = "throughput/tokens_per_s"
#: Every tag a full record produces, in record order (then the derived throughput).
TAGS: tuple[str, ...] = (
    *(t for c in step_record.RECORD if (t := tag_of(c)) is not None),
    TOKENS_PER_S,
)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of one step record (non-finite and missing values left out)."""
    out: dict[str, float] = {}
    for c in step_record.RECORD:
        tag = tag_of(c)
        v = record.get(c.name)
        if tag is None or v is None or isinstance(v, bool):
            continue
        v = float(v)
        if math.isfinite(v):
            out[tag] = v
    step_s, tokens = record.get("step_s"), record.get("tokens")
    if step_s and tokens:
        out[TOKENS_PER_S] = float(tokens) / float(step_s)
    return out


class TensorBoardLogger(TrainCallback):
    """Writes each step's scalars to TensorBoard event files in the run directory."""

    def __init__(self, flush_secs: int = 10) -> None:
        self.flush_secs = flush_secs
        self.writer: Any = None

    def on_start(self, ctx: RunContext) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # the worker extra ships tensorboard; a bare install may not
            log.warning("TensorBoard event files disabled (pip install tensorboard): %s", e)
            return
        purge = ctx.start_step if ctx.start_step > 1 else None
        self.writer = SummaryWriter(
            log_dir=str(ctx.run_dir), purge_step=purge, flush_secs=self.flush_secs
        )
        if purge is None:
            config = ctx.run_dir / "config.yaml"
            if config.is_file():
                text = config.read_text(encoding="utf-8")
                self.writer.add_text("config", "```yaml\n" + text + "\n```", 0)

    def on_step(self, record: dict[str, Any], ctx: RunContext) -> None:
        if self.writer is None:
            return
        step = int(record["step"])
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, step)

    def on_eval(self, record: dict[str, Any], ctx: RunContext) -> None:
        """``eval/loss``, ``eval/perplexity``, ``eval/accuracy`` (classification), ``eval/seconds``
        at the evaluation's step (spec.eval)."""
        if self.writer is None:
            return
        step = int(record["step"])
        for key in ("loss", "perplexity", "accuracy", "seconds"):
            v = record.get(key)
            if isinstance(v, int | float) and math.isfinite(v):
                self.writer.add_scalar(f"eval/{key}", float(v), step)

    def on_hot_selected(self, info: dict[str, Any], ctx: RunContext) -> None:
        if self.writer is None:
            return
        step = int(info.get("selected_at_step") or 0)
        self.writer.add_scalar("moe/hot_set_size", float(info.get("experts") or 0), step)

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def on_end(self, summary: dict[str, Any], ctx: RunContext) -> None:
        self._close()

    def on_error(self, message: str, exit_code: int, ctx: RunContext) -> None:
        self._close()
