"""Readers for the training data: NSMC TSV and JSON lines (rows: see :mod:`npu_lora.data.formats`);
parquet / JSON / CSV files and ``save_to_disk`` directories go through :mod:`npu_lora.data.hf`.

All return a list of :class:`Example`. A reader raises :class:`DataError` (a
:class:`~npu_lora.api.load.SpecError`) naming the field (``spec.data.path``) and, for a
malformed row, the file and line number.
"""

from __future__ import annotations

import csv
import json
import os
from importlib import resources
from pathlib import Path

from npu_lora.data.base import (  # re-exported: readers.DataError, readers.Example, ...
    DATASETS_SUFFIXES,
    DataError,
    Example,
    _echo,
)

#: ``spec.data.maxRowBytes``'s default: a row (a line of a TSV/JSONL file, a record of a
#: ``datasets`` file) longer than this many bytes is an error naming ``file:line``, raised before
#: the row is decoded or tokenised (a 100 MB row made the tokenizer abort).
DEFAULT_MAX_ROW_BYTES = 4 << 20
#: its upper bound (the schema's), also how much of a first line format detection reads
MAX_ROW_BYTES_LIMIT = 256 << 20

#: ``example:<name>`` → file name inside ``npu_lora/data/examples``.
EXAMPLES: dict[str, str] = {
    "nsmc-mini": "nsmc-mini.tsv",
    "jsonl-mini": "jsonl-mini.jsonl",
    "chat-mini": "chat-mini.jsonl",
}

NSMC_HEADER = ("id", "document", "label")


def data_root(has_volume: bool) -> Path | None:
    """The directory data must stay in: ``NPU_LORA_DATA_ROOT`` (the operator sets it to the data
    volume's mount), else the data volume's root when ``spec.data.volume`` is set, else None."""
    env = os.environ.get("NPU_LORA_DATA_ROOT")
    if env:
        return Path(env)
    if has_volume:
        from npu_lora.data.tokenizer import volume_root

        return volume_root("data")
    return None


def _inside(p: Path, root: Path) -> bool:
    real, top = os.path.realpath(p), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def resolve_data_path(path: str, *, base: Path | None = None, root: Path | None = None) -> Path:
    """Resolve ``spec.data.path``: ``example:<name>`` → the packaged file; else a file path.

    With ``root`` the file (after ``..`` and symlinks) must lie inside it; a path outside is
    refused before it is opened or even checked for existence.
    """
    if path.startswith("example:"):
        name = path.removeprefix("example:")
        if name not in EXAMPLES:
            allowed = ", ".join(f"example:{n}" for n in EXAMPLES)
            raise DataError(
                f"spec.data.path: unknown example dataset {path!r} (allowed: {allowed})"
            )
        ref = resources.files("npu_lora.data") / "examples" / EXAMPLES[name]
        p = Path(str(ref))
        if not p.is_file():
            raise DataError(
                f"spec.data.path: the packaged example {path!r} is missing ({p}); "
                "regenerate it with scripts/make_example_data.py"
            )
        return p
    p = Path(path).expanduser()
    if base is not None and not p.is_absolute():
        p = base / p
    if root is not None and not _inside(p, root):
        raise DataError(
            f"spec.data.path: {path!r} is outside the data root {root} (not read; symlinks and "
            "'..' may not leave it)"
        )
    if not p.exists():
        raise DataError(f"spec.data.path: no such file: {p}")
    if p.is_dir():
        if not (p / "dataset_info.json").is_file() and not (p / "dataset_dict.json").is_file():
            raise DataError(
                f"spec.data.path: not a regular file: {p} (a directory must be a "
                "`datasets.save_to_disk` one, with dataset_info.json or dataset_dict.json)"
            )
        return p
    if not p.is_file():
        raise DataError(f"spec.data.path: not a regular file: {p}")
    return p


FORMATS = ("auto", "nsmc", "jsonl", "chat", "alpaca")


def detect_format(path: Path, fmt: str) -> str:
    """Resolve ``format: auto``: a TSV/text file → ``nsmc``; a JSON-lines file → by its first
    row's fields (:func:`formats.detect_row_format`); a ``datasets`` file or directory stays
    ``auto`` (its reader decides from the first row after loading)."""
    if fmt not in FORMATS:
        raise DataError(f"spec.data.format: unsupported {fmt!r} (allowed: {', '.join(FORMATS)})")
    if fmt != "auto" or path.is_dir():
        return fmt
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson") or (suffix == ".json" and _json_lines(path)):
        return _first_row_format(path)
    if suffix in DATASETS_SUFFIXES:
        return "auto"
    return "nsmc"


def _first_row_format(path: Path) -> str:
    from npu_lora.data.formats import detect_row_format

    try:
        first = _first_line(path)
        if first.strip():
            obj = json.loads(first)
            return detect_row_format(obj) if isinstance(obj, dict) else "jsonl"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass  # the reader reports it with the line number
    return "jsonl"


def _first_line(path: Path) -> str:
    """The first non-blank line (at most :data:`MAX_ROW_BYTES_LIMIT` bytes of it are read)."""
    with path.open("rb") as f:
        while True:
            raw = f.readline(MAX_ROW_BYTES_LIMIT)
            if not raw or raw.strip():
                return raw.decode("utf-8")


def _open_text(path: Path):
    try:
        return path.open("r", encoding="utf-8", newline="")
    except OSError as e:
        raise DataError(f"spec.data.path: cannot read {path}: {e.strerror}") from None


def _too_long(where: str, max_row_bytes: int) -> DataError:
    return DataError(
        f"spec.data.path: {where}: the row is longer than spec.data.maxRowBytes "
        f"({max_row_bytes} bytes); split it, or raise the limit"
    )


def _bounded_lines(path: Path, max_row_bytes: int):
    """``(line number, text)`` of each line (its line ending kept), read in binary with at most
    ``max_row_bytes`` (+ the line ending) a line: a longer line is an error naming ``file:line``
    before it is read in full; a line that is not UTF-8 is one naming ``file:line``."""
    try:
        f = path.open("rb")
    except OSError as e:
        raise DataError(f"spec.data.path: cannot read {path}: {e.strerror}") from None
    with f:
        lineno = 0
        while True:
            raw = f.readline(max_row_bytes + 2)
            if not raw:
                return
            lineno += 1
            body = raw.rstrip(b"\r\n")
            if len(body) > max_row_bytes:
                raise _too_long(f"{path}:{lineno}", max_row_bytes)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"spec.data.path: {path}:{lineno}: not UTF-8 text: {e.reason}"
                ) from None
            yield lineno, text


def _row_bytes(ex: Example) -> int:
    n = len(ex.text.encode("utf-8", "replace")) + len(
        (ex.completion or "").encode("utf-8", "replace")
    )
    for m in ex.messages or ():
        n += sum(len(str(v).encode("utf-8", "replace")) for v in m.values())
    return n


def check_row_sizes(examples: list[Example], max_row_bytes: int) -> None:
    """DataError naming the first example whose text is longer than ``max_row_bytes``."""
    for ex in examples:
        if _row_bytes(ex) > max_row_bytes:
            raise _too_long(ex.source or "a row", max_row_bytes)


def read_nsmc(
    path: Path, *, limit: int | None = None, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> list[Example]:
    """NSMC TSV: header ``id<TAB>document<TAB>label``, no quoting, label 0/1.

    ``limit`` stops after that many rows (used to validate the first rows cheaply); a line longer
    than ``max_row_bytes`` is an error naming ``file:line``.
    """
    out: list[Example] = []
    lines = (text for _, text in _bounded_lines(path, max_row_bytes))
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE, strict=False)
    try:
        for row in reader:
            line = reader.line_num
            where = f"{path}:{line}"
            if line == 1:
                if tuple(c.strip().lstrip("\ufeff") for c in row) != NSMC_HEADER:
                    # the line itself is not echoed: the path may name any file
                    raise DataError(
                        f"spec.data.path: {where}: expected the NSMC header "
                        f"'id<TAB>document<TAB>label', got a line of {len(row)} "
                        "tab-separated field(s) that is not that header "
                        "(set spec.data.format: jsonl for a JSONL file)"
                    )
                continue
            if not row or row == [""]:
                continue
            if len(row) != 3:
                raise DataError(
                    f"spec.data.path: {where}: expected 3 tab-separated fields "
                    f"(id, document, label), got {len(row)}"
                )
            label_text = row[2].strip()
            if label_text not in ("0", "1"):
                raise DataError(
                    f"spec.data.path: {where}: label must be 0 or 1, got {_echo(row[2])}"
                )
            out.append(Example("classify", row[1], label=int(label_text), source=where))
            if limit is not None and len(out) >= limit:
                break
    except UnicodeDecodeError as e:
        raise DataError(
            f"spec.data.path: {path}: not UTF-8 text near line {reader.line_num + 1}: {e.reason}"
        ) from None
    except csv.Error as e:
        raise DataError(f"spec.data.path: {path}:{reader.line_num}: {e}") from None
    if reader.line_num == 0:
        raise DataError(f"spec.data.path: {path}: empty file (expected an NSMC header line)")
    return out


def read_jsonl(
    path: Path,
    fmt: str = "auto",
    *,
    limit: int | None = None,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
) -> list[Example]:
    """JSON lines: one object a line, validated as ``fmt`` (``auto``: by the first row's fields;
    see :mod:`npu_lora.data.formats`). Errors name ``FILE:LINE`` and the field; a line longer
    than ``max_row_bytes`` is one."""
    from npu_lora.data.formats import detect_row_format, row_to_example

    out: list[Example] = []
    lineno = 0
    try:
        for lineno, raw in _bounded_lines(path, max_row_bytes):
            line = raw.strip()
            if not line:
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"spec.data.path: {where}: not valid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise DataError(f"spec.data.path: {where}: expected a JSON object")
            if fmt == "auto":
                fmt = detect_row_format(obj)
            out.append(row_to_example(obj, fmt, where))  # type: ignore[arg-type]
            if limit is not None and len(out) >= limit:
                break
    except UnicodeDecodeError as e:
        raise DataError(
            f"spec.data.path: {path}: not UTF-8 text near line {lineno + 1}: {e.reason}"
        ) from None
    return out


def _json_lines(path: Path) -> bool:
    """A ``.json`` file holding JSON lines (its first line is a whole JSON object), not one
    array or pretty-printed document: read it line by line (errors then name the line)."""
    try:
        first = _first_line(path)
    except (OSError, UnicodeDecodeError):
        return True  # the line reader reports it with a line number
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def read_examples(
    path: Path, fmt: str, *, limit: int | None = None, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> list[Example]:
    """Read ``path`` (resolved) as ``fmt`` (from :func:`detect_format`); a row longer than
    ``max_row_bytes`` (``spec.data.maxRowBytes``) is an error naming it."""
    suffix = path.suffix.lower()
    if path.is_dir() or (
        suffix in DATASETS_SUFFIXES and not (suffix == ".json" and _json_lines(path))
    ):
        from npu_lora.data.hf import read_datasets_file

        examples = read_datasets_file(path, fmt, limit=limit)
        check_row_sizes(examples, max_row_bytes)
    elif fmt == "nsmc" and suffix not in (".jsonl", ".ndjson", ".json"):
        examples = read_nsmc(path, limit=limit, max_row_bytes=max_row_bytes)
    else:
        examples = read_jsonl(path, fmt, limit=limit, max_row_bytes=max_row_bytes)
    if not examples:
        raise DataError(f"spec.data.path: {path}: no examples (the file has no data rows)")
    return examples
