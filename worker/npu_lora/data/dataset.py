"""Tokenisation to fixed ``seqLen`` and the deterministic, resumable sample order.

Layout of one sequence (right-padded to ``seq_len``)::

    [bos] prefix document suffix | answer eos | pad ...
    labels: -100 ...             | answer eos | -100 ...

Only the document (or the prompt) is truncated, never the answer. HF convention: ``labels`` equal
``input_ids`` where a loss is taken (the model shifts internally), -100 elsewhere.

The order of samples is a pure function of ``(seed, step)``: epoch ``e`` visits the examples in
the permutation ``randperm(N, seed=f(seed, e))``; the sample for step ``s`` (1-based), micro-batch
``m`` and row ``b`` is the global index ``((s - 1) * accum + m) * batch_size + b`` (data
parallel: ``batch_size * world`` rows a micro-batch, rank ``r`` the rows from
``r * batch_size``). A resumed run needs no iterator state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from npu_lora.data.readers import DataError, Example

if TYPE_CHECKING:
    import torch

DEFAULT_TEMPLATE = "리뷰: {text}\n감정:"
#: label → answer word (the model learns to write it after the prompt).
ANSWER_WORDS = {1: " 긍정", 0: " 부정"}
IGNORE_INDEX = -100


@dataclass
class TokenStats:
    examples: int = 0
    truncated: int = 0
    answer_truncated: int = 0
    label_tokens: int = 0
    real_tokens: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "truncated": self.truncated,
            "answer_truncated": self.answer_truncated,
            "label_tokens": self.label_tokens,
            "real_tokens": self.real_tokens,
            "kinds": dict(self.kinds),
        }


def _split_template(template: str) -> tuple[str, str]:
    if template.count("{text}") != 1:
        raise DataError(
            "spec.data.template: must contain the placeholder {text} exactly once "
            f"(got {template!r})"
        )
    prefix, _, suffix = template.partition("{text}")
    return prefix, suffix


def encode_example(
    ex: Example,
    tok: Any,
    seq_len: int,
    *,
    template: str | None = None,
    stats: TokenStats | None = None,
    cache: dict[str, list[int]] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """``(input_ids, attention_mask, labels)``, each of length ``seq_len``.

    ``cache``: pre-computed ``text -> ids`` (see :func:`batch_encode`).
    """

    def enc(text: str) -> list[int]:
        if not text:
            return []
        if cache is not None and text in cache:
            return list(cache[text])
        return list(tok.encode(text, add_special_tokens=False))

    bos = [tok.bos_token_id] if getattr(tok, "bos_token_id", None) is not None else []
    eos = [tok.eos_token_id]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    truncated = answer_truncated = False

    if ex.kind == "text":
        body = enc(ex.text)
        ids = bos + body + eos
        if len(ids) > seq_len:
            ids = ids[:seq_len]
            truncated = True
        labels = [IGNORE_INDEX] * len(bos) + ids[len(bos) :]
    else:
        if ex.kind == "classify":
            prefix, suffix = _split_template(template or DEFAULT_TEMPLATE)
            head, doc, tail = enc(prefix), enc(ex.text), enc(suffix)
            if ex.label not in ANSWER_WORDS:
                raise DataError(f"spec.data.path: {ex.source}: label must be 0 or 1")
            answer = enc(ANSWER_WORDS[ex.label]) + eos
        else:  # prompt / completion
            head, doc, tail = [], enc(ex.text), []
            answer = enc(ex.completion or "") + eos
        fixed = len(bos) + len(head) + len(tail)
        if ex.kind == "classify" and fixed + len(answer) > seq_len:
            raise DataError(
                f"spec.training.seqLen: {seq_len} is too short for the prompt template and the "
                f"answer ({fixed + len(answer)} tokens without the document; use a larger "
                "seqLen or a shorter spec.data.template)"
            )
        if fixed + len(answer) > seq_len - 1:  # a very long completion: keep one prompt token
            answer = answer[: max(1, seq_len - 1 - fixed)]
            answer_truncated = True
        budget = seq_len - fixed - len(answer)
        if len(doc) > budget:
            doc = doc[:budget]
            truncated = True
        prompt = bos + head + doc + tail
        ids = prompt + answer
        labels = [IGNORE_INDEX] * len(prompt) + answer

    n = len(ids)
    mask = [1] * n + [0] * (seq_len - n)
    ids = ids + [pad] * (seq_len - n)
    labels = labels + [IGNORE_INDEX] * (seq_len - n)
    if stats is not None:
        stats.examples += 1
        stats.truncated += int(truncated)
        stats.answer_truncated += int(answer_truncated)
        stats.label_tokens += sum(1 for x in labels if x != IGNORE_INDEX)
        stats.real_tokens += n
        stats.kinds[ex.kind] = stats.kinds.get(ex.kind, 0) + 1
    return ids, mask, labels


def pieces(ex: Example, template: str | None) -> list[str]:
    """The strings :func:`encode_example` tokenises for ``ex``."""
    if ex.kind == "text":
        return [ex.text]
    if ex.kind == "classify":
        prefix, suffix = _split_template(template or DEFAULT_TEMPLATE)
        return [prefix, ex.text, suffix, *ANSWER_WORDS.values()]
    return [ex.text, ex.completion or ""]


def batch_encode(
    tok: Any, examples: list[Example], template: str | None, chunk: int = 1024
) -> dict[str, list[int]]:
    """Tokenise every distinct piece of ``examples`` in batches (fast tokenizers: in parallel)."""
    texts = list(dict.fromkeys(t for ex in examples for t in pieces(ex, template) if t))
    cache: dict[str, list[int]] = {}
    for i in range(0, len(texts), chunk):
        part = texts[i : i + chunk]
        ids = tok(part, add_special_tokens=False)["input_ids"]
        cache.update(zip(part, ids, strict=True))
    return cache


def _perm(n: int, seed: int, salt: int) -> torch.Tensor:
    import torch

    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + salt * 7_919 + 17) % (2**63 - 1))
    return torch.randperm(n, generator=g)


def select_examples(examples: list[Example], seed: int, max_examples: int | None) -> list[Example]:
    """``maxExamples``: the first ``max_examples`` of a seeded shuffle (all when None)."""
    if max_examples is None or max_examples >= len(examples):
        return examples
    order = _perm(len(examples), seed, salt=-1)[:max_examples].tolist()
    return [examples[i] for i in sorted(order)]


class TokenizedDataset:
    """All examples tokenised to ``[N, seq_len]`` tensors, with a step-indexed sample order."""

    def __init__(
        self,
        examples: list[Example],
        tok: Any,
        seq_len: int,
        *,
        template: str | None = None,
        seed: int = 0,
    ) -> None:
        import torch

        if not examples:
            raise DataError("spec.data.path: no examples")
        self.seq_len = seq_len
        self.seed = seed
        self.stats = TokenStats()
        cache = batch_encode(tok, examples, template)
        rows = [
            encode_example(e, tok, seq_len, template=template, stats=self.stats, cache=cache)
            for e in examples
        ]
        self.input_ids = torch.tensor([r[0] for r in rows], dtype=torch.long)
        self.attention_mask = torch.tensor([r[1] for r in rows], dtype=torch.long)
        self.labels = torch.tensor([r[2] for r in rows], dtype=torch.long)
        self._perm_epoch = -1
        self._perm: list[int] = []

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def index(self, global_sample: int) -> int:
        """Example index of the ``global_sample``-th sample of the infinite epoch stream."""
        n = len(self)
        epoch, pos = divmod(global_sample, n)
        if epoch != self._perm_epoch:
            self._perm = _perm(n, self.seed, salt=epoch).tolist()
            self._perm_epoch = epoch
        return self._perm[pos]

    def batch(
        self, step: int, micro: int, batch_size: int, accum: int, *, rank: int = 0, world: int = 1
    ) -> dict[str, torch.Tensor]:
        """The micro-batch ``micro`` (0-based) of optimizer step ``step`` (1-based).

        Data parallel (``world`` ranks): the global micro-batch has ``batch_size * world`` rows
        and rank ``rank`` takes rows ``[rank * batch_size, (rank + 1) * batch_size)``: disjoint
        shards, and ``world`` ranks × ``batch_size`` see the samples of one rank × ``batch_size
        * world``."""
        start = ((step - 1) * accum + micro) * batch_size * world + rank * batch_size
        idx = [self.index(start + b) for b in range(batch_size)]
        return {
            "input_ids": self.input_ids[idx].clone(),
            "attention_mask": self.attention_mask[idx].clone(),
            "labels": self.labels[idx].clone(),
        }

    def iter_batches(self, start_step: int, batch_size: int, accum: int):
        """Infinite iterator of ``(step, [micro-batches])`` from ``start_step`` (1-based)."""
        step = start_step
        while True:
            yield step, [self.batch(step, m, batch_size, accum) for m in range(accum)]
            step += 1
