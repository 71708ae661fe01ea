"""Batch prediction over a data file in the run's formats: rows, candidates, scores, metrics.

Task per file (decided from its rows, :func:`plan_rows`):

- ``classify``: NSMC rows (candidates: the run's answer words) and ``prompt``/``completion``
  rows whose completions come from a small label set (at most ``max_labels`` distinct values,
  each used by at least two rows on average). Every candidate answer is scored by its
  log-likelihood after the prompt (the sum over its tokens, end-of-sequence included, as
  trained); the prediction is the best candidate, never sampled. Metric: accuracy, plus the
  loss of the gold answer.
- ``loss``: any other rows (``text``, open-ended ``prompt``/``completion``): the mean
  cross-entropy of the label tokens; metric: loss and perplexity (token-weighted over the
  file). Open-ended prompts also get a greedy ``prediction`` (``max_new_tokens``, 0: none).

Each row is encoded exactly as training encodes it (``encode_example``: template, ``seqLen``,
truncation), so a row's loss is the training loss on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from npu_lora.data import ANSWER_WORDS, Example, encode_example

MAX_LABELS = 16


@dataclass
class Row:
    """One data row and what is scored for it."""

    index: int
    example: Example
    gold: str | None  # the gold answer (classification: a candidate) or completion
    candidates: list[str] = field(default_factory=list)  # empty: loss only
    seqs: list[tuple[list[int], list[int], list[int]]] = field(default_factory=list)


@dataclass
class Plan:
    task: str  # "classify" | "loss"
    rows: list[Row]
    candidates: list[str]  # the label set (classify)


def label_set(examples: list[Example], max_labels: int = MAX_LABELS) -> list[str] | None:
    """The completions of prompt/completion rows when they form a small label set, else None."""
    if not examples or any(e.kind != "prompt" for e in examples):
        return None
    labels = sorted({e.completion or "" for e in examples})
    if 2 <= len(labels) <= max_labels and len(labels) * 2 <= len(examples):
        return labels
    return None


def plan_rows(
    examples: list[Example],
    tok: Any,
    seq_len: int,
    *,
    template: str | None = None,
    max_labels: int = MAX_LABELS,
) -> Plan:
    """Encode the rows (every candidate of a classification row) as training does."""
    rows: list[Row] = []
    if all(e.kind == "classify" for e in examples):
        words = [ANSWER_WORDS[k] for k in sorted(ANSWER_WORDS)]
        for i, e in enumerate(examples):
            seqs = [
                encode_example(Example("classify", e.text, label=k, source=e.source), tok,
                               seq_len, template=template)
                for k in sorted(ANSWER_WORDS)
            ]
            gold = ANSWER_WORDS[e.label] if e.label is not None else None
            rows.append(Row(i, e, gold, list(words), seqs))
        return Plan("classify", rows, words)
    labels = label_set(examples, max_labels)
    if labels is not None:
        for i, e in enumerate(examples):
            seqs = [
                encode_example(Example("prompt", e.text, completion=c, source=e.source), tok,
                               seq_len, template=template)
                for c in labels
            ]
            rows.append(Row(i, e, e.completion, list(labels), seqs))
        return Plan("classify", rows, labels)
    for i, e in enumerate(examples):
        seq = encode_example(e, tok, seq_len, template=template)
        gold = e.completion if e.kind == "prompt" else None
        rows.append(Row(i, e, gold, [], [seq]))
    return Plan("loss", rows, [])


def _batches(
    items: list[tuple[int, int, tuple[list[int], list[int], list[int]]]], batch_size: int
) -> Iterator[tuple[list[tuple[int, int]], dict[str, torch.Tensor]]]:
    """Fixed-size batches (the last one padded with copies of its first sequence: static shapes
    for a compiling device); yields the real ``(row, candidate)`` keys and the tensors."""
    for start in range(0, len(items), batch_size):
        part = items[start : start + batch_size]
        keys = [(r, c) for r, c, _ in part]
        seqs = [s for _, _, s in part]
        seqs += [seqs[0]] * (batch_size - len(seqs))
        yield (
            keys,
            {
                "input_ids": torch.tensor([s[0] for s in seqs], dtype=torch.long),
                "attention_mask": torch.tensor([s[1] for s in seqs], dtype=torch.long),
                "labels": torch.tensor([s[2] for s in seqs], dtype=torch.long),
            },
        )


def score_plan(
    engine: Any,
    plan: Plan,
    batch_size: int,
    *,
    progress: Callable[[int], None] | None = None,
) -> dict[tuple[int, int], tuple[float, int]]:
    """``(row, candidate) -> (sum log-likelihood, tokens)`` through the engine's forward."""
    from npu_lora.inference.forward import row_scores

    items = [(r.index, c, s) for r in plan.rows for c, s in enumerate(r.seqs)]
    out: dict[tuple[int, int], tuple[float, int]] = {}
    for keys, batch in _batches(items, batch_size):
        sums, counts = row_scores(engine, batch)
        for k, s, n in zip(keys, sums, counts, strict=False):
            out[k] = (float(s), int(n))
        if progress is not None:
            progress(len(keys))
    return out


def row_results(plan: Plan, scores: dict[tuple[int, int], tuple[float, int]]) -> list[dict]:
    """Per row: ``prediction``, ``loss`` (mean CE of the gold answer's tokens), ``tokens``,
    and for classification ``scores`` (candidate → log-likelihood) and ``correct``."""
    out = []
    for r in plan.rows:
        if plan.task == "classify":
            cand = {c: scores[(r.index, j)] for j, c in enumerate(r.candidates)}
            pred = max(r.candidates, key=lambda c: cand[c][0])
            g = cand.get(r.gold) if r.gold is not None else None
            out.append(
                {
                    "prediction": pred,
                    "loss": -g[0] / max(g[1], 1) if g else None,
                    "tokens": g[1] if g else 0,
                    "scores": {c: round(v[0], 6) for c, v in cand.items()},
                    "correct": pred == r.gold,
                }
            )
        else:
            s, n = scores[(r.index, 0)]
            out.append({"loss": -s / max(n, 1) if n else None, "tokens": n})
    return out


def metrics(plan: Plan, results: list[dict]) -> dict[str, Any]:
    """``rows``, ``loss`` (token-weighted mean CE of the gold answers), ``perplexity``, and
    ``accuracy`` for classification."""
    tokens = sum(r["tokens"] for r in results if r.get("loss") is not None)
    nll = sum(r["loss"] * r["tokens"] for r in results if r.get("loss") is not None)
    loss = nll / tokens if tokens else None
    m: dict[str, Any] = {
        "rows": len(results),
        "task": plan.task,
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)) if loss is not None else None,
    }
    if plan.task == "classify":
        m["accuracy"] = sum(bool(r["correct"]) for r in results) / max(len(results), 1)
        m["labels"] = list(plan.candidates)
    return m
