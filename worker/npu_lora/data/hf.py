"""Parquet / JSON / CSV files and ``datasets.save_to_disk`` directories, read with Hugging Face
``datasets`` (``load_dataset("parquet" | "json" | "csv", data_files=...)``, ``load_from_disk``)
and mapped row by row onto the formats of :mod:`npu_lora.data.formats`.

``load_dataset`` builds an Arrow cache: it goes to a temporary directory that is removed after
the rows are read, so a run (or a failed one) leaves nothing in ``~/.cache``. A directory saved
as a ``DatasetDict`` is read from its ``train`` split (or its only split).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from npu_lora.data.base import DATASETS_SUFFIXES, DataError, Example


def _rows(path: Path) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        if path.is_dir():
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
