"""Tokenisation to fixed ``seqLen`` and the deterministic, resumable sample order.

Layout of one sequence (right-padded to ``seq_len``)::

    [bos] prefix document suffix | answer eos | pad ...
    labels: -100 ...             | answer eos | -100 ...

Only the document (or the prompt) is truncated, never the answer. HF convention: ``labels`` equal
``input_ids`` where a loss is taken (the model shifts internally), -100 elsewhere. Chat rows
(and alpaca rows with a tokenizer that has its own chat template) are rendered with the chat
template (:mod:`npu_lora.data.chat`), loss on the assistant tokens; a conversation longer than
``seq_len`` is cut at ``seq_len`` (``data.overflow: truncate``) or left out (``drop``).

Packing (``data.packing``): the encoded examples (unpadded) are packed into ``seq_len`` rows by
TRL's ``pack_dataset`` (best-fit decreasing); each row then carries ``position_ids`` that restart
at 0 for every example, from which the engine builds a block-diagonal causal mask
(:func:`npu_lora.device.graphs.causal_mask`); the first token of each example gets no label
(nothing inside its example predicts it, exactly as in an unpacked row).

The order of samples is a pure function of ``(seed, step)``: epoch ``e`` visits the examples in
the permutation ``randperm(N, seed=f(seed, e))``; the sample for step ``s`` (1-based), micro-batch
``m`` and row ``b`` is the global index ``((s - 1) * accum + m) * batch_size + b`` (data
parallel: ``batch_size * world`` rows a micro-batch, rank ``r`` the rows from
``r * batch_size``). A resumed run needs no iterator state. The order depends on the world size
only through the global micro-batch ``batch_size * world``: with that product kept, a run
resumes at another world size on the same samples (:func:`npu_lora.train.rundir.global_batch`).
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
    """Data stats (the summary's ``data``). ``examples``: examples encoded; ``truncated`` /
    ``dropped``: longer than seqLen and cut / left out (``data.overflow``); ``no_label``: left out
    because truncation left no label token; ``rows``: the ``[rows, seq_len]`` training rows
    (fewer than the examples when packed); ``pad_fraction``: padding share of those rows;
    ``real_tokens_per_step`` / ``tokens_per_step``: real / all tokens of one optimizer step."""

    examples: int = 0
    truncated: int = 0
    answer_truncated: int = 0
    label_tokens: int = 0
    real_tokens: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    no_label: int = 0
    rows: int = 0
    seq_len: int = 0
    packed: bool = False
    rows_per_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        slots = self.rows * self.seq_len
        per_row = self.real_tokens / self.rows if self.rows else 0.0
        out: dict[str, Any] = {
            "examples": self.examples,
            "truncated": self.truncated,
            "answer_truncated": self.answer_truncated,
            "dropped": self.dropped,
            "no_label": self.no_label,
            "label_tokens": self.label_tokens,
            "real_tokens": self.real_tokens,
            "kinds": dict(self.kinds),
            "rows": self.rows,
            "packed": self.packed,
            "real_tokens_per_row": round(per_row, 2),
            "pad_fraction": round(1.0 - self.real_tokens / slots, 4) if slots else 0.0,
        }
        if self.rows_per_step:
            out["tokens_per_step"] = self.rows_per_step * self.seq_len
            out["real_tokens_per_step"] = round(self.rows_per_step * per_row, 1)
        return out


def _split_template(template: str) -> tuple[str, str]:
    if template.count("{text}") != 1:
        raise DataError(
            "spec.data.template: must contain the placeholder {text} exactly once "
            f"(got {template!r})"
        )
    prefix, _, suffix = template.partition("{text}")
    return prefix, suffix


@dataclass
class Encoded:
    """One example, unpadded: ``ids`` and ``labels`` (same length), and what was cut."""

    ids: list[int]
    labels: list[int]
    truncated: bool = False
    answer_truncated: bool = False
    overflow: bool = False  # longer than seq_len before any cut (``data.overflow: drop``)


def encode_unpadded(
    ex: Example,
    tok: Any,
    seq_len: int,
    *,
    template: str | None = None,
    cache: dict[str, list[int]] | None = None,
    chat_template: str | None = None,
) -> Encoded:
    """Tokenise ``ex`` to at most ``seq_len`` tokens (no padding). ``chat_template``: the
    training chat template (:func:`npu_lora.data.chat.training_chat_template`); chat rows need
    it, alpaca rows use it when the tokenizer has a template of its own."""

    def enc(text: str) -> list[int]:
        if not text:
            return []
        if cache is not None and text in cache:
            return list(cache[text])
        return list(tok.encode(text, add_special_tokens=False))

    if ex.kind == "chat" or (ex.kind == "alpaca" and _use_chat(tok)):
        from npu_lora.data.chat import encode_chat, training_chat_template

        tpl = chat_template or training_chat_template(tok)
        ids, labels = encode_chat(ex.messages or (), tok, tpl)
        if len(ids) <= seq_len:
            return Encoded(ids, labels)
        return Encoded(ids[:seq_len], labels[:seq_len], truncated=True, overflow=True)

    bos = [tok.bos_token_id] if getattr(tok, "bos_token_id", None) is not None else []
    eos = [tok.eos_token_id]
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
        else:  # prompt / completion (and alpaca in the prompt layout)
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
    return Encoded(ids, labels, truncated, answer_truncated, overflow=truncated or answer_truncated)


def _use_chat(tok: Any) -> bool:
    """Alpaca rows become a user/assistant conversation when the tokenizer has its own chat
    template (an instruct model), else they use the ``ALPACA_PROMPT`` layout."""
    from npu_lora.data.chat import has_native_template

    return has_native_template(tok)


def _pad_id(tok: Any) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def encode_example(
    ex: Example,
    tok: Any,
    seq_len: int,
    *,
    template: str | None = None,
    stats: TokenStats | None = None,
    cache: dict[str, list[int]] | None = None,
    chat_template: str | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """``(input_ids, attention_mask, labels)``, each of length ``seq_len`` (right-padded).

    ``cache``: pre-computed ``text -> ids`` (see :func:`batch_encode`).
    """
    e = encode_unpadded(
        ex, tok, seq_len, template=template, cache=cache, chat_template=chat_template
    )
    n = len(e.ids)
    mask = [1] * n + [0] * (seq_len - n)
    ids = e.ids + [_pad_id(tok)] * (seq_len - n)
    labels = e.labels + [IGNORE_INDEX] * (seq_len - n)
    if stats is not None:
        _count(stats, ex, e)
    return ids, mask, labels


def _count(stats: TokenStats, ex: Example, e: Encoded) -> None:
    stats.examples += 1
    stats.truncated += int(e.truncated)
    stats.answer_truncated += int(e.answer_truncated)
    stats.label_tokens += sum(1 for x in e.labels if x != IGNORE_INDEX)
    stats.real_tokens += len(e.ids)
    stats.kinds[ex.kind] = stats.kinds.get(ex.kind, 0) + 1


def pack_examples(
    encoded: list[Encoded], seq_len: int, pad_id: int
) -> tuple[list[list[int]], list[list[int]], list[list[int]], list[list[int]]]:
    """Pack unpadded examples into ``seq_len`` rows with TRL's ``pack_dataset`` (best-fit
    decreasing, whole examples only). Returns ``(input_ids, attention_mask, labels,
    position_ids)`` rows; positions restart at 0 for each example (and run on over the padding
    of the row's last example); the first token of each example carries no label."""
    import datasets
    from trl.data_utils import pack_dataset

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict(
        {"input_ids": [e.ids for e in encoded], "labels": [e.labels for e in encoded]}
    )
    packed = pack_dataset(ds, seq_len, strategy="bfd", map_kwargs={"batch_size": max(len(ds), 1)})
    ids_rows, mask_rows, label_rows, pos_rows = [], [], [], []
    for row in packed.to_list():
        ids, labels, lengths = list(row["input_ids"]), list(row["labels"]), row["seq_lengths"]
        pos: list[int] = []
        start = 0
        for n in lengths:
            labels[start] = IGNORE_INDEX
            pos.extend(range(n))
            start += n
        real = len(ids)
        pad = seq_len - real
        last = lengths[-1]
        ids_rows.append(ids + [pad_id] * pad)
        mask_rows.append([1] * real + [0] * pad)
        label_rows.append(labels + [IGNORE_INDEX] * pad)
        pos_rows.append(pos + list(range(last, last + pad)))
    return ids_rows, mask_rows, label_rows, pos_rows


def pieces(ex: Example, template: str | None) -> list[str]:
    """The strings :func:`encode_example` tokenises for ``ex``."""
    if ex.kind == "text":
        return [ex.text]
    if ex.kind == "classify":
        prefix, suffix = _split_template(template or DEFAULT_TEMPLATE)
        return [prefix, ex.text, suffix, *ANSWER_WORDS.values()]
    if ex.kind == "chat":
        return []  # rendered by the chat template
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


#: the held-out split's shuffle salt (spec.eval.fraction)
HELD_OUT_SALT = -2  # the held-out permutation (the data order uses salts >= 0, maxExamples -1)


def split_held_out(
    examples: list[Example], fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """``(train, held_out)``: ``round(fraction * N)`` (at least 1) examples of a seeded shuffle
    held out; both keep the file order. Raises DataError when no training example is left."""
    n = len(examples)
    k = max(1, round(fraction * n))
    if k >= n:
        raise DataError(
            f"spec.eval.fraction: {fraction} of {n} examples leaves none to train on "
            "(use a smaller fraction or more data)"
        )
    held = set(_perm(n, seed, salt=HELD_OUT_SALT)[:k].tolist())
    train = [e for i, e in enumerate(examples) if i not in held]
    return train, [e for i, e in enumerate(examples) if i in held]


def select_examples(examples: list[Example], seed: int, max_examples: int | None) -> list[Example]:
    """``maxExamples``: the first ``max_examples`` of a seeded shuffle (all when None)."""
    if max_examples is None or max_examples >= len(examples):
        return examples
    order = _perm(len(examples), seed, salt=-1)[:max_examples].tolist()
    return [examples[i] for i in sorted(order)]


class TokenizedDataset:
    """All examples tokenised to ``[rows, seq_len]`` tensors, with a step-indexed sample order.

    ``overflow``: ``truncate`` (cut at ``seq_len``) or ``drop`` (leave out examples longer than
    ``seq_len``). ``packing``: pack several examples a row (``position_ids`` restart per
    example; :meth:`batch` then also returns ``position_ids``). ``rows_per_step`` (batch size ×
    accumulation × world) only feeds the tokens-per-step figures of :attr:`stats`.
    """

    def __init__(
        self,
        examples: list[Example],
        tok: Any,
        seq_len: int,
        *,
        template: str | None = None,
        seed: int = 0,
        overflow: str = "truncate",
        packing: bool = False,
        rows_per_step: int | None = None,
    ) -> None:
        import torch

        if not examples:
            raise DataError("spec.data.path: no examples")
        if overflow not in ("truncate", "drop"):
            raise DataError(f"spec.data.overflow: must be truncate or drop (got {overflow!r})")
        self.seq_len = seq_len
        self.seed = seed
        self.packed = packing
        self.stats = TokenStats(seq_len=seq_len, packed=packing, rows_per_step=rows_per_step)
        cache = batch_encode(tok, examples, template)
        chat_template = None
        if any(e.kind == "chat" for e in examples) or (
            any(e.kind == "alpaca" for e in examples) and _use_chat(tok)
        ):
            from npu_lora.data.chat import training_chat_template

            chat_template = training_chat_template(tok)
        kept: list[Encoded] = []
        for ex in examples:
            e = encode_unpadded(
                ex, tok, seq_len, template=template, cache=cache, chat_template=chat_template
            )
            if overflow == "drop" and e.overflow:
                self.stats.dropped += 1
                continue
            if not any(x != IGNORE_INDEX for x in e.labels[1:]):
                self.stats.no_label += 1  # truncation cut every answer token
                continue
            _count(self.stats, ex, e)
            kept.append(e)
        if not kept:
            raise DataError(
                f"spec.data.overflow: no example is left: all {len(examples)} are longer than "
                f"spec.training.seqLen ({seq_len}) ({self.stats.dropped} dropped, "
                f"{self.stats.no_label} without an answer token after truncation); raise seqLen "
                "or use overflow: truncate"
            )
        pad = _pad_id(tok)
        self.position_ids: torch.Tensor | None = None
        if packing:
            ids, mask, labels, pos = pack_examples(kept, seq_len, pad)
            self.position_ids = torch.tensor(pos, dtype=torch.long)
            self.stats.label_tokens = sum(1 for r in labels for x in r if x != IGNORE_INDEX)
        else:
            ids = [e.ids + [pad] * (seq_len - len(e.ids)) for e in kept]
            mask = [[1] * len(e.ids) + [0] * (seq_len - len(e.ids)) for e in kept]
            labels = [e.labels + [IGNORE_INDEX] * (seq_len - len(e.labels)) for e in kept]
        self.input_ids = torch.tensor(ids, dtype=torch.long)
        self.attention_mask = torch.tensor(mask, dtype=torch.long)
        self.labels = torch.tensor(labels, dtype=torch.long)
        self.stats.rows = len(ids)
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
        out = {
            "input_ids": self.input_ids[idx].clone(),
            "attention_mask": self.attention_mask[idx].clone(),
            "labels": self.labels[idx].clone(),
        }
        if self.position_ids is not None:
            out["position_ids"] = self.position_ids[idx].clone()
        return out

    def iter_batches(self, start_step: int, batch_size: int, accum: int):
        """Infinite iterator of ``(step, [micro-batches])`` from ``start_step`` (1-based)."""
        step = start_step
        while True:
            yield step, [self.batch(step, m, batch_size, accum) for m in range(accum)]
            step += 1
