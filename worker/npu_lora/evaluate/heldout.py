"""``spec.eval`` in a training run: the held-out rows, when to evaluate, the best so far.

- Data: ``eval.path`` is read through the training data's entry point
  (:func:`npu_lora.data.load_examples` with ``data.path`` replaced: same format, template,
  reader, data volume), so every training format can be evaluated; ``eval.fraction`` holds out a
  seeded share of the training examples (:func:`split_held_out`, also applied by
  :func:`npu_lora.data.prepare_data`, so those rows are never trained on).
  ``eval.maxExamples`` keeps a seeded subset.
- Overlap: ``eval.path`` rows that are also training rows (same kind, text, answer) are counted
  before training; a count above 0 is a warning in the log, ``overlap`` in every ``eval.jsonl``
  line, ``status.eval.overlap`` and the summary (the eval loss then measures memorisation).
- When: after every ``eval.everySteps``-th step and after the last step.
- Results: one line per evaluation in ``eval.jsonl`` (:data:`EVAL_FILE`, keys
  :data:`RECORD_KEYS`); the best (lowest) eval loss so far is kept in the checkpoint's state
  (resume continues it) and its adapter in ``adapter-best/``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from npu_lora.api.timefmt import rfc3339
from npu_lora.data.dataset import split_held_out
from npu_lora.data.readers import DataError, Example
from npu_lora.evaluate.score import EvalSet, build_eval_set, evaluate

if TYPE_CHECKING:
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec

log = logging.getLogger(__name__)

#: One JSON line per evaluation, in the run directory.
EVAL_FILE = "eval.jsonl"
#: The peft adapter with the lowest eval loss so far (written atomically, like ``adapter/``).
BEST_ADAPTER = "adapter-best"
#: Keys of an ``eval.jsonl`` line.
RECORD_KEYS = (
    "step",
    "loss",
    "perplexity",
    "accuracy",
    "examples",
    "tokens",
    "labels",
    "calibrated",
    "accuracy_total",
    "seconds",
    "best",
    "time",
    "overlap",  # only when eval rows are also training rows
)


def _row_key(ex: Example) -> tuple[Any, ...]:
    msgs = tuple(tuple(sorted(m.items())) for m in ex.messages or ())
    return (ex.kind, ex.text, ex.label, ex.completion, msgs)


def count_overlap(train: list[Example], rows: list[Example]) -> int:
    """How many of ``rows`` are also in ``train`` (same kind, text, label/completion, turns)."""
    seen = {_row_key(e) for e in train}
    return sum(1 for e in rows if _row_key(e) in seen)


def load_eval_examples(spec: MoEFinetuneSpec) -> list[Example]:
    """The eval rows of ``spec.eval`` (raises DataError naming the field)."""
    from npu_lora.data import load_examples
    from npu_lora.data.dataset import select_examples

    ev = spec.eval
    if ev is None:
        return []
    if ev.path is not None:
        data = spec.data.model_copy(update={"path": ev.path, "max_examples": None})
        try:
            rows = load_examples(spec.model_copy(update={"data": data}))
        except DataError as e:
            raise DataError(str(e).replace("spec.data.path", "spec.eval.path")) from None
    else:
        _, rows = split_held_out(load_examples(spec), float(ev.fraction or 0), spec.training.seed)
    return select_examples(rows, spec.training.seed, ev.max_examples)


def prepare_eval(spec: MoEFinetuneSpec, tok: Any) -> EvalSet | None:
    """The tokenised eval set of ``spec.eval`` (None without it); validates before any write."""
    if spec.eval is None:
        return None
    rows = load_eval_examples(spec)
    if not rows:
        raise DataError("spec.eval: no evaluation examples")
    overlap = 0
    if spec.eval.path is not None:
        from npu_lora.data import load_examples

        overlap = count_overlap(load_examples(spec), rows)
        if overlap:
            log.warning(
                "spec.eval.path: %d of the %d eval rows are also training rows (spec.data.path): "
                "the eval loss measures memorisation there (status.eval.overlap)",
                overlap,
                len(rows),
            )
    es = build_eval_set(
        rows,
        tok,
        spec.training.seq_len,
        template=spec.data.template,
        calibrate=spec.eval.calibrate,
    )
    es.overlap = overlap
    return es


class HeldOutEval:
    """Evaluates a training engine on one :class:`EvalSet` and tracks the best eval loss."""

    def __init__(self, spec: MoEFinetuneSpec, evalset: EvalSet) -> None:
        ev = spec.eval
        assert ev is not None
        self.evalset = evalset
        self.every = ev.every_steps
        self.batch_size = ev.batch_size or spec.training.batch_size
        self.best: dict[str, Any] | None = None  # {"step", "loss"}
        self.last: dict[str, Any] | None = None
        self.count = 0
        self.seconds = 0.0
        self.overlap = int(getattr(evalset, "overlap", 0) or 0)

    def due(self, step: int, total: int) -> bool:
        return step == total or (self.every is not None and step % self.every == 0)

    def run(self, engine: Any, step: int) -> dict[str, Any]:
        """Evaluate now (after ``step``); the ``eval.jsonl`` record (``best``: a new best)."""
        res = evaluate(engine, self.evalset, batch_size=self.batch_size)
        is_best = self.best is None or res.loss < float(self.best["loss"])
        if is_best:
            self.best = {"step": step, "loss": res.loss}
        self.count += 1
        self.seconds += res.seconds
        rec = {"step": step, **res.to_dict(), "best": is_best, "time": _iso(time.time())}
        if self.overlap:
            rec["overlap"] = self.overlap
        self.last = rec
        return rec

    # --- resume -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"best": self.best, "count": self.count, "seconds": self.seconds, "last": self.last}

    def load_state(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        self.best = state.get("best")
        self.count = int(state.get("count") or 0)
        self.seconds = float(state.get("seconds") or 0.0)
        self.last = state.get("last")

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``eval``."""
        return {
            "examples": len(self.evalset),
            "labels": len(self.evalset.candidates or []),
            "evaluations": self.count,
            "seconds": self.seconds,
            "last": self.last,
            "best": self.best,
            **({"overlap": self.overlap} if self.overlap else {}),
        }


def _iso(t: float) -> str:
    return rfc3339(t, millis=True)
