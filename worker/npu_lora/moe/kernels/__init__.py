"""Build and load the streaming experts C++ extension (``stream*.cpp``), or report why not.

The extension is built once per cache key with ``torch.utils.cpp_extension`` (ninja, g++ -O3)
into ``$NPU_LORA_KERNEL_CACHE/kernels`` (default ``$XDG_CACHE_HOME/npu-lora``, else
``~/.cache/npu-lora``): by the worker image at image build time, by ``npu-lora kernels build``
for a venv, else on first use (logged, with how long it usually takes). The cache key
(:func:`key_parts`) holds everything the build depends on: torch's version, git commit, C++ ABI
and debug flag; the Python ABI (``SOABI``); the sources, headers and flags; the machine
architecture and the instruction-set instances compiled in; the compiler (``$CXX`` or ``c++``:
its resolved file name and version). The CPU's own instruction sets are deliberately *not* in the
key: the build is the same on every x86-64 CPU (see below), so an image built on one machine runs
its kernel on another. Building, locking and publishing: :mod:`npu_lora.moe.kernels.cache` (a
build whose lock is held by a live process for longer than ``NPU_LORA_KERNEL_LOCK_TIMEOUT``
seconds, default 600, falls back to the torch path with a log line; a dead owner's lock is taken
over; nothing ever waits forever).

The extension holds four instances of
the micro-kernels, each compiled for one instruction set with ``#pragma GCC target``
(AMX tiles, AVX-512 + AVX512-BF16 with native bf16 dot products, AVX-512, AVX2+FMA,
baseline); the one used is chosen at run time from what the CPU supports (the
extension's ``cpu_isas``), so one build runs on every x86-64 CPU and the slower paths can be tested
on a fast CPU. ``-march=native`` is deliberately not used: it would let the compiler put AVX-512
into the baseline and AVX2 instances.

``NPU_LORA_STREAM_EXT=0`` disables the extension (the kernel then uses its pure-torch fallback);
``NPU_LORA_STREAM_ISA=base|avx2|avx512|avx512bf16|amx`` forces a path (must be one the CPU runs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from npu_lora import machine
from npu_lora.moe.kernels.cache import (
    LockTimeout,
    Owner,
    ensure_built,
    read_meta,
    usual_build_seconds,
)

log = logging.getLogger(__name__)

_SRC_DIR = Path(__file__).parent
SOURCES = (
    "stream.cpp",
    "stream_amx.cpp",
    "stream_avx512bf16.cpp",
    "stream_avx512.cpp",
    "stream_avx2.cpp",
    "stream_base.cpp",
    "stream_q8.cpp",
    "stream_q8_avx512.cpp",
    "stream_q8_avx512bf16.cpp",
    "stream_q8_avx2.cpp",
    "stream_q8_base.cpp",
)
HEADERS = (
    "stream_isa.h",
    "stream_core.h",
    "stream_avx512_v.h",
    "stream_q8_isa.h",
    "stream_tiles.h",
    "stream_silu512.h",
)
ISA_CODES = {"base": 0, "avx2": 1, "avx512": 2, "avx512bf16": 3, "amx": 4}
#: ISAs whose bf16 path widens the weights and runs the fp32 tiles (avx512bf16 and amx compute
#: natively)
WIDENING_ISAS = ("base", "avx2", "avx512")
#: ISAs that compute bf16 natively: ``vdpbf16ps`` (AVX512-BF16) or AMX tiles (``tdpbf16ps``)
NATIVE_ISAS = ("avx512bf16", "amx")
_NATIVE_HOW = {
    "avx512bf16": "vdpbf16ps, fp32 accumulation",
    "amx": "AMX tiles, tdpbf16ps, fp32 accumulation",
}


def native_how(isa: str | None) -> str | None:
    """How ``isa`` computes bf16 natively (``None``: it widens bf16 to fp32, or no extension)."""
    return _NATIVE_HOW.get(isa or "")


#: Compiler and linker flags (part of the cache key).
CFLAGS = ("-O3", "-fno-math-errno", "-fopenmp")
LDFLAGS = ("-fopenmp",)
#: Measured build: 35 s wall, 41 s CPU on a quiet 2-core AMD EPYC Zen 4 (g++ 12.2, torch 2.13
#: CPU); 3.4 min seen on a loaded 2-core VM. Used in the log lines until this cache has its own.
TYPICAL_BUILD_S = 40.0
#: How long a run waits for another process's build before it uses the torch path
#: (``NPU_LORA_KERNEL_LOCK_TIMEOUT``, seconds): well over the slowest build seen.
DEFAULT_LOCK_TIMEOUT_S = 600.0
PREFIX = "npu_lora_stream"

_lock = threading.Lock()
_state: dict[str, Any] = {}


def cache_dir() -> Path:
    return machine.kernel_cache_root() / "kernels"


def lock_timeout() -> float:
    """``NPU_LORA_KERNEL_LOCK_TIMEOUT`` (seconds), else :data:`DEFAULT_LOCK_TIMEOUT_S`."""
    text = os.environ.get("NPU_LORA_KERNEL_LOCK_TIMEOUT")
    if not text:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"NPU_LORA_KERNEL_LOCK_TIMEOUT: expected seconds, got {text!r}") from None
    return max(value, 0.0)


def _source_digest() -> str:
    h = hashlib.sha256(" ".join((*CFLAGS, *LDFLAGS)).encode())
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode() + b"\0" + (_SRC_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def compiler_id(root: Path | None = None) -> str:
    """``"<resolved file name> <version>"`` of ``$CXX`` (else ``c++``), ``"none"`` without one.

    The version is asked of the compiler once per compiler file (path, size, mtime) and kept in
    ``<cache>/compilers.json``, so a run whose kernel is built (an image's) never runs it."""
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        return "none"
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return "none"
    sig = f"{real}:{st.st_size}:{st.st_mtime_ns}"
    known_file = (root or cache_dir()) / "compilers.json"
    try:
        known = json.loads(known_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(sig), str):
        return known[sig]
    try:
        out = subprocess.run(
            [real, "-dumpfullversion", "-dumpversion"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{os.path.basename(real)} unknown"
    ident = f"{os.path.basename(real)} {out}"
    try:  # best effort (a read-only cache: asked again next time)
        known_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = known_file.with_name(f".compilers.{os.getpid()}.json")
        tmp.write_text(json.dumps({**known, sig: ident}, indent=1), encoding="utf-8")
        os.replace(tmp, known_file)
    except OSError:
        pass
    return ident


def key_parts() -> dict[str, str]:
    """Everything the build depends on (the cache key is their digest)."""
    import torch

    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False)))
    return {
        "torch": f"{torch.__version__} git {torch.version.git_version} cxx11abi {abi} "
        f"debug {int(bool(torch.version.debug))}",
        "python": sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag or "",
        "source": _source_digest(),
        "arch": f"{platform.machine()} isas {','.join(ISA_CODES)}",
        "compiler": compiler_id(),
    }


def key_name(parts: dict[str, str]) -> str:
    blob = json.dumps(parts, sort_keys=True).encode()
    return f"{PREFIX}_{hashlib.sha256(blob).hexdigest()[:16]}"


def _published_without_compiler(root: Path, parts: dict[str, str]) -> Path | None:
    """Without a compiler: a build of the same key but any compiler (an image's)."""
    others = {k: v for k, v in parts.items() if k != "compiler"}
    for d in sorted(root.glob(f"{PREFIX}_*")):
        meta = read_meta(d) if d.is_dir() else None
        got = (meta or {}).get("key") or {}
        if not isinstance(got, dict):  # a kernel.json edited or planted by hand: not ours
            continue
        if {k: v for k, v in got.items() if k != "compiler"} == others:
            return d
    return None


def status() -> dict[str, Any]:
    """The cache key, its parts, and whether/where it is built (for ``npu-lora kernels status``)."""
    root = cache_dir()
    parts = key_parts()
    name = key_name(parts)
    published = root / name
    if not (published / "kernel.json").is_file() and parts["compiler"] == "none":
        published = _published_without_compiler(root, parts) or published
    meta = read_meta(published)
    lock = root / f"{name}.lock"
    owner = None
    if lock.is_file():
        from npu_lora.moe.kernels.cache import BuildLock

        o = BuildLock(lock).owner()
        owner = o.describe() if o and o.alive() is not False else None
    return {
        "cache": str(root),
        "key": name,
        "parts": parts,
        "state": "built" if meta else ("building" if owner else "not built"),
        "path": str(published) if meta else None,
        "build_seconds": (meta or {}).get("build_seconds"),
        "built_at": (meta or {}).get("built_at"),
        "lock_owner": owner,
        "disabled": os.environ.get("NPU_LORA_STREAM_EXT", "1") == "0",
    }


def _import(directory: Path, library: str) -> ModuleType:
    from npu_lora.moe.kernels.cache import verify_library

    verify_library(directory, library)  # UntrustedKernel (ImportError): the torch fallback
    name = library.split(".", 1)[0]
    spec = importlib.util.spec_from_file_location(name, directory / library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the kernel library {directory / library}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(*, timeout: float | None = None) -> tuple[ModuleType, Path, bool]:
    """``(module, published directory, built now)``: the extension for this venv, built if the
    cache lacks it. Raises :class:`LockTimeout`, or the build's own error."""
    root = cache_dir()
    parts = key_parts()
    name = key_name(parts)
    if parts["compiler"] == "none" and not (root / name / "kernel.json").is_file():
        other = _published_without_compiler(root, parts)
        if other is not None:
            meta = read_meta(other) or {}
            return _import(other, str(meta.get("library"))), other, False
    usual = usual_build_seconds(root, TYPICAL_BUILD_S)
    wait_s = lock_timeout() if timeout is None else timeout
    built_mod: list[ModuleType] = []

    def compile_into(directory: Path) -> str:
        from torch.utils.cpp_extension import load as cpp_load

        mod = cpp_load(
            name=name,
            sources=[str(_SRC_DIR / s) for s in SOURCES],
            # -fopenmp: at::parallel_for is inline OpenMP code in torch's headers;
            # without the flag it silently runs on one thread. The library resolves to
            # the libgomp torch has loaded (same soname), so there is one thread pool.
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(directory),
            verbose=False,
        )
        built_mod.append(mod)
        return Path(str(mod.__file__)).name

    def on_wait(owner: Owner | None) -> None:
        who = owner.describe() if owner else "another process"
        log.warning(
            "waiting for the host kernel build by %s (lock %s/%s.lock; a build takes ~%.0f s "
            "here); using the torch path if it is not done within %.0f s",
            who,
            root,
            name,
            usual,
            wait_s,
        )

    def on_build() -> None:
        log.warning(
            "building the %s host kernel for this torch/compiler (cache key %s) into %s: "
            "usually ~%.0f s, a few minutes on a loaded 2-core machine; once per venv or image "
            "(`npu-lora kernels build` does it ahead of time)",
            PREFIX,
            name,
            root,
            usual,
        )

    published, built = ensure_built(
        root,
        name,
        compile_into,
        meta={"key": parts},
        timeout=wait_s,
        on_wait=on_wait,
        on_build=on_build,
    )
    if built and built_mod:
        meta = read_meta(published) or {}
        log.warning("built the host kernel in %s s: %s", meta.get("build_seconds"), published)
        return built_mod[0], published, True
    meta = read_meta(published) or {}
    return _import(published, str(meta.get("library"))), published, False


def _why(exc: BaseException) -> str:
    """The build error's lines that say what failed (``error:``), then its tail."""
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()][:5]
    tail = text[-300:]
    return f"{type(exc).__name__}: " + " | ".join(lines + ([] if tail in lines else [tail]))


def load() -> Any | None:
    """The compiled extension module, or ``None`` (disabled, the build failed, or another
    process's build held the lock past the timeout; logged once)."""
    with _lock:
        if "mod" in _state:
            return _state["mod"]
        mod = None
        if os.environ.get("NPU_LORA_STREAM_EXT", "1") == "0":
            _state["error"] = "disabled by NPU_LORA_STREAM_EXT=0"
        else:
            try:
                mod = build()[0]
            except LockTimeout as exc:
                _state["error"] = f"{exc}: longer than a build takes"
                log.warning(
                    "npu_lora_stream extension: %s; using the torch fallback "
                    "(NPU_LORA_KERNEL_LOCK_TIMEOUT sets the wait; `npu-lora kernels status` "
                    "shows the lock's owner)",
                    _state["error"],
                )
            except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as exc:
                # a failed build or load (no compiler, no Python headers, ...): the fallback
                _state["error"] = _why(exc)
                log.warning(
                    "npu_lora_stream extension unavailable, using the torch fallback: %s",
                    _state["error"],
                )
        _state["mod"] = mod
        return mod


def error() -> str | None:
    """Why :func:`load` returned ``None`` (after it was called)."""
    return _state.get("error")


def isa() -> str | None:
    """The instruction-set path the kernel uses on this CPU (``None`` without the extension)."""
    if load() is None:
        return None
    runs = cpu_isas()
    forced = os.environ.get("NPU_LORA_STREAM_ISA")
    if forced:
        if forced not in ISA_CODES or forced not in runs:
            raise ValueError(
                f"NPU_LORA_STREAM_ISA={forced!r}: this CPU runs {runs} (allowed: {list(ISA_CODES)})"
            )
        return forced
    return runs[-1]


def cpu_isas() -> list[str]:
    """The paths this CPU runs, slowest first (asked of the extension once: it also requests the
    AMX tile state; :func:`isa` runs on every experts call)."""
    if "isas" not in _state:
        mod = load()
        _state["isas"] = list(mod.cpu_isas()) if mod is not None else []
    return list(_state["isas"])
