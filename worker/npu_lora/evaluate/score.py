"""Scoring without sampling: per-token NLL, per-row loss, candidate log-likelihood accuracy.

Everything goes through one function, :func:`token_nll` (``engine.token_nll(batch)`` of
:class:`npu_lora.engine.HybridEngine`: device attention, host experts; or a plain Hugging Face
causal LM / an object with ``.model``, for stand-ins and the stock comparison).

- **loss**: the token mean of ``-log p(label token)`` over every label token of the rows (the
  training loss's definition, over the whole set instead of one batch); ``perplexity =
  exp(loss)``.
- **accuracy** (classification data only, see :func:`candidate_answers`): each row is scored
  once per candidate answer (the row's prompt + that answer + eos, tokenised exactly as
  training does); the prediction is the candidate with the highest total log-likelihood
  (argmax; ties: the first), compared with the gold answer. With candidates, the loss is the
  gold candidate's rows' (the same sequences as the plain rows).
- **calibrated accuracy** (``calibrate=True``): the same argmax over ``LL(answer | prompt) -
  LL(answer | content-free prompt)``, the content-free prompt being the row's prompt with an
  empty document (contextual calibration, Zhao et al. 2021, "Calibrate before use"). It removes
  the bias of the answers' lengths in tokens and of the class prior, which dominates the total
  log-likelihood of a weak model (e.g. NSMC's " 긍정" is 3 Qwen3 tokens, " 부정" 2). Costs ``C``
  extra rows per evaluation.

Batches have a fixed size (static device shapes): the last one is padded with rows that carry
no label. Usage::

    es = build_eval_set(examples, tok, seq_len, template=spec.data.template)
    res = evaluate(engine, es, batch_size=8)       # EvalResult: loss, perplexity, accuracy, ...
    rows = score_rows(engine, es, batch_size=8)    # RowScores: per-row nll/tokens/pred/gold
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from npu_lora.data.dataset import ANSWER_WORDS, IGNORE_INDEX
from npu_lora.data.readers import Example

if TYPE_CHECKING:
    import torch

#: ``prompt``/``completion`` rows count as classification when their completions come from at
#: most this many distinct strings (and some completion repeats).
MAX_LABELS = 8


# ---------------------------------------------------------------------------------------------
# the one forward


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """``no_grad``, ``model.eval()`` and the torch RNG state restored (training untouched)."""
    import torch

    rng = torch.get_rng_state()
    was = bool(getattr(model, "training", False))
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_rng_state(rng)
        if was:
            model.train()


def token_nll(engine: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, S] float32``: ``-log p(labels[b, t] | tokens < t)`` where ``labels[b, t] != -100``,
    0 elsewhere (HF label convention, ``labels == input_ids`` at scored positions).

    ``engine``: anything with ``token_nll(batch)`` (the hybrid engine), else a Hugging Face causal
    LM (or an object whose ``.model`` is one), run in eval mode under ``no_grad``."""
    import torch
    import torch.nn.functional as F

    fn = getattr(engine, "token_nll", None)
    if callable(fn):
        return fn(batch)
    model = getattr(engine, "model", engine)
    labels = batch["labels"]
    tgt = labels[:, 1:]
    valid = tgt != IGNORE_INDEX
    # logits only at the positions that predict a label (transformers' ``logits_to_keep``,
    # 1-D: the same positions in every row); the vocabulary projection of the other positions
    # is most of the cost with a large vocabulary. Models without it: every position.
    keep = valid.any(0).nonzero()[:, 0]
    kw = {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask")}
    with _eval_mode(model):
        logits = None
        with contextlib.suppress(TypeError):  # a model without logits_to_keep
            logits = model(**kw, logits_to_keep=keep.to(batch["input_ids"].device)).logits
        if logits is None or logits.shape[1] != keep.numel():
            logits = model(**kw).logits[:, keep]
        B, K, V = logits.shape
        ce = F.cross_entropy(
            logits.float().reshape(B * K, V),
            tgt[:, keep].clamp(min=0).reshape(B * K).to(logits.device),
            reduction="none",
        ).view(B, K)
        out = torch.zeros(labels.shape, dtype=torch.float32)
        out[:, 1 + keep] = ce.cpu() * valid[:, keep]
    return out


# ---------------------------------------------------------------------------------------------
# the eval set


@dataclass
class EvalSet:
    """Tokenised evaluation rows (``[N, S]`` tensors, the training tokenisation).

    Classification (``candidates`` set, ``C`` answers): ``cand_*`` are ``[N * C, S]``, row ``n``'s
    candidate ``c`` at ``n * C + c``; ``gold[n]`` the index of row ``n``'s answer. Then the plain
    rows are not stored (``input_ids`` etc. None): the gold candidates are those rows."""

    examples: list[Example]
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    candidates: list[str] | None = None
    cand_input_ids: torch.Tensor | None = None
    cand_attention_mask: torch.Tensor | None = None
    cand_labels: torch.Tensor | None = None
    gold: list[int] = field(default_factory=list)
    #: rows that are also training rows (``npu_lora.evaluate.heldout.count_overlap``)
    overlap: int = 0
    #: calibration (``calibrate=True``): the ``C`` content-free rows, one per candidate
    null_input_ids: torch.Tensor | None = None
    null_attention_mask: torch.Tensor | None = None
    null_labels: torch.Tensor | None = None

    @property
    def calibrated(self) -> bool:
        return self.null_input_ids is not None

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def classification(self) -> bool:
        return self.candidates is not None


def candidate_answers(
    examples: list[Example], max_labels: int = MAX_LABELS
) -> tuple[list[str], list[int], list[Example]] | None:
    """The label set of classification data, or None.

    Returns ``(answers, gold, candidate_examples)``: the candidate answers (display strings),
    each row's gold index, and the ``N * C`` examples to score (row-major). NSMC rows
    (``classify``): the answers are the label words (:data:`ANSWER_WORDS`, label order).
    ``prompt`` rows: when their distinct completions number 2..``max_labels`` and fewer than
    the rows (sorted); anything else (``text`` rows, open-ended completions): None."""
    if not examples:
        return None
    kinds = {e.kind for e in examples}
    if kinds == {"classify"}:
        labels = sorted(ANSWER_WORDS)
        answers = [ANSWER_WORDS[k] for k in labels]
        gold = [labels.index(int(e.label)) for e in examples]  # type: ignore[arg-type]
        cands = [
            Example("classify", e.text, label=k, source=e.source) for e in examples for k in labels
        ]
        return answers, gold, cands
    if kinds == {"prompt"}:
        distinct = sorted({e.completion or "" for e in examples})
        if not 2 <= len(distinct) <= max_labels or len(distinct) >= len(examples):
            return None
        gold = [distinct.index(e.completion or "") for e in examples]
        cands = [
            Example("prompt", e.text, completion=c, source=e.source)
            for e in examples
            for c in distinct
        ]
        return distinct, gold, cands
    return None


def _tokenize(examples: list[Example], tok: Any, seq_len: int, template: str | None) -> Any:
    """The training tokenisation (``TokenizedDataset``), so every data format scores the same."""
    from npu_lora.data.dataset import TokenizedDataset

    return TokenizedDataset(examples, tok, seq_len, template=template)


def build_eval_set(
    examples: list[Example],
    tok: Any,
    seq_len: int,
    *,
    template: str | None = None,
    max_labels: int = MAX_LABELS,
    classify: bool = True,
    calibrate: bool = False,
) -> EvalSet:
    """Tokenise ``examples`` for :func:`evaluate` (``classify=False``: loss only;
    ``calibrate``: classification predictions from calibrated log-likelihoods)."""
    cand = candidate_answers(examples, max_labels) if classify else None
    if cand is None:
        ds = _tokenize(examples, tok, seq_len, template)
        return EvalSet(examples, ds.input_ids, ds.attention_mask, ds.labels)
    answers, gold, cand_examples = cand
    ds = _tokenize(cand_examples, tok, seq_len, template)
    es = EvalSet(
        examples,
        candidates=answers,
        cand_input_ids=ds.input_ids,
        cand_attention_mask=ds.attention_mask,
        cand_labels=ds.labels,
        gold=gold,
    )
    if calibrate:
        C = len(answers)
        null = _tokenize(
            [Example(e.kind, "", e.label, e.completion, "content-free") for e in cand_examples[:C]],
            tok,
            seq_len,
            template,
        )
        es.null_input_ids, es.null_attention_mask = null.input_ids, null.attention_mask
        es.null_labels = null.labels
    return es


# ---------------------------------------------------------------------------------------------
# scoring


def sequence_nll(
    engine: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    *,
    batch_size: int = 8,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll_sum [R], tokens [R])`` of ``R`` rows: the summed NLL of each row's label tokens and
    their count, in fixed-size batches (the last padded with label-free rows).
    ``on_batch(done_rows, total_rows)`` after each batch (progress bars)."""
    import torch

    R = int(input_ids.shape[0])
    sums = torch.zeros(R, dtype=torch.float64)
    counts = torch.zeros(R, dtype=torch.int64)
    for start in range(0, R, batch_size):
        stop = min(start + batch_size, R)
        idx = list(range(start, stop))
        pad = batch_size - len(idx)
        b_ids, b_am, b_lab = input_ids[idx], attention_mask[idx], labels[idx]
        if pad:
            b_ids = torch.cat([b_ids, b_ids[:1].expand(pad, -1)])
            b_am = torch.cat([b_am, b_am[:1].expand(pad, -1)])
            b_lab = torch.cat([b_lab, torch.full((pad, b_lab.shape[1]), IGNORE_INDEX)])
        nll = token_nll(engine, {"input_ids": b_ids, "attention_mask": b_am, "labels": b_lab})
        n = stop - start
        sums[start:stop] = nll[:n].double().sum(1)
        counts[start:stop] = (b_lab[:n, 1:] != IGNORE_INDEX).sum(1)
        if on_batch is not None:
            on_batch(stop, R)
    return sums, counts


@dataclass
class RowScores:
    """Per-row results: ``nll`` (summed NLL of the row's label tokens), ``tokens`` (their
    count); classification: ``cand_nll [N][C]`` (each candidate's summed NLL), ``pred`` and
    ``gold`` (indices into ``candidates``); calibrated: ``null_nll [C]`` (each candidate's
    summed NLL after the content-free prompt) and ``pred`` from ``cand_nll - null_nll``,
    ``pred_total`` from ``cand_nll`` alone (without calibration ``pred_total == pred``)."""

    nll: list[float]
    tokens: list[int]
    candidates: list[str] | None = None
    cand_nll: list[list[float]] | None = None
    pred: list[int] | None = None
    gold: list[int] | None = None
    null_nll: list[float] | None = None
    pred_total: list[int] | None = None

    def row_loss(self, i: int) -> float:
        """Token-mean NLL of row ``i``."""
        return self.nll[i] / max(self.tokens[i], 1)


def score_rows(
    engine: Any,
    es: EvalSet,
    *,
    batch_size: int = 8,
    on_batch: Callable[[int, int], None] | None = None,
) -> RowScores:
    """Score every row of ``es`` (see the module doc)."""
    if not es.classification:
        assert es.input_ids is not None and es.attention_mask is not None
        assert es.labels is not None
        s, c = sequence_nll(
            engine,
            es.input_ids,
            es.attention_mask,
            es.labels,
            batch_size=batch_size,
            on_batch=on_batch,
        )
        return RowScores(s.tolist(), c.tolist())
    assert es.cand_input_ids is not None and es.cand_attention_mask is not None
    assert es.cand_labels is not None and es.candidates is not None
    C = len(es.candidates)
    s, c = sequence_nll(
        engine,
        es.cand_input_ids,
        es.cand_attention_mask,
        es.cand_labels,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    s2, c2 = s.view(-1, C), c.view(-1, C)
    pred_total = [int(i) for i in s2.argmin(1).tolist()]  # lowest NLL = highest likelihood
    pred, null_nll = pred_total, None
    if es.calibrated:
        assert es.null_attention_mask is not None and es.null_labels is not None
        null, _ = sequence_nll(
            engine,
            es.null_input_ids,
            es.null_attention_mask,
            es.null_labels,
            batch_size=batch_size,
        )
        null_nll = null.tolist()
        pred = [int(i) for i in (s2 - null[None, :]).argmin(1).tolist()]
    g = list(es.gold)
    rows = range(len(g))
    return RowScores(
        nll=[float(s2[n, g[n]]) for n in rows],
        tokens=[int(c2[n, g[n]]) for n in rows],
        candidates=list(es.candidates),
        cand_nll=s2.tolist(),
        pred=pred,
        gold=g,
        null_nll=null_nll,
        pred_total=pred_total,
    )


@dataclass
class EvalResult:
    """One evaluation: ``loss`` (token mean), ``perplexity`` (``exp(loss)``; None on overflow),
    ``accuracy`` (classification only, else None; calibrated when the set is),
    ``examples``, ``tokens`` (label tokens scored), ``seconds`` (wall), ``labels`` (number of
    candidate answers, 0 without), ``calibrated`` (``accuracy`` is the calibrated one; then
    ``accuracy_total`` is the uncalibrated total log-likelihood's)."""

    loss: float
    perplexity: float | None
    accuracy: float | None
    examples: int
    tokens: int
    seconds: float
    labels: int = 0
    calibrated: bool = False
    accuracy_total: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "accuracy": self.accuracy,
            "examples": self.examples,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "labels": self.labels,
            "calibrated": self.calibrated,
            "accuracy_total": self.accuracy_total,
        }


def perplexity(loss: float) -> float | None:
    try:
        p = math.exp(loss)
    except OverflowError:
        return None
    return p if math.isfinite(p) else None


def summarize(rows: RowScores, seconds: float = 0.0) -> EvalResult:
    """The aggregate of :func:`score_rows`'s output."""
    tokens = int(sum(rows.tokens))
    loss = float(sum(rows.nll)) / max(tokens, 1)

    def share(pred: list[int] | None) -> float | None:
        if pred is None or not rows.gold:
            return None
        return sum(int(p == g) for p, g in zip(pred, rows.gold, strict=True)) / len(rows.gold)

    acc = share(rows.pred)
    return EvalResult(
        loss=loss,
        perplexity=perplexity(loss),
        accuracy=acc,
        examples=len(rows.nll),
        tokens=tokens,
        seconds=seconds,
        labels=len(rows.candidates or []),
        calibrated=rows.null_nll is not None,
        accuracy_total=share(rows.pred_total),
    )


def evaluate(
    engine: Any,
    es: EvalSet,
    *,
    batch_size: int = 8,
    on_batch: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Loss, perplexity and (classification) accuracy of ``engine`` on ``es``."""
    t0 = time.perf_counter()
    rows = score_rows(engine, es, batch_size=batch_size, on_batch=on_batch)
    return summarize(rows, time.perf_counter() - t0)
