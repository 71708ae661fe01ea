"""Parquet / JSON / CSV files and ``datasets.save_to_disk`` directories, read with Hugging Face
``datasets`` (``load_dataset("parquet" | "json" | "csv", data_files=...)``, ``load_from_disk``)
and mapped row by row onto the formats of :mod:`npu_lora.data.formats`.

``load_dataset`` builds an Arrow cache: it goes to a temporary directory that is removed after
the rows are read, so a run (or a failed one) leaves nothing in ``~/.cache``. A directory saved
as a ``DatasetDict`` is read from its ``train`` split (or its only split).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from npu_lora.data.base import DATASETS_SUFFIXES, DataError, Example


def _plain_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\x00")
    )


def _saved_json(f: Path) -> Any:
    try:
        if f.is_symlink() or f.stat().st_size > 16 << 20:
            raise ValueError("a symbolic link or larger than 16 MiB")
        return json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DataError(f"spec.data.path: {f}: cannot read it: {e}") from None


def check_saved_dir(path: Path, *, split: bool = False) -> None:
    """A ``datasets.save_to_disk`` directory names only files of its own: ``dataset_dict.json``
    splits and ``state.json`` ``_data_files`` are plain names (``datasets`` joins them to the
    directory, so ``../other/x.arrow`` or an absolute name would read another directory), each a
    directory or regular file, never a symbolic link. DataError naming the file otherwise."""
    dd = _saved_json(path / "dataset_dict.json")
    if dd is not None and not split:
        splits = dd.get("splits") if isinstance(dd, dict) else None
        if not isinstance(splits, list) or not all(_plain_name(s) for s in splits):
            raise DataError(
                f"spec.data.path: {path / 'dataset_dict.json'}: splits must be plain names of "
                "directories inside it (no '/', no '..'): not read"
            )
        for s in splits:
            sub = path / s
            if sub.is_symlink() or not sub.is_dir():
                raise DataError(
                    f"spec.data.path: {sub}: a split must be a directory inside {path} (not a "
                    "symbolic link): not read"
                )
            check_saved_dir(sub, split=True)
        return
    state = _saved_json(path / "state.json")
    if state is None:
        return  # not a saved Dataset: datasets refuses it with its own message
    files = state.get("_data_files") if isinstance(state, dict) else None
    names = [f.get("filename") if isinstance(f, dict) else None for f in files or []]
    if not isinstance(files, list) or not all(_plain_name(n) for n in names):
        raise DataError(
            f"spec.data.path: {path / 'state.json'}: _data_files must be plain names of files "
            "inside it (no '/', no '..'): not read"
        )
    for n in names:
        f = path / n
        if f.is_symlink() or not f.is_file():
            raise DataError(
                f"spec.data.path: {f}: a data file must be a regular file inside {path} (not a "
                "symbolic link): not read"
            )


def _rows(path: Path) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        if path.is_dir():
            check_saved_dir(path)
            ds: Any = datasets.load_from_disk(str(path), keep_in_memory=True)
            if isinstance(ds, datasets.DatasetDict):
                splits = list(ds)
                if "train" in ds:
                    ds = ds["train"]
                elif len(splits) == 1:
                    ds = ds[splits[0]]
                else:
                    raise DataError(
                        f"spec.data.path: {path}: a DatasetDict without a 'train' split "
                        f"(splits: {', '.join(splits)}); save the split to train on"
                    )
            return ds.to_list()
        builder = DATASETS_SUFFIXES[path.suffix.lower()]
        with tempfile.TemporaryDirectory(prefix="npu-lora-datasets-") as cache:
            ds = datasets.load_dataset(
                builder,
                data_files=str(path),
                split="train",
                cache_dir=cache,
                keep_in_memory=True,
            )
            return ds.to_list()
    except DataError:
        raise
    except Exception as e:  # datasets / pyarrow raise many types for a malformed file
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(
            f"spec.data.path: {path}: cannot read it with datasets: {msg[:300]}"
        ) from None


def read_datasets_file(path: Path, fmt: str, *, limit: int | None = None) -> list[Example]:
    """Rows of a ``datasets`` file → examples; errors name ``FILE:row N`` (0-based) and the field."""
    from npu_lora.data.formats import detect_row_format, row_to_example

    rows = _rows(path)
    if limit is not None:
        rows = rows[:limit]
    if rows and fmt == "auto":
        fmt = detect_row_format(rows[0])
    return [row_to_example(r, fmt, f"{path}:row {i}") for i, r in enumerate(rows)]  # type: ignore[arg-type]
