"""Where a command may write (torch-free): checks made before any work, SpecError (exit 2)
naming the flag, the path and why.

- a file output (``predict --out``, ``rngd-check --json``) must not be an existing directory
  (nor below a regular file), nor one of a run directory's own files (``config.yaml``,
  ``metrics.jsonl``, ``run.json``, ...) or a file inside its ``checkpoint``/``adapter`` trees;
- a directory output (``bench --out``, ``bench --roofline``) must not be an existing file;
- a directory that is *replaced* (``export --merged DIR --force``) must be a previous export:
  it holds the marker file :data:`EXPORT_MARKER` that the export wrote, listing its files, and
  nothing else. ``/``, ``$HOME``, a run directory, an ancestor of one (or of the run being
  exported) are never replaced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from npu_lora.api.load import SpecError

#: written into every ``npu-lora export --merged`` directory: ``{"kind", "files": [...]}``
EXPORT_MARKER = "npu_lora_export.json"
EXPORT_KIND = "npu-lora-export"
#: a file that makes a directory a run directory (npu_lora.train.identity's markers)
RUN_MARKERS = ("run.json", "config.yaml", "metrics.jsonl", "checkpoint")
_SCAN_DEPTH = 4
#: a run directory's own files, never overwritten by another command
RUN_OWN_FILES = (
    "run.json",
    "config.yaml",
    "metrics.jsonl",
    "summary.json",
    "eval.jsonl",
    "step_times.png",
    ".lock",
)
_RUN_TREES = ("checkpoint", "adapter")


def _is_run_dir(d: Path) -> bool:
    return (d / "run.json").is_file() or (
        (d / "config.yaml").is_file() and (d / "metrics.jsonl").exists()
    )


def _below_a_file(path: Path) -> Path | None:
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def check_out_file(path: Path, flag: str) -> None:
    """``path`` can be written as a file: not an existing directory, no parent a file."""
    if path.is_dir():
        raise SpecError(
            f"{flag}: {path} is a directory; a file path is expected (e.g. {path / 'out.jsonl'})"
        )
    blocker = _below_a_file(path)
    if blocker is not None:
        raise SpecError(f"{flag}: {blocker} is a file, so {path} cannot be created")
    real = _resolved(path)
    if path.name in RUN_OWN_FILES and _is_run_dir(real.parent):
        raise SpecError(
            f"{flag}: {path} is a file of the run directory {path.parent}; a run's own files "
            "are never overwritten (write elsewhere, e.g. its predictions/ directory)"
        )
    for d in real.parents:
        if d.name.startswith(_RUN_TREES) and _is_run_dir(d.parent):
            raise SpecError(
                f"{flag}: {path} is inside {d.name}/ of the run directory {d.parent}; never "
                "written by another command"
            )


def check_out_dir(path: Path, flag: str) -> None:
    """``path`` can be used as an output directory: not an existing file, no parent a file."""
    if path.exists() and not path.is_dir():
        raise SpecError(f"{flag}: {path} exists and is not a directory; a directory is expected")
    blocker = _below_a_file(path)
    if blocker is not None:
        raise SpecError(f"{flag}: {blocker} is a file, so {path} cannot be created")


def _resolved(p: Path) -> Path:
    try:
        return p.expanduser().resolve()
    except OSError:
        return Path(os.path.abspath(p.expanduser()))


def _run_dir_below(path: Path) -> Path | None:
    """A run directory at or below ``path`` (up to four levels; symlinks not followed)."""
    stack = [(path, 0)]
    seen = 0
    while stack:
        d, depth = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        names = {e.name for e in entries}
        if "run.json" in names or ({"config.yaml", "metrics.jsonl"} <= names):
            return d
        for e in entries:
            seen += 1
            if seen > 20_000:
                return None
            if depth < _SCAN_DEPTH and e.is_dir(follow_symlinks=False):
                stack.append((Path(e.path), depth + 1))
    return None


def check_replaceable(out: Path, flag: str, force: bool, protected: Path | None = None) -> None:
    """``out`` may be (re)written as a whole directory. See the module doc."""
    if out.exists() and not out.is_dir():
        raise SpecError(f"{flag}: {out} exists and is not a directory")
    blocker = _below_a_file(out)
    if blocker is not None:
        raise SpecError(f"{flag}: {blocker} is a file, so {out} cannot be created")
    real = _resolved(out)
    if real == real.parent:
        raise SpecError(f"{flag}: {out} is the filesystem root; never replaced")
    if real == _resolved(Path.home()) or str(out) == "~":
        raise SpecError(f"{flag}: {out} is the home directory ($HOME); never replaced")
    if protected is not None:
        prot = _resolved(protected)
        if real == prot:
            raise SpecError(f"{flag}: {out} is the run directory being exported; never replaced")
        if real in prot.parents:
            raise SpecError(
                f"{flag}: {out} is an ancestor of the run directory {protected}; never replaced"
            )
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise SpecError(f"{flag}: {out} is not empty (use --force to replace a previous export)")
    run = _run_dir_below(out)
    if run is not None:
        what = "is a run directory" if run == out else f"contains the run directory {run}"
        raise SpecError(f"{flag}: {out} {what}; --force never replaces a run's files")
    marker = out / EXPORT_MARKER
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        doc = None
    files = doc.get("files") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("kind") != EXPORT_KIND
        or not isinstance(files, list)
        or not all(isinstance(f, str) for f in files)
    ):
        raise SpecError(
            f"{flag}: {out} is not empty and was not written by `npu-lora export` (no "
            f"{EXPORT_MARKER} listing its files); --force replaces only a previous export"
        )
    listed = set(files) | {EXPORT_MARKER}
    others = sorted(
        e.name
        for e in os.scandir(out)
        if e.name not in listed or not e.is_file(follow_symlinks=False)
    )
    if others:
        shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        raise SpecError(
            f"{flag}: {out} holds files a previous export did not write ({shown}); --force "
            "replaces only a previous export: move them away first"
        )


def write_export_marker(directory: Path, **info: str) -> None:
    """Record ``directory``'s files as an export's (call when every file is written)."""
    files = sorted(p.name for p in directory.iterdir() if p.name != EXPORT_MARKER)
    doc = {"kind": EXPORT_KIND, "files": files, **info}
    (directory / EXPORT_MARKER).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
