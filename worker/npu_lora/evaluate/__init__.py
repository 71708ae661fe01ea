"""Held-out evaluation and scoring (no sampling): see :mod:`npu_lora.evaluate.score`.

Public API (stable; ``npu-lora predict`` builds on it)::

    from npu_lora.evaluate import build_eval_set, evaluate, score_rows, token_nll
"""

from __future__ import annotations

from npu_lora.evaluate.score import (
    MAX_LABELS,
    EvalResult,
    EvalSet,
    RowScores,
    build_eval_set,
    candidate_answers,
    evaluate,
    perplexity,
    score_rows,
    sequence_nll,
    summarize,
    token_nll,
)

__all__ = [
    "MAX_LABELS",
    "EvalResult",
    "EvalSet",
    "RowScores",
    "build_eval_set",
    "candidate_answers",
    "evaluate",
    "perplexity",
    "score_rows",
    "sequence_nll",
    "summarize",
    "token_nll",
]
