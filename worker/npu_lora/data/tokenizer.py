"""Tokenizers: a local Hugging Face tokenizer directory, or an offline byte-level one for presets.

``load_tokenizer(model_spec)`` returns a ``transformers.PreTrainedTokenizerBase`` with
``pad_token_id`` and ``eos_token_id`` set; ``len(tok)`` is the vocabulary size the engine must
give its embedding (``build_engine(spec, vocab_size=len(tok))``). Nothing is downloaded.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npu_lora.api.load import SpecError
from npu_lora.api.modeldir import check_no_custom_code
from npu_lora.api.volumes import volume_root  # re-exported: data.tokenizer.volume_root

if TYPE_CHECKING:
    from npu_lora.api.v1alpha1 import ModelSpec

BYTE_SPECIALS = ("<pad>", "<bos>", "<eos>")
#: Size of the byte-level tokenizer: 3 specials + 256 bytes.
BYTE_VOCAB_SIZE = len(BYTE_SPECIALS) + 256


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (the ByteLevel alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def byte_level_tokenizer() -> Any:
    """A deterministic byte-level tokenizer: ids 0..2 = <pad>, <bos>, <eos>; 3 + b for byte b."""
    return _byte_level_tokenizer_cached()


@lru_cache(maxsize=1)
def _byte_level_tokenizer_cached() -> Any:
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(BYTE_SPECIALS)}
    for b, ch in sorted(_bytes_to_unicode().items()):
        vocab[ch] = len(BYTE_SPECIALS) + b
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        model_max_length=1 << 30,
    )
    assert len(tok) == BYTE_VOCAB_SIZE
    return tok


def tokenizer_dir(model: ModelSpec) -> tuple[Path | None, str]:
    """The directory to load the tokenizer from and the field it came from (None: byte-level)."""
    base = volume_root("model") if model.volume is not None else None
    for field, value in (
        ("spec.model.tokenizer", model.tokenizer),
        ("spec.model.path", model.path),
    ):
        if value:
            p = Path(value).expanduser()
            if base is not None and not p.is_absolute():
                p = base / p
            return p, field
    return None, "spec.model.preset"


def check_tokenizer_dir(path: Path, field: str) -> None:
    if not path.is_dir():
        raise SpecError(f"{field}: no such directory: {path} (expected a tokenizer directory)")
    if not (path / "tokenizer.json").is_file() and not (
        (path / "vocab.json").is_file() and (path / "merges.txt").is_file()
    ):
        raise SpecError(
            f"{field}: {path} has no tokenizer files (expected tokenizer.json, or "
            "vocab.json + merges.txt)"
        )
    check_no_custom_code(path, field)


def load_tokenizer(model: ModelSpec) -> Any:
    """Load the run's tokenizer (local files only). Raises SpecError naming the field."""
    path, field = tokenizer_dir(model)
    if path is None:
        return byte_level_tokenizer()
    check_tokenizer_dir(path, field)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many types (OSError, ValueError, ...)
        raise SpecError(f"{field}: cannot load a tokenizer from {path}: {e}") from None
    if tok.eos_token_id is None:
        raise SpecError(f"{field}: the tokenizer in {path} defines no eos token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


#: End of a turn in the ChatML fallback (a stop string for generation: with the byte-level
#: tokenizer it is plain text, not a special token).
CHATML_END = "<|im_end|>"


def ensure_chat_template(tok: Any) -> Any:
    """``tok`` itself when it has a chat template, else a shallow copy of it with the ChatML
    fallback (:data:`CHATML_TEMPLATE`; the cached byte-level tokenizer is never modified).
    ``npu-lora chat``/``predict``/``export`` get their template here; training's ``format:
    chat`` renders the same template (``npu_lora.data.chat``)."""
    if getattr(tok, "chat_template", None):
        return tok
    import copy

    from npu_lora.data.chat import CHATML_TEMPLATE

    tok = copy.copy(tok)
    tok.chat_template = CHATML_TEMPLATE
    return tok
