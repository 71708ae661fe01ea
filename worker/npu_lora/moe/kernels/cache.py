"""The kernel cache's build protocol: one builder per cache key, atomic publish, no hang.

Torch-free (``fcntl``, ``json``, ``os``): the C++ build itself is the ``build`` callable given to
:func:`ensure_built`.

Layout under ``root`` (``$NPU_LORA_KERNEL_CACHE/kernels``)::

    <name>/                 a published build: never modified, never rebuilt (unless it records no
                            digest: an older npu-lora's build, rebuilt once)
        kernel.json         the cache key's parts, the library file, its ``sha256``, build
                            seconds, when, where
        <library>.so        mode 0755
    <name>.lock             the build lock of key <name> (flock) + its owner record (JSON)
    .build-<name>-<pid>-*   one build attempt's private directory (torch's own ``FileBaton``
                            ``lock`` lives here, so it is never shared with anybody)

Protocol of :func:`ensure_built`:

1. ``<name>/kernel.json`` exists: done (no lock taken).
2. Take ``<name>.lock`` with ``flock(LOCK_EX | LOCK_NB)``, polling. The kernel releases a
   flock when its holder dies (SIGKILL included), so a killed build never leaves a held lock; the
   file stays, with the dead owner's record (pid, host, process start, time), which the next
   taker logs as taken over. While another process holds it, the waiter logs once who holds it
   and for how long it will wait; past ``timeout`` seconds it raises :class:`LockTimeout` (the
   caller falls back to the torch path): never an endless wait.
3. Holding the lock: published meanwhile? done. Else remove the leftovers of killed attempts
   (``.build-<name>-*``: only a holder of this key's lock builds there), build in a fresh
   ``.build-<name>-<pid>-*`` directory, write ``kernel.json`` last, and ``rename`` the directory
   to ``<name>`` (atomic: readers see nothing or a whole build). A failed build removes its
   directory.

Loading (:func:`verify_library`, before the ``.so`` is opened by the dynamic loader): the cache
directory and the published directory must be directories owned by this user or root and not
writable by group or others, the library a regular file with the same rule, and its sha256 the
one ``kernel.json`` recorded at build time. Anything else raises :class:`UntrustedKernel` (an
``ImportError``): the caller logs it and uses the torch path. A cache another user can write is
code that user runs in every run that loads from it; the image's cache (root's, 0755, on a
read-only root filesystem) passes.

Correctness never depends on the lock: builds happen in private directories and publish by
rename, so two builders that both got in (a file system without flock) only waste a build.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from npu_lora.api.timefmt import rfc3339

log = logging.getLogger(__name__)

META = "kernel.json"
#: ``kernel.json``'s key for the library's sha256 (hex)
DIGEST = "sha256"


class UntrustedKernel(ImportError):
    """A published kernel that is not loaded: ``str()`` says which file and why."""


def file_sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _trusted(path: Path, st: os.stat_result, what: str) -> None:
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UntrustedKernel(
            f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {me}) or root: "
            "not loaded"
        )
    if st.st_mode & 0o022:
        raise UntrustedKernel(
            f"{what} {path} is writable by other users (mode {oct(st.st_mode & 0o777)}): not "
            "loaded; `chmod go-w` it, or point NPU_LORA_KERNEL_CACHE at a cache of your own"
        )


def verify_library(published: Path, library: str) -> Path:
    """The library of ``published`` when it may be loaded (see the module doc); raises
    :class:`UntrustedKernel` naming the file and the reason."""
    import stat

    if not library or "/" in library or library in (".", ".."):
        raise UntrustedKernel(f"{published / META}: names no library file (got {library!r})")
    for d, what in ((published.parent, "the kernel cache"), (published, "the kernel build")):
        try:
            st = os.lstat(d)
        except OSError as e:
            raise UntrustedKernel(f"{what} {d}: {e.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UntrustedKernel(f"{what} {d} is not a directory (a link?): not loaded")
        _trusted(d, st, what)
    lib = published / library
    try:
        st = os.lstat(lib)
    except OSError as e:
        raise UntrustedKernel(f"the kernel library {lib}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedKernel(f"the kernel library {lib} is not a regular file: not loaded")
    _trusted(lib, st, "the kernel library")
    want = (read_meta(published) or {}).get(DIGEST)
    if not isinstance(want, str) or not want:
        raise UntrustedKernel(
            f"{published / META} records no sha256 of {library}: not loaded (rebuild with "
            "`npu-lora kernels build`)"
        )
    got = file_sha256(lib)
    if got != want:
        raise UntrustedKernel(
            f"the kernel library {lib} has sha256 {got[:16]}…, not the {want[:16]}… recorded "
            "when it was built: changed after the build, not loaded"
        )
    return lib


def published_ok(final: Path) -> bool:
    """``final`` is a whole published build that records its library's digest."""
    meta = read_meta(final)
    return meta is not None and isinstance(meta.get(DIGEST), str)


@dataclass(frozen=True)
class Owner:
    """Who holds (or last held) a build lock."""

    pid: int
    host: str
    #: the process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22):
    #: tells a reused pid from the owner
    proc_start: int | None
    #: when the lock was taken (epoch seconds)
    since: float

    @classmethod
    def me(cls) -> Owner:
        return cls(os.getpid(), socket.gethostname(), _proc_start(os.getpid()), time.time())

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        try:
            d = json.loads(text)
            return cls(int(d["pid"]), str(d["host"]), d.get("proc_start"), float(d["since"]))
        except (ValueError, KeyError, TypeError):
            return None

    def alive(self) -> bool | None:
        """True/False on this host; None when the owner is on another host (unknowable)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, another user's
            pass
        start = _proc_start(self.pid)
        return not (self.proc_start is not None and start is not None and start != self.proc_start)

    def describe(self) -> str:
        age = time.time() - self.since
        return f"pid {self.pid} on {self.host}, since {age:.0f} s"


def _proc_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class LockTimeout(TimeoutError):
    """The build lock was still held by a live owner after ``timeout`` seconds."""

    def __init__(self, path: Path, waited: float, owner: Owner | None) -> None:
        who = owner.describe() if owner else "an unknown owner"
        super().__init__(f"waited {waited:.0f} s for the kernel build lock {path} ({who})")
        self.path, self.waited, self.owner = path, waited, owner


class BuildLock:
    """An exclusive ``flock`` on ``path`` with an owner record inside (see the module doc)."""

    def __init__(self, path: Path, poll: float = 0.2) -> None:
        self.path = Path(path)
        self.poll = poll
        self._fd: int | None = None

    def owner(self) -> Owner | None:
        try:
            return Owner.parse(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None

    def acquire(
        self, timeout: float, on_wait: Callable[[Owner | None], None] | None = None
    ) -> None:
        """Take the lock, or raise :class:`LockTimeout` after ``timeout`` seconds of waiting."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        t0 = time.monotonic()
        waited = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                except OSError as e:  # no flock here (some network file systems)
                    if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                        raise
                    log.warning(
                        "%s: no flock on this file system (%s); building unlocked", self.path, e
                    )
                    break
                if not waited:
                    waited = True
                    if on_wait is not None:
                        on_wait(self.owner())
                if time.monotonic() - t0 >= timeout:
                    raise LockTimeout(self.path, time.monotonic() - t0, self.owner())
                time.sleep(self.poll)
            previous = self.owner()
            if previous is not None and previous.alive() is False:
                log.info(
                    "taking over the kernel build lock %s left by pid %d (gone)",
                    self.path,
                    previous.pid,
                )
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(asdict(Owner.me())).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)  # no owner: nobody holds it
        os.close(self._fd)  # drops the flock
        self._fd = None


def read_meta(published: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((published / META).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return meta if isinstance(meta, dict) else None


def ensure_built(
    root: Path,
    name: str,
    build: Callable[[Path], str],
    *,
    meta: dict[str, Any],
    timeout: float,
    on_wait: Callable[[Owner | None], None] | None = None,
    on_build: Callable[[], None] | None = None,
) -> tuple[Path, bool]:
    """``(published directory, built by this call)``. ``build(directory)`` compiles into the
    given empty directory and returns the library's file name there. Raises
    :class:`LockTimeout`, or whatever ``build`` raises (its directory is removed)."""
    final = root / name
    if published_ok(final):
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    lock = BuildLock(root / f"{name}.lock")
    lock.acquire(timeout, on_wait)
    try:
        if published_ok(final):
            return final, False
        for stale in root.glob(f".build-{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # without kernel.json (never published whole) or without a digest
            shutil.rmtree(final, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{name}-{os.getpid()}-", dir=root))
        try:
            if on_build is not None:
                on_build()
            t0 = time.monotonic()
            library = build(tmp)
            seconds = time.monotonic() - t0
            (tmp / library).chmod(0o755)  # never group/other-writable: verify_library refuses it
            record = {
                **meta,
                "library": library,
                DIGEST: file_sha256(tmp / library),
                "build_seconds": round(seconds, 1),
                "built_at": rfc3339(),
                "built_on": socket.gethostname(),
                "cpus": os.cpu_count(),
            }
            (tmp / META).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            tmp.chmod(0o755)  # mkdtemp's 0700: an image's build is read by another uid
            try:
                os.rename(tmp, final)
            except OSError:  # published meanwhile by an unlocked builder: keep theirs
                if not (final / META).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final, True
    finally:
        lock.release()


def usual_build_seconds(root: Path, default: float) -> float:
    """The slowest build recorded in this cache (any key), else ``default``."""
    seen = [
        float(m["build_seconds"])
        for d in (root.iterdir() if root.is_dir() else ())
        if d.is_dir() and not d.name.startswith(".")
        if (m := read_meta(d)) and isinstance(m.get("build_seconds"), int | float)
    ]
    return max(seen, default=default)
