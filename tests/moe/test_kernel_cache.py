"""The host kernel's build cache never hangs a run: dead owners' locks are taken over, a live
owner past the timeout sends the run to the torch path with a log line, a killed build leaves
nothing that blocks the next one, and the cache key holds everything the build depends on."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from npu_lora.moe import kernels, stream
from npu_lora.moe.kernels import cache
from npu_lora.moe.kernels.cache import BuildLock, LockTimeout, Owner, ensure_built

CACHE_PY = Path(cache.__file__)

#: A child process with only ``cache.py`` loaded (no torch: starts in a fraction of a second).
CHILD = """
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("kcache", {cache_py!r})
kcache = importlib.util.module_from_spec(spec); sys.modules["kcache"] = kcache
spec.loader.exec_module(kcache)
root, name, mode = Path({root!r}), {name!r}, {mode!r}
if mode == "hold":
    lock = kcache.BuildLock(root / (name + ".lock")); lock.acquire(5)
    print("held", flush=True); time.sleep(600)
def slow_build(d):
    (d / "lock").write_text("")  # torch's FileBaton, as a half-done cpp_extension build has it
    (d / "stream.o").write_bytes(b"half")
    print("building", flush=True); time.sleep(600)
kcache.ensure_built(root, name, slow_build, meta={{}}, timeout=5)
"""


def _child(root: Path, name: str, mode: str) -> subprocess.Popen[str]:
    code = CHILD.format(cache_py=str(CACHE_PY), root=str(root), name=name, mode=mode)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line in ("held", "building"), line
    return p


def _kill(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(10)


def _fake_build(d: Path) -> str:
    (d / "lib.so").write_bytes(b"\x7fELF")
    return "lib.so"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_lock_left_by_a_dead_pid_is_taken_over(tmp_path, caplog):
    rec = Owner(_dead_pid(), Owner.me().host, 1, time.time() - 30)
    (tmp_path / "k.lock").write_text(json.dumps(rec.__dict__))
    assert rec.alive() is False
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger=cache.__name__):
        published, built = ensure_built(tmp_path, "k", _fake_build, meta={}, timeout=30)
    assert built and (published / "lib.so").is_file() and time.monotonic() - t0 < 5
    assert f"left by pid {rec.pid} (gone)" in caplog.text
    assert BuildLock(tmp_path / "k.lock").owner() is None  # released: no owner recorded


def test_a_reused_pid_is_not_the_owner():
    me = Owner.me()
    assert me.alive() is True
    assert Owner(me.pid, me.host, (me.proc_start or 0) + 1, me.since).alive() is False
    assert Owner(me.pid, "some-other-host", me.proc_start, me.since).alive() is None


def test_a_sigkilled_build_leaves_nothing_that_blocks_the_next(tmp_path):
    child = _child(tmp_path, "k", "build")
    owner = BuildLock(tmp_path / "k.lock").owner()
    assert owner is not None and owner.pid == child.pid
    half = list(tmp_path.glob(".build-k-*"))
    assert len(half) == 1 and (half[0] / "lock").exists()
    _kill(child)
    t0 = time.monotonic()
    published, built = ensure_built(tmp_path, "k", _fake_build, meta={}, timeout=5)
    assert built and time.monotonic() - t0 < 3
    assert not list(tmp_path.glob(".build-*")), "the killed attempt's directory is gone"
    assert json.loads((published / "kernel.json").read_text())["library"] == "lib.so"


def test_a_live_owner_past_the_timeout_raises_lock_timeout_naming_it(tmp_path):
    child = _child(tmp_path, "k", "hold")
    try:
        waited: list[Owner | None] = []
        t0 = time.monotonic()
        with pytest.raises(LockTimeout, match=f"pid {child.pid}") as info:
            ensure_built(tmp_path, "k", _fake_build, meta={}, timeout=0.5, on_wait=waited.append)
        assert 0.5 <= time.monotonic() - t0 < 3
        assert info.value.owner is not None and info.value.owner.pid == child.pid
        assert [o.pid for o in waited if o] == [child.pid]  # the wait is logged once, with who
    finally:
        _kill(child)


def test_a_waiter_uses_the_build_published_while_it_waited(tmp_path):
    child = _child(tmp_path, "k", "hold")
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "kernel.json").write_text('{"sha256": "00"}')  # as the holder publishes it
    _kill(child)
    built_here: list[Path] = []
    published, built = ensure_built(
        tmp_path, "k", lambda d: built_here.append(d) or "x", meta={}, timeout=5
    )
    assert published == tmp_path / "k" and not built and not built_here


def test_a_failed_build_removes_its_directory_and_releases_the_lock(tmp_path):
    def broken(d: Path) -> str:
        (d / "stream.o").write_bytes(b"")
        raise RuntimeError("Error building extension: fatal error: Python.h: No such file")

    with pytest.raises(RuntimeError, match=r"Python\.h"):
        ensure_built(tmp_path, "k", broken, meta={}, timeout=5)
    assert not list(tmp_path.glob(".build-*")) and not (tmp_path / "k").exists()
    published, built = ensure_built(tmp_path, "k", _fake_build, meta={"key": {"a": 1}}, timeout=1)
    meta = json.loads((published / "kernel.json").read_text())
    assert built and meta["key"] == {"a": 1} and meta["build_seconds"] >= 0
    assert oct(published.stat().st_mode & 0o777) == "0o755"  # readable by another uid


@pytest.fixture
def fresh_kernels(monkeypatch, tmp_path):
    """``kernels`` with an empty state and a private cache."""
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("NPU_LORA_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("NPU_LORA_STREAM_EXT", raising=False)
    return tmp_path / "kernels"


def test_a_live_build_past_the_timeout_falls_back_to_torch_with_a_log_line(
    fresh_kernels, monkeypatch, caplog
):
    root = fresh_kernels
    root.mkdir()
    monkeypatch.setenv("NPU_LORA_KERNEL_LOCK_TIMEOUT", "0.3")
    child = _child(root, kernels.key_name(kernels.key_parts()), "hold")
    try:
        with caplog.at_level(logging.WARNING):
            assert kernels.load() is None
        assert stream.backend() == "torch"
        assert f"pid {child.pid}" in (kernels.error() or "")
        assert "waiting for the host kernel build by pid" in caplog.text
        assert "using the torch fallback" in caplog.text
        assert kernels.status()["state"] == "building"
    finally:
        _kill(child)


def test_the_cache_key_changes_with_each_thing_the_build_depends_on():
    parts = kernels.key_parts()
    assert set(parts) == {"torch", "python", "source", "arch", "compiler"}
    assert "git" in parts["torch"] and "cxx11abi" in parts["torch"]
    names = {kernels.key_name(parts)}
    for k in parts:
        names.add(kernels.key_name({**parts, k: parts[k] + "x"}))
    assert len(names) == len(parts) + 1


def test_without_a_compiler_a_build_of_another_compiler_is_used(fresh_kernels, monkeypatch):
    root = fresh_kernels
    parts = {**kernels.key_parts(), "compiler": "g++-99 99.1"}
    d = root / kernels.key_name(parts)
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps({"key": parts, "library": "x.so"}))
    monkeypatch.setattr(kernels, "compiler_id", lambda: "none")
    assert kernels._published_without_compiler(root, kernels.key_parts()) == d
    assert kernels.status()["state"] == "built"


def test_lock_timeout_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("NPU_LORA_KERNEL_LOCK_TIMEOUT", "12.5")
    assert kernels.lock_timeout() == 12.5
    monkeypatch.setenv("NPU_LORA_KERNEL_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="NPU_LORA_KERNEL_LOCK_TIMEOUT"):
        kernels.lock_timeout()
    monkeypatch.delenv("NPU_LORA_KERNEL_LOCK_TIMEOUT")
    assert kernels.lock_timeout() == kernels.DEFAULT_LOCK_TIMEOUT_S


def test_the_real_build_is_published_under_its_key():
    """The suite's one real build (shared cache): published whole, no lock owner, no leftovers."""
    if os.environ.get("NPU_LORA_STREAM_EXT") == "0":
        pytest.skip("extension disabled")
    assert kernels.load() is not None, kernels.error()
    st = kernels.status()
    assert st["state"] == "built" and st["lock_owner"] is None
    root = Path(st["cache"])
    assert not list(root.glob(f".build-{st['key']}-*"))


def test_kernels_build_and_status_commands(capsys):
    """``npu-lora kernels build`` prints where and how long; ``status --json`` the key's state."""
    from npu_lora.cli import main

    if os.environ.get("NPU_LORA_STREAM_EXT") == "0":
        pytest.skip("extension disabled")
    assert main(["kernels", "build"]) == 0
    out = capsys.readouterr().out
    key = kernels.key_name(kernels.key_parts())
    assert key in out and " s " in out and "this CPU runs: " in out
    assert main(["kernels", "status", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["key"] == key and st["state"] == "built" and st["build_seconds"] > 0
    assert set(st["parts"]) == {"torch", "python", "source", "arch", "compiler"}


def _fake_cpp_load(monkeypatch, effect):
    import torch.utils.cpp_extension as cpp

    def fake_load(name, sources, build_directory, **kw):
        return effect(Path(build_directory), name)

    monkeypatch.setattr(cpp, "load", fake_load)


def test_a_first_use_build_says_what_it_does_and_how_long_it_usually_takes(
    fresh_kernels, monkeypatch, caplog
):
    import types

    def built(d: Path, name: str):
        (d / f"{name}.so").write_bytes(b"")
        mod = types.ModuleType(name)
        mod.__file__ = str(d / f"{name}.so")
        return mod

    _fake_cpp_load(monkeypatch, built)
    with caplog.at_level(logging.WARNING):
        mod = kernels.load()
    assert mod is not None and kernels.error() is None
    assert "building the npu_lora_stream host kernel" in caplog.text
    assert f"usually ~{kernels.TYPICAL_BUILD_S:.0f} s" in caplog.text
    assert "built the host kernel in" in caplog.text
    assert kernels.status()["state"] == "built"


def test_a_failed_build_logs_the_compiler_error_not_just_its_tail(fresh_kernels, monkeypatch):
    def fails(d: Path, name: str):
        raise RuntimeError(
            "Error building extension 'x':\n[1/6] c++ ... stream.cpp\n"
            "/usr/include/pybind11/detail/common.h:274:10: fatal error: Python.h: "
            "No such file or directory\n" + "ninja: build stopped: subcommand failed.\n" * 40
        )

    _fake_cpp_load(monkeypatch, fails)
    assert kernels.load() is None
    assert "fatal error: Python.h: No such file or directory" in (kernels.error() or "")
    assert not list(fresh_kernels.glob(".build-*"))


# ------------------------------------------------------------------- integrity of what is loaded


def _published(root: Path, name: str = "k") -> Path:
    final, built = ensure_built(root, name, _fake_build, meta={}, timeout=5)
    assert built
    return final


def test_a_build_records_the_library_digest_and_is_not_writable_by_others(tmp_path):
    final = _published(tmp_path / "kernels")
    meta = cache.read_meta(final)
    assert meta["sha256"] == cache.file_sha256(final / "lib.so")
    assert (final / "lib.so").stat().st_mode & 0o777 == 0o755
    assert cache.verify_library(final, "lib.so") == final / "lib.so"


def test_a_planted_library_is_refused_and_the_run_falls_back_to_torch(
    fresh_kernels, monkeypatch, caplog
):
    """A ``.so`` replaced after the build (same key, same kernel.json) is never loaded."""
    root = fresh_kernels
    name = kernels.key_name(kernels.key_parts())
    final = _published(root, name)
    (final / "lib.so").write_bytes(b"\x7fELF planted")
    with caplog.at_level(logging.WARNING):
        assert kernels.load() is None
    # refused before the dynamic loader saw it (a load of these bytes fails otherwise)
    assert "lib.so has sha256" in kernels.error() and "not loaded" in kernels.error()
    assert "using the torch fallback" in caplog.text
    assert stream.backend() == "torch"


@pytest.mark.parametrize("where", ["cache", "build", "library"])
def test_a_cache_writable_by_other_users_is_refused(tmp_path, where):
    final = _published(tmp_path / "kernels")
    target = {"cache": final.parent, "build": final, "library": final / "lib.so"}[where]
    target.chmod(0o775)
    with pytest.raises(cache.UntrustedKernel, match=r"writable by other users \(mode 0o775\)"):
        cache.verify_library(final, "lib.so")
    target.chmod(0o757)
    with pytest.raises(cache.UntrustedKernel, match="writable by other users"):
        cache.verify_library(final, "lib.so")


def test_a_cache_owned_by_another_user_is_refused(tmp_path):
    final = _published(tmp_path / "kernels")
    try:
        os.chown(final, 12345, -1)
    except PermissionError:
        pytest.skip("needs root to give a directory to another uid")
    with pytest.raises(cache.UntrustedKernel, match=r"owned by uid 12345"):
        cache.verify_library(final, "lib.so")


def test_a_library_that_is_a_link_or_names_another_directory_is_refused(tmp_path):
    final = _published(tmp_path / "kernels")
    other = tmp_path / "evil.so"
    other.write_bytes(b"\x7fELF")
    (final / "link.so").symlink_to(other)
    with pytest.raises(cache.UntrustedKernel, match="not a regular file"):
        cache.verify_library(final, "link.so")
    with pytest.raises(cache.UntrustedKernel, match="names no library file"):
        cache.verify_library(final, "../evil.so")


def test_a_build_without_a_digest_is_rebuilt(tmp_path):
    root = tmp_path / "kernels"
    old = root / "k"
    old.mkdir(parents=True)
    (old / "lib.so").write_bytes(b"old")
    (old / cache.META).write_text(json.dumps({"library": "lib.so"}))  # an older npu-lora's
    with pytest.raises(cache.UntrustedKernel, match="records no sha256"):
        cache.verify_library(old, "lib.so")
    final, built = ensure_built(root, "k", _fake_build, meta={}, timeout=5)
    assert built and cache.verify_library(final, "lib.so")
