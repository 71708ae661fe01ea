"""What a model or tokenizer directory may hold (torch-free): no custom code, no pickle.

transformers runs a directory's own Python when its config names classes through ``auto_map``
(with ``trust_remote_code``, which this package never passes) and unpickles ``*.bin``/``*.pt``
weights; npu-lora reads safetensors only. Both are refused up front with :class:`SpecError`
(exit 2) naming the file, instead of a traceback from deep inside transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from npu_lora.api.load import SpecError

#: JSON files of a model or tokenizer directory that can ask for custom code (``auto_map``)
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json")
#: weight files in a pickle format (``torch.load``)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_MAX_CONFIG = 16 << 20  # bytes


def check_no_custom_code(path: Path, field: str) -> None:
    """SpecError naming the file when a config in ``path`` asks for custom code."""
    for name in CODE_CONFIGS:
        f = path / name
        if not f.is_file():
            continue
        try:
            if f.stat().st_size > _MAX_CONFIG:
                raise SpecError(f"{field}: {f}: larger than {_MAX_CONFIG >> 20} MiB")
            doc = json.loads(f.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise SpecError(f"{field}: {f}: not UTF-8 JSON") from None
        except ValueError as e:
            raise SpecError(f"{field}: {f}: not valid JSON ({e})") from None
        except OSError as e:
            raise SpecError(f"{field}: {f}: cannot read it: {e.strerror or e}") from None
        if isinstance(doc, dict) and "auto_map" in doc:
            raise SpecError(
                f"{field}: {f} names custom code (auto_map): a model directory's own Python is "
                "never run; use a model whose architecture transformers ships (e.g. "
                "model_type qwen3_moe) without auto_map"
            )


INDEX = "model.safetensors.index.json"


def check_shard_names(path: Path, field: str) -> None:
    """SpecError when ``path``'s safetensors index names a shard outside the directory
    (``weight_map`` values are joined to it: ``../other/x.safetensors`` or an absolute name would
    read another model, another namespace's included)."""
    f = path / INDEX
    if not f.is_file():
        return
    try:
        if f.stat().st_size > _MAX_CONFIG:
            raise SpecError(f"{field}: {f}: larger than {_MAX_CONFIG >> 20} MiB")
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SpecError(f"{field}: {f}: not valid JSON ({e})") from None
    except OSError as e:
        raise SpecError(f"{field}: {f}: cannot read it: {e.strerror or e}") from None
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    names = list(wm.values()) if isinstance(wm, dict) else None
    if names is None or not all(
        isinstance(n, str) and n not in ("", ".", "..") and not any(c in n for c in "/\\\x00")
        for n in names
    ):
        raise SpecError(
            f"{field}: {f}: weight_map must name shard files inside {path} (plain names, no '/' "
            "or '..'): not read"
        )


def pickle_weights(path: Path) -> list[Path]:
    """The pickle weight files directly in ``path`` (sorted)."""
    return sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())


def check_model_dir(path: Path, field: str) -> None:
    """``path`` may be loaded as a model: no custom code, and when it holds weights, some are
    safetensors (a directory with only pickle weights is refused naming one)."""
    check_no_custom_code(path, field)
    check_shard_names(path, field)
    if any(path.glob("*.safetensors")):
        return
    pickled = pickle_weights(path)
    if pickled:
        raise SpecError(
            f"{field}: {pickled[0]} is a pickle weight file (which can run code when read) and "
            f"{path} has no *.safetensors weights: only safetensors are loaded (convert with "
            "transformers: save_pretrained(..., safe_serialization=True))"
        )


def check_inside(path: Path, root: Path, field: str) -> None:
    """SpecError when ``path`` (after ``..`` and symbolic links) is not inside ``root``: a path
    relative to a volume stays on that volume. Checked before anything in it is opened."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
        raise SpecError(
            f"{field}: {path} is outside its volume {root} (not read; symbolic links and '..' "
            "may not leave it)"
        )
