"""``npu-lora kernels``: build the host experts kernel for this venv ahead of time, or show its
cache state.

``npu-lora kernels build`` builds (or finds) the ``npu_lora_stream`` C++ extension under the
cache key of this venv's torch, Python, compiler and sources, and prints where and how long; it
exits 1 with the compiler's whole error when the build fails (the worker image runs it at image
build time, so a missing header fails the image, not every pod). ``npu-lora kernels status``
prints the cache key, its parts and whether it is built (``--json`` for a script). Building,
caching and locking: :mod:`npu_lora.moe.kernels` and ``docs/kernels.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build the host kernel for this venv (if not in the cache)")
    b.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for another process's build of the same key "
        "(default: NPU_LORA_KERNEL_LOCK_TIMEOUT, else 600)",
    )
    s = sub.add_parser("status", help="show the cache key, its parts and the build state")
    s.add_argument("--json", action="store_true", help="print the state as JSON")


def _status(as_json: bool) -> int:
    from npu_lora.moe import kernels

    st = kernels.status()
    if as_json:
        print(json.dumps(st, indent=1))
        return 0
    print(f"cache:  {st['cache']}")
    print(f"key:    {st['key']}")
    for k, v in st["parts"].items():
        print(f"  {k:<9}{v}")
    line = st["state"]
    if st["path"]:
        line += f" ({st['path']}; build took {st['build_seconds']} s, {st['built_at']})"
    if st["lock_owner"]:
        line += f" (lock held by {st['lock_owner']})"
    if st["disabled"]:
        line += " (disabled by NPU_LORA_STREAM_EXT=0)"
    print(f"state:  {line}")
    return 0


def _build(timeout: float | None) -> int:
    from npu_lora.commands.common import EXIT_ERROR, CommandError
    from npu_lora.moe import kernels
    from npu_lora.moe.kernels.cache import LockTimeout

    t0 = time.monotonic()
    try:
        mod, path, built = kernels.build(timeout=timeout)
    except LockTimeout as exc:
        raise CommandError(str(exc), EXIT_ERROR) from exc
    except (RuntimeError, OSError, ImportError) as exc:
        raise CommandError(f"the build failed:\n{exc}", EXIT_ERROR) from exc
    meta: dict[str, Any] = kernels.read_meta(path) or {}
    isas = ",".join(mod.cpu_isas())
    if built:
        print(f"built {path} in {meta.get('build_seconds')} s (this CPU runs: {isas})")
    else:
        print(
            f"already built: {path} (built in {meta.get('build_seconds')} s at "
            f"{meta.get('built_at')}; found in {time.monotonic() - t0:.1f} s; this CPU runs: "
            f"{isas})"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.action == "status":
        return _status(args.json)
    return _build(args.timeout)
