"""Training data: NSMC/JSONL readers, tokenisation to a fixed length, the resumable order.

Torch is imported only by :class:`TokenizedDataset` (lazily); the readers are standard library.
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
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec

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
]


def load_examples(spec: MoEFinetuneSpec) -> list[Example]:
    """Resolve, read and select ``spec.data`` (raises DataError naming the field)."""
    from npu_lora.data.readers import data_root
    from npu_lora.data.tokenizer import volume_root

    base = volume_root("data") if spec.data.volume is not None else None
    path = resolve_data_path(
        spec.data.path, base=base, root=data_root(spec.data.volume is not None)
    )
    fmt = detect_format(path, spec.data.format)
    examples = read_examples(path, fmt)
    return select_examples(examples, spec.training.seed, spec.data.max_examples)


def prepare_data(spec: MoEFinetuneSpec, tok: Any | None = None) -> tuple[TokenizedDataset, Any]:
    """Everything data-side of a run: ``(dataset, tokenizer)``; validates before any write.
    ``spec.eval.fraction``: the held-out examples are left out (``npu_lora.evaluate``)."""
    examples = load_examples(spec)
    if spec.eval is not None and spec.eval.fraction is not None:
        from npu_lora.evaluate.heldout import split_held_out

        examples, _ = split_held_out(examples, spec.eval.fraction, spec.training.seed)
    if spec.data.template is not None:
        from npu_lora.data.dataset import _split_template

        _split_template(spec.data.template)
    if tok is None:
        tok = load_tokenizer(spec.model)
    ds = TokenizedDataset(
        examples,
        tok,
        spec.training.seq_len,
        template=spec.data.template,
        seed=spec.training.seed,
    )
    return ds, tok
