"""Training data: readers (NSMC TSV, JSON lines, chat, alpaca, ``datasets`` files), tokenisation
to a fixed length (chat template, assistant-only labels, packing), the resumable order.

Entry points: :func:`load_examples` (``spec`` → validated ``list[Example]``),
:func:`tokenize_examples` (examples + tokenizer + ``spec`` → :class:`TokenizedDataset`),
:func:`prepare_data` (both, plus the tokenizer). Torch, ``datasets`` and TRL are imported only
inside functions (the operator imports ``npu_lora.api`` and must stay light). See docs/data.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from npu_lora.data.dataset import (
    ANSWER_WORDS,
    DEFAULT_TEMPLATE,
    IGNORE_INDEX,
    TokenizedDataset,
    TokenStats,
    encode_example,
    select_examples,
)
from npu_lora.data.readers import (
    EXAMPLES,
    DataError,
    Example,
    detect_format,
    read_examples,
    read_jsonl,
    read_nsmc,
    resolve_data_path,
)
from npu_lora.data.tokenizer import BYTE_VOCAB_SIZE, byte_level_tokenizer, load_tokenizer

if TYPE_CHECKING:
    from npu_lora.api.v1alpha1 import DataSpec, MoEFinetuneSpec

__all__ = [
    "ANSWER_WORDS",
    "BYTE_VOCAB_SIZE",
    "DEFAULT_TEMPLATE",
    "EXAMPLES",
    "IGNORE_INDEX",
    "DataError",
    "Example",
    "TokenStats",
    "TokenizedDataset",
    "byte_level_tokenizer",
    "detect_format",
    "encode_example",
    "load_examples",
    "load_tokenizer",
    "prepare_data",
    "read_examples",
    "read_jsonl",
    "read_nsmc",
    "resolve_data_path",
    "select_examples",
    "tokenize_examples",
]


def load_examples(spec: MoEFinetuneSpec | DataSpec, *, seed: int | None = None) -> list[Example]:
    """Resolve, read, validate and select the data (raises DataError naming the field, and for
    a bad row the file, line or row, and the row's field).

    ``spec``: a whole spec (reads ``spec.data``, selects with ``spec.training.seed``) or a
    :class:`DataSpec` alone (e.g. a held-out file; ``seed`` for ``maxExamples``, default 0).
    """
    from npu_lora.data.readers import data_root
    from npu_lora.data.tokenizer import volume_root

    data = getattr(spec, "data", spec)
    if seed is None:
        training = getattr(spec, "training", None)
        seed = training.seed if training is not None else 0
    base = volume_root("data") if data.volume is not None else None
    path = resolve_data_path(data.path, base=base, root=data_root(data.volume is not None))
    fmt = detect_format(path, data.format)
    examples = read_examples(path, fmt, max_row_bytes=data.max_row_bytes)
    return select_examples(examples, seed, data.max_examples)


def tokenize_examples(
    examples: list[Example], tok: Any, spec: MoEFinetuneSpec, *, for_training: bool = True
) -> TokenizedDataset:
    """Examples → :class:`TokenizedDataset` with the spec's seqLen, template, overflow and
    packing. ``for_training=False`` leaves the tokens-per-step figures out of the stats."""
    if spec.data.template is not None:
        from npu_lora.data.dataset import _split_template

        _split_template(spec.data.template)
    t = spec.training
    rows_per_step = t.batch_size * t.grad_accumulation if for_training else None
    return TokenizedDataset(
        examples,
        tok,
        t.seq_len,
        template=spec.data.template,
        seed=t.seed,
        overflow=spec.data.overflow,
        packing=spec.data.packing,
        rows_per_step=rows_per_step,
    )


def prepare_data(spec: MoEFinetuneSpec, tok: Any | None = None) -> tuple[TokenizedDataset, Any]:
    """Everything data-side of a run: ``(dataset, tokenizer)``; validates before any write.
    ``spec.eval.fraction``: the held-out examples are left out (``npu_lora.evaluate``)."""
    examples = load_examples(spec)
    if spec.eval is not None and spec.eval.fraction is not None:
        from npu_lora.data.dataset import split_held_out

        examples, _ = split_held_out(examples, spec.eval.fraction, spec.training.seed)
    if spec.data.template is not None:
        from npu_lora.data.dataset import _split_template

        _split_template(spec.data.template)
    if tok is None:
        tok = load_tokenizer(spec.model)
    return tokenize_examples(examples, tok, spec), tok
