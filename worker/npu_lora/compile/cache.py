"""The graph cache: one directory per content key, published atomically. Torch-free.

Layout (``ROOT`` = :func:`cache_root`)::

    ROOT/v1/<key[:2]>/<key>/entry.json        the graph's plan entry + how it was compiled
    ROOT/v1/<key[:2]>/<key>/inductor/         cpu/cuda: inductor's on-disk cache of this graph
    ROOT/v1/<key[:2]>/.<key>.tmp-<pid>-<hex>/ a compile in progress (never counted as present)

Publish (:func:`publish`): the compile writes into its own temporary directory (a sibling of
the final one, so on the same filesystem), ``entry.json`` last (fsynced), then one ``rename``
makes it the entry. A killed compile leaves only a temporary directory, which :func:`present`
never counts and :func:`sweep` removes; two compiles of one key each write their own temporary
directory, the first rename wins and the second finds the entry there and discards its own.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npu_lora.api import backends as registry
from npu_lora.api.fsutil import fsync_dir as _fsync_dir
from npu_lora.api.timefmt import rfc3339

LAYOUT = "v1"
ENTRY = "entry.json"
#: the cache root when set (local runs, precompile pods)
ENV_ROOT = "NPU_LORA_COMPILE_CACHE"
#: the graph cache's folder inside the compile cache volume
GRAPH_DIR = "npu-lora"


def cache_root(spec: Any = None) -> Path | None:
    """``$NPU_LORA_COMPILE_CACHE``; else, when ``spec.device.compileCache`` is set (the operator
    mounts it at ``$XDG_CACHE_HOME/<folder>``, the backend's registry ``cache_folder``:
    ``furiosa`` for RNGD), ``$XDG_CACHE_HOME/<folder>/npu-lora``; else None."""
    env = os.environ.get(ENV_ROOT)
    if env:
        return Path(env).expanduser()
    if spec is not None and getattr(spec.device, "compile_cache", None) is not None:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = registry.resolve(spec.device.backend, spec.device.cards).cache_dir
        return Path(xdg) / folder / GRAPH_DIR
    return None


def entry_dir(root: Path, key: str) -> Path:
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"not a graph key: {key!r}")
    return Path(root) / LAYOUT / key[:2] / key


def present(root: Path, key: str) -> bool:
    """The entry is published (its ``entry.json`` exists; a temporary directory never counts)."""
    return (entry_dir(root, key) / ENTRY).is_file()


def read_entry(root: Path, key: str) -> dict[str, Any] | None:
    try:
        return json.loads((entry_dir(root, key) / ENTRY).read_text())
    except (OSError, ValueError):
        return None


def _write_json_synced(path: Path, doc: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def publish(
    root: Path, key: str, build: Callable[[Path], dict[str, Any]], *, keep_temp: bool = False
) -> tuple[str, dict[str, Any] | None]:
    """Compile into a temporary directory with ``build(tmp) -> entry doc`` and publish it.

    Returns ``("hit", entry)`` when the key was already present (nothing built), ``("published",
    entry)``, or ``("lost", entry)`` when another compile of the same key published first (ours is
    discarded). ``build`` raising leaves nothing behind (the temporary directory is removed)."""
    final = entry_dir(root, key)
    if present(root, key):
        return "hit", read_entry(root, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{key}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        doc = dict(build(tmp))
        doc.setdefault("key", key)
        doc.setdefault("published_at", rfc3339())
        _write_json_synced(tmp / ENTRY, doc)
        try:
            os.rename(tmp, final)  # atomic; fails when ``final`` exists and is not empty
        except OSError:
            if present(root, key):
                shutil.rmtree(tmp, ignore_errors=True)
                return "lost", read_entry(root, key)
            if final.exists():  # an empty or broken directory in the way (not an entry)
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
            else:
                raise
        _fsync_dir(final.parent)
        return "published", doc
    except BaseException:
        if not keep_temp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def temporaries(root: Path) -> list[Path]:
    """Temporary directories of compiles in progress or killed."""
    base = Path(root) / LAYOUT
    if not base.is_dir():
        return []
    return sorted(p for p in base.glob("*/.*.tmp-*") if p.is_dir())


def sweep(root: Path, older_than_s: float = 6 * 3600.0) -> list[Path]:
    """Remove temporary directories older than ``older_than_s`` (killed compiles)."""
    now, gone = time.time(), []
    for p in temporaries(root):
        try:
            if now - p.stat().st_mtime >= older_than_s:
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
        except OSError:
            pass
    return gone


def lookup(root: Path, keys: list[str]) -> dict[str, bool]:
    """``{key: present}`` for every key."""
    return {k: present(root, k) for k in keys}
