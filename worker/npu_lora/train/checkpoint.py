"""Atomic checkpoints: ``checkpoint/`` in the run directory.

Contents (``FORMAT`` 2: nothing is pickled; every ``X`` is ``X.safetensors`` holding the
tensors and ``X.json`` holding the structure around them, see :func:`save_tree`)::

    params         {"names": [...], "tensors": [...]}: engine.adapter.parameters() in order
                   (LoRA weights, + the expert weights when lora.trainExperts)
    optimizer      AdamW state_dict
    rng            torch / python (/ cuda) RNG states
    routing        engine.hotset.routing_counts() ([L, E] int64) when available
    hot.json       engine.hot_state() (null before the hot set is chosen)
    state.json     {"format", "step", "time", "scheduler", ...}: written last; a directory
                   without it is incomplete

A checkpoint of format 1 (``*.pt``, written with ``torch.save``: pickle, which can run code when
read) is never read: :func:`find_checkpoint` raises :class:`PickleCheckpointError` naming the file.

Writing: everything goes to ``checkpoint.tmp-<pid>/`` (each file fsynced), then the previous
checkpoint is renamed to ``checkpoint.old-<pid>``, the new one renamed to ``checkpoint``, the
parent directory fsynced and the old one deleted. At any instant a complete checkpoint exists
(``checkpoint/``, or ``checkpoint.old-*`` if the process died between the two renames);
:func:`find_checkpoint` picks the newest complete one. A write that fails (disk full, quota,
read-only) removes its temporary directory and raises :class:`CheckpointWriteError` naming the
path; the previous checkpoint is untouched. ``state.json`` carries the run's identity (``run``:
the run directory's ``run.json``, see :mod:`npu_lora.train.identity`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

from npu_lora.api.fsutil import fsync_dir
from npu_lora.api.load import SpecError
from npu_lora.api.timefmt import rfc3339

FORMAT = 2
NAME = "checkpoint"
#: the files a format-1 (pickle) checkpoint holds
PICKLE_FILES = ("params.pt", "optimizer.pt", "rng.pt", "routing.pt")
#: the tree files' own format (``X.json``'s ``format``)
TREE_FORMAT = "npu-lora-tree/1"
_MAX_TREE_JSON = 64 << 20  # bytes: an optimizer's structure is a few KB per parameter


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed; ``str()`` names the path and the cause."""

    def __init__(self, errno_: int | None, strerror: str | None, filename: str, message: str):
        super().__init__(errno_, strerror, filename)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _run_identity(run_dir: Path) -> dict[str, Any] | None:
    try:
        d = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


@contextlib.contextmanager
def _named(path: Path):
    """Give an OSError raised while writing ``path`` (``write``/``fsync``: none) its file name."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


class PickleCheckpointError(SpecError):
    """A checkpoint in a pickle format (exit 2); ``str()`` names the file."""


class CheckpointReadError(SpecError):
    """A checkpoint file that is not what :func:`save_tree` writes; ``str()`` names it."""


def _encode(obj: Any, tensors: dict[str, Any], where: str) -> Any:
    """JSON for ``obj``; tensors go to ``tensors`` under a generated key. Only None, bool,
    int, float, str, list, tuple, dict (str/int keys) and tensors: anything else is an error,
    so what is read back is data, never an object with behaviour."""
    import torch

    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors):06d}"
        tensors[key] = obj.detach().to("cpu", copy=True).contiguous()
        return {"$tensor": key}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"{where}: key {k!r} is neither a string nor an integer")
            items.append([k, _encode(v, tensors, f"{where}.{k}")])
        return {"$dict": items}
    raise TypeError(f"{where}: {type(obj).__name__} cannot be stored in a checkpoint")


def _decode(obj: Any, tensors: dict[str, Any], where: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [_decode(v, tensors, where) for v in obj]
    if isinstance(obj, dict) and len(obj) == 1:
        ((tag, val),) = obj.items()
        if tag == "$tensor" and isinstance(val, str) and val in tensors:
            return tensors[val]
        if tag == "$tuple" and isinstance(val, list):
            return tuple(_decode(v, tensors, where) for v in val)
        if tag == "$dict" and isinstance(val, list):
            out: dict[Any, Any] = {}
            for kv in val:
                if (
                    not isinstance(kv, list)
                    or len(kv) != 2
                    or not isinstance(kv[0], (str, int))
                    or isinstance(kv[0], bool)
                ):
                    raise CheckpointReadError(f"{where}: a malformed mapping entry")
                out[kv[0]] = _decode(kv[1], tensors, where)
            return out
    raise CheckpointReadError(f"{where}: an unexpected value (not written by npu-lora)")


def save_tree(obj: Any, path: Path) -> None:
    """Write ``obj`` (nested dicts/lists/tuples of scalars, strings and tensors) as
    ``path.safetensors`` (the tensors) + ``path.json`` (the structure), each fsynced."""
    import re

    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    tree = _encode(obj, tensors, path.name)
    st = path.with_name(path.name + ".safetensors")
    with _named(st):
        try:
            save_file(tensors, str(st), metadata={"format": TREE_FORMAT})
        except SafetensorError as e:  # its I/O errors (disk full, quota) as an OSError
            m = re.search(r"os error (\d+)", str(e))
            code = int(m.group(1)) if m else errno.EIO
            raise OSError(code, os.strerror(code), str(st)) from e
        fd = os.open(st, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _write_json({"format": TREE_FORMAT, "tree": tree}, path.with_name(path.name + ".json"))


def load_tree(path: Path) -> Any:
    """What :func:`save_tree` wrote at ``path``; tensors on the CPU. Never unpickles."""
    import stat

    from safetensors import SafetensorError
    from safetensors.torch import load_file

    js = path.with_name(path.name + ".json")
    st = path.with_name(path.name + ".safetensors")
    for f in (js, st):
        try:
            mode = os.lstat(f).st_mode
        except OSError as e:
            raise CheckpointReadError(
                f"{f}: cannot read the checkpoint file: {e.strerror}"
            ) from None
        if not stat.S_ISREG(mode):
            raise CheckpointReadError(f"{f}: not a regular file (a link?): not read")
    try:
        if js.stat().st_size > _MAX_TREE_JSON:
            raise CheckpointReadError(f"{js}: larger than {_MAX_TREE_JSON >> 20} MiB")
        doc = json.loads(js.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, CheckpointReadError):
            raise
        raise CheckpointReadError(f"{js}: cannot read the checkpoint file: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != TREE_FORMAT or "tree" not in doc:
        raise CheckpointReadError(f"{js}: not a checkpoint file of format {TREE_FORMAT}")
    try:
        tensors = load_file(str(st), device="cpu")
    except (OSError, SafetensorError, ValueError) as e:
        raise CheckpointReadError(f"{st}: cannot read the checkpoint tensors: {e}") from None
    try:
        return _decode(doc["tree"], tensors, str(js))
    except RecursionError:
        raise CheckpointReadError(f"{js}: nested too deeply (not written by npu-lora)") from None


def pickle_files(ckpt: Path) -> list[Path]:
    """The format-1 (pickle) files in a checkpoint directory."""
    return [ckpt / n for n in PICKLE_FILES if (ckpt / n).exists()]


def _write_json(obj: Any, path: Path) -> None:
    with _named(path), open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def param_names(engine: Any, params: list[Any]) -> list[str]:
    by_id = (
        {id(p): n for n, p in engine.model.named_parameters()} if hasattr(engine, "model") else {}
    )
    return [by_id.get(id(p), f"param{i}") for i, p in enumerate(params)]


def _state_of(ckpt: Path) -> dict[str, Any] | None:
    try:
        st = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(st, dict) and st.get("format") == 1 and isinstance(st.get("step"), int):
        bad = pickle_files(ckpt) or [ckpt / "state.json"]
        raise PickleCheckpointError(
            f"{bad[0]}: a checkpoint of format 1 (torch.save pickle, which can run code when "
            f"read) is never loaded; this version reads format {FORMAT} "
            "(safetensors + JSON). Start the run afresh in another output directory, or "
            "delete this checkpoint."
        )
    if (
        not isinstance(st, dict)
        or st.get("format") != FORMAT
        or not isinstance(st.get("step"), int)
    ):
        return None
    return st


def find_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint in ``run_dir`` and its state.json, or None."""
    cands: list[tuple[int, int, Path, dict[str, Any]]] = []
    for prio, pattern in ((1, NAME), (0, f"{NAME}.old-*")):
        for p in sorted(run_dir.glob(pattern)):
            if p.is_symlink():  # planted: it would read (and later replace) another directory
                raise CheckpointReadError(
                    f"{p}: the checkpoint is a symbolic link, not a directory of the run: not "
                    "read (remove the link)"
                )
            st = _state_of(p) if p.is_dir() else None
            if st is not None:
                cands.append((st["step"], prio, p, st))
    if not cands:
        return None
    _step, _, path, st = max(cands, key=lambda c: (c[0], c[1]))
    return path, st


def clean_stale(run_dir: Path) -> None:
    """Remove leftovers of interrupted writes (``checkpoint.tmp-*``; ``checkpoint.old-*`` once
    ``checkpoint/`` is complete; a crash between the renames: promote the old one back)."""
    for p in run_dir.glob(f"{NAME}.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    main = run_dir / NAME
    olds = sorted(run_dir.glob(f"{NAME}.old-*"))
    if not olds:
        return
    if _state_of(main) is None:
        best = find_checkpoint(run_dir)
        if best is not None and best[0] != main:
            if main.exists():
                shutil.rmtree(main, ignore_errors=True)
            os.replace(best[0], main)
            fsync_dir(run_dir)
    for p in run_dir.glob(f"{NAME}.old-*"):
        shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    run_dir: Path,
    step: int,
    engine: Any,
    optimizer: Any,
    *,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically; returns ``run_dir / "checkpoint"``.

    Raises :class:`CheckpointWriteError` (the temporary directory removed, the previous
    checkpoint intact) when the files cannot be written.
    """
    tmp = run_dir / f"{NAME}.tmp-{os.getpid()}"
    try:
        _write_checkpoint_files(tmp, run_dir, step, engine, optimizer, extra)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = _state_of(run_dir / NAME)
        kept = (
            f"the previous checkpoint (step {prev['step']}) in {run_dir / NAME} is intact"
            if prev is not None
            else "no earlier checkpoint exists"
        )
        where = e.filename or tmp
        raise CheckpointWriteError(
            e.errno,
            e.strerror,
            str(where),
            f"cannot write the checkpoint of step {step} to {where}: {e.strerror or e}; {kept}",
        ) from e
    return _publish(tmp, run_dir)


def _write_checkpoint_files(
    tmp: Path, run_dir: Path, step: int, engine: Any, optimizer: Any, extra: dict[str, Any] | None
) -> None:
    import torch

    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    params = list(engine.adapter.parameters())
    save_tree(
        {
            "names": param_names(engine, params),
            "tensors": [p.detach().to("cpu", copy=True) for p in params],
        },
        tmp / "params",
    )
    save_tree(optimizer.state_dict(), tmp / "optimizer")
    save_tree(rng_state(), tmp / "rng")
    routing = None
    with contextlib.suppress(NotImplementedError, AttributeError):
        routing = engine.hotset.routing_counts()
    if isinstance(routing, torch.Tensor):
        save_tree(routing.detach().cpu(), tmp / "routing")
    _write_json(engine.hot_state(), tmp / "hot.json")
    _write_json(
        {
            "format": FORMAT,
            "step": step,
            "time": rfc3339(),
            "num_params": len(params),
            **(extra or {}),
            "run": _run_identity(run_dir),
        },
        tmp / "state.json",
    )
    fsync_dir(tmp)


def _publish(tmp: Path, run_dir: Path) -> Path:
    final = run_dir / NAME
    old = run_dir / f"{NAME}.old-{os.getpid()}"
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(run_dir)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, engine: Any, optimizer: Any) -> dict[str, Any]:
    """Restore parameters, optimizer, RNG, routing counts and hot set; returns state.json.
    SpecError (exit 2) naming the checkpoint for anything that is not what npu-lora wrote."""
    state = _state_of(path)
    if state is None:
        raise SpecError(f"{path}: not a complete checkpoint (state.json missing or invalid)")
    saved = load_tree(path / "params")
    opt_state = load_tree(path / "optimizer")
    rng = load_tree(path / "rng")
    counts = load_tree(path / "routing") if (path / "routing.json").exists() else None
    try:
        _restore(path, engine, optimizer, saved, opt_state, rng, counts)
    except SpecError:
        raise
    except (
        OSError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        RuntimeError,
    ) as e:
        # a checkpoint edited or planted by hand: named, never a traceback
        raise SpecError(
            f"{path}: the checkpoint does not fit this run ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    return state


def _restore(
    path: Path,
    engine: Any,
    optimizer: Any,
    saved: Any,
    opt_state: Any,
    rng: Any,
    counts: Any,
) -> None:
    import torch

    if (
        not isinstance(saved, dict)
        or not isinstance(saved.get("tensors"), list)
        or not isinstance(saved.get("names"), list)
    ):
        raise SpecError(f"{path / 'params.json'}: not a parameter list")
    params = list(engine.adapter.parameters())
    if len(saved["tensors"]) != len(params):
        raise SpecError(
            f"{path}: the checkpoint has {len(saved['tensors'])} trainable tensors, this model "
            f"{len(params)} (was the model, lora or moe config changed?)"
        )
    with torch.no_grad():
        for name, p, t in zip(saved["names"], params, saved["tensors"], strict=True):
            if tuple(p.shape) != tuple(t.shape):
                raise SpecError(
                    f"{path}: {name}: shape {tuple(t.shape)} in the checkpoint, "
                    f"{tuple(p.shape)} in the model"
                )
            p.copy_(t.to(device=p.device, dtype=p.dtype))
    optimizer.load_state_dict(opt_state)
    if isinstance(counts, torch.Tensor):
        # Routing counts matter when the checkpoint predates the hot-set choice: the resumed
        # run must choose the same hot set as an uninterrupted one.
        engine.hotset.load_routing_counts(counts)
    hot = json.loads((path / "hot.json").read_text(encoding="utf-8"))
    if hot is not None:
        engine.load_hot_state(hot)
    set_rng_state(rng)
