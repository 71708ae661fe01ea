"""Batch prediction over a data file: the rows of ``npu-lora predict`` and its metrics.

Scoring is :mod:`npu_lora.evaluate` (the held-out evaluation's code; no second scorer): every
row is tokenised as training tokenises it and scored through ``engine.token_nll`` (device
attention and head, host experts). Classification data (NSMC; ``prompt``/``completion`` rows
whose completions form a small label set, see :func:`npu_lora.evaluate.candidate_answers`) is
scored once per candidate answer, the prediction is the most likely candidate (no sampling) and
the metric is accuracy; every file also gets the loss (token mean NLL of the gold answers or the
label tokens) and perplexity.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Scored:
    """One model's results on the file: per-row records and the metrics."""

    rows: list[dict[str, Any]]
    metrics: dict[str, Any]


def score_file(
    engine: Any,
    eval_set: Any,
    batch_size: int,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Scored:
    """Per row: ``loss`` (token mean NLL of the row's gold answer / label tokens), ``tokens``;
    classification also ``prediction``, ``scores`` (candidate → log-likelihood, the summed
    log-probability of its tokens) and ``correct``. Metrics: ``loss``, ``perplexity``,
    ``accuracy`` (classification), ``examples``, ``tokens``, ``seconds``."""
    from npu_lora.evaluate import score_rows, summarize

    t0 = time.perf_counter()
    rs = score_rows(engine, eval_set, batch_size=batch_size, on_batch=progress)
    result = summarize(rs, time.perf_counter() - t0)
    rows: list[dict[str, Any]] = []
    for i in range(len(rs.nll)):
        rec: dict[str, Any] = {"loss": rs.row_loss(i) if rs.tokens[i] else None}
        rec["tokens"] = rs.tokens[i]
        if rs.candidates is not None and rs.cand_nll is not None and rs.pred is not None:
            rec["prediction"] = rs.candidates[rs.pred[i]]
            rec["scores"] = {
                c: round(-v, 6) for c, v in zip(rs.candidates, rs.cand_nll[i], strict=True)
            }
            rec["correct"] = rs.pred[i] == (rs.gold or [])[i]
        rows.append(rec)
    metrics = result.to_dict()
    if rs.candidates is not None:
        metrics["candidates"] = list(rs.candidates)
    return Scored(rows, metrics)


def gold_answers(eval_set: Any) -> list[str | None]:
    """Each row's gold answer: the candidate (classification) or the completion, else None."""
    if eval_set.candidates is not None:
        return [eval_set.candidates[g] for g in eval_set.gold]
    return [e.completion if e.kind == "prompt" else None for e in eval_set.examples]
