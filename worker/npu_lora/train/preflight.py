"""Pre-flight checks of ``npu-lora run``, before anything is written or torch is imported.

:func:`check_out_writable`: ``--out`` (the run directory) can be created and written: no
component of its path is a regular file, and the directory (or its nearest existing ancestor) is
writable (``access(W_OK)``, which also reports a read-only filesystem).

:func:`check_model`: ``spec.model.path`` is a model directory with a ``config.json``, and the
requested device backend is usable here (here, not in ``npu_lora.commands.run``, so that the
layers below ``commands`` can call it too).

:func:`check_memory`: the run's memory estimate (:mod:`npu_lora.api.memory`, the same
torch-free arithmetic the operator sizes ``memory: auto`` with, here with the host dtype resolved
on this CPU) against this process's memory limit, before a single weight is loaded; for presets
and models given by path alike. Too small: :class:`SpecError` (exit 2) naming
``spec.resources.limits.memory`` with the figure to set, and the knobs that shrink the run.

The limit: ``NPU_LORA_MEMORY_LIMIT`` (bytes, or with a ``Ki``/``Mi``/``Gi`` suffix; ``none``
turns the check off), else the cgroup's memory limit (:func:`cgroup_memory_limit`: ``memory.max``
of cgroup v2, or v1's ``memory.limit_in_bytes``, the smallest on this process's cgroup and its
ancestors) when one is set, else ``MemAvailable`` of ``/proc/meminfo``. The expert tensors this
process's reserved huge pages will hold (a pod's ``hugepages-2Mi``) are not charged to it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from npu_lora.api import backends as registry
from npu_lora.api.load import SpecError
from npu_lora.api.memory import (  # model_widths: re-exported (it moved to api.memory)
    GiB,
    MemoryEstimate,
    estimate,
    hugepage_expert_bytes,
    model_widths,
    recommended_limit,
)
from npu_lora.api.modeldir import check_inside, check_model_dir
from npu_lora.api.volumes import volume_root
from npu_lora.machine import HUGEPAGES_ENV, hugetlb_budget

_SUFFIX = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


# ---------------------------------------------------------------------------------------------
# --out


def check_out_writable(run_dir: Path) -> None:
    """Raise SpecError naming ``--out`` when ``run_dir`` cannot be created or written."""
    p = Path(os.path.abspath(run_dir))
    chain = [p, *p.parents]
    existing = next((q for q in chain if os.path.lexists(q)), None)
    if existing is None:  # pragma: no cover - "/" always exists
        return
    for q in chain:
        if not os.path.lexists(q):
            continue
        if not q.is_dir():
            what = "is a file" if q.is_file() else "is not a directory"
            raise SpecError(
                f"--out: cannot create the run directory {run_dir}: {q} {what}"
                if q != p
                else f"--out: {run_dir} {what}"
            )
        break
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = "permission denied"
        try:
            if os.statvfs(existing).f_flag & os.ST_RDONLY:
                reason = "read-only file system"
        except OSError:
            pass
        target = run_dir if existing == p else existing
        raise SpecError(f"--out: cannot write the run directory {run_dir}: {target}: {reason}")


# ---------------------------------------------------------------------------------------------
# the model and the device


def check_model(spec: Any) -> None:
    """``spec.model.path`` is a model directory; the requested device backend is usable."""
    m = spec.model
    if m.volume is not None:  # a path relative to the model volume stays on it
        for field, value in (("spec.model.path", m.path), ("spec.model.tokenizer", m.tokenizer)):
            if value and not Path(value).expanduser().is_absolute():
                check_inside(volume_root("model") / value, volume_root("model"), field)
    if spec.model.path:
        p = Path(spec.model.path).expanduser()
        if spec.model.volume is not None and not p.is_absolute():
            p = volume_root("model") / p
        if not p.is_dir():
            raise SpecError(f"spec.model.path: no such directory: {p}")
        if not (p / "config.json").is_file():
            raise SpecError(
                f"spec.model.path: {p} has no config.json (expected a Hugging Face model directory)"
            )
        check_model_dir(p, "spec.model.path")
    backend = spec.device.backend
    if backend in registry.accelerators():
        from npu_lora.backends import backend_available

        if not backend_available(backend):
            here = [n for n in registry.choices() if n == "auto" or backend_available(n)]
            raise SpecError(
                f"spec.device.backend: {backend!r} is not available on this machine "
                f"(allowed here: {', '.join(here)})"
            )


# ---------------------------------------------------------------------------------------------
# memory


def estimate_memory(
    spec: Any, cfg: dict[str, Any], examples: int = 0, host_dtype: str | None = None
) -> MemoryEstimate | None:
    """:func:`npu_lora.api.memory.estimate` with the host dtype this worker will use
    (``moe.hostDtype: auto`` resolved on this CPU unless ``host_dtype`` is given)."""
    if host_dtype is None:
        from npu_lora.moe.host_dtype import resolve_host_dtype

        m = spec.moe
        host_dtype = resolve_host_dtype(m.host_dtype, m.experts_kernel, log_it=False).dtype
    return estimate(spec, cfg, examples, host_dtype)


def parse_bytes(text: str) -> int | None:
    """``"24Gi"`` → bytes; ``none``/``off``/``0`` → None (no check)."""
    s = text.strip()
    if s.lower() in ("", "none", "off", "0", "max"):
        return None
    for suf in ("Ti", "Gi", "Mi", "Ki", ""):
        if s.endswith(suf) and s[: len(s) - len(suf)].strip().isdigit():
            return int(s[: len(s) - len(suf)]) * _SUFFIX[suf]
    raise SpecError(f"NPU_LORA_MEMORY_LIMIT: expected bytes (e.g. 24Gi) or none, got {text!r}")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


#: ``memory_limit``'s source when no limit is set: memory still free, not a limit on the total.
MEMAVAILABLE = "MemAvailable in /proc/meminfo"


#: where the cgroup file systems and this process's cgroup are read (tests point them elsewhere)
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def cgroup_memory_limit() -> tuple[int, str] | None:
    """The smallest memory limit on this process's cgroup and its ancestors: cgroup v2
    ``memory.max`` (``0::<path>`` in ``/proc/self/cgroup``), else v1
    ``memory/<path>/memory.limit_in_bytes``; a container's own root cgroup counts too. None:
    no limit (``max``, or v1's huge "unlimited")."""
    v2: list[str] = []
    v1: list[str] = []
    for line in (_read(str(PROC_CGROUP)) or "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2.append(path)
        elif "memory" in controllers.split(","):
            v1.append(path)
    candidates: list[Path] = []
    for base, paths, name in (
        (CGROUP_ROOT, v2 or ["/"], "memory.max"),
        (CGROUP_ROOT / "memory", v1 or ["/"], "memory.limit_in_bytes"),
    ):
        for rel in paths:
            d = base / rel.strip("/")
            while True:
                candidates.append(d / name)
                if d == base or base not in d.parents:
                    break
                d = d.parent
    found = []
    for f in candidates:
        v = _read(str(f))
        if v and v.isdigit() and int(v) < (1 << 60):
            found.append((int(v), str(f)))
    return min(found) if found else None


def memory_limit() -> tuple[int | None, str]:
    """(bytes, where it came from); None: no limit known or the check is turned off."""
    env = os.environ.get("NPU_LORA_MEMORY_LIMIT")
    if env is not None:
        return parse_bytes(env), "NPU_LORA_MEMORY_LIMIT"
    cg = cgroup_memory_limit()
    if cg is not None:
        return cg[0], f"the cgroup memory limit ({cg[1]})"
    info = _read("/proc/meminfo") or ""
    for line in info.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024, MEMAVAILABLE
    return None, "unknown"


def _on_hugepages(
    spec: Any, cfg: dict[str, Any], est: MemoryEstimate | None
) -> MemoryEstimate | None:
    """``est`` less the expert bytes this process's reserved huge pages will hold (the pod's
    ``hugepages-2Mi``, :func:`npu_lora.machine.hugetlb_budget`): they are not charged to its
    memory limit (:mod:`npu_lora.moe.pages` puts them there first)."""
    if est is None or os.environ.get(HUGEPAGES_ENV, "auto") in ("0", "thp"):
        return est
    moved = hugepage_expert_bytes(spec, cfg, hugetlb_budget(), est.host_dtype)
    return dataclasses.replace(est, weights=est.weights - moved) if moved else est


def check_memory(spec: Any, examples: int = 0) -> MemoryEstimate | None:
    """Raise SpecError (exit 2, naming ``spec.resources.limits.memory``) when the estimate
    exceeds this process's memory limit."""
    limit, source = memory_limit()
    cfg = model_widths(spec)
    if cfg is None:
        return None
    # moe.hostDtype auto: bounded by its two choices first, so a run that fits either way or
    # cannot fit either way is decided without torch (resolving auto loads the host kernel)
    widest = _on_hugepages(spec, cfg, estimate(spec, cfg, examples))
    if widest is None or limit is None or widest.total <= limit:
        return widest
    auto = spec.moe.host_dtype == "auto"
    bf16 = _on_hugepages(spec, cfg, estimate(spec, cfg, examples, "bfloat16") if auto else None)
    est = widest
    if bf16 is not None and bf16.total <= limit:
        # fits only with bf16: which does auto pick?
        est = _on_hugepages(spec, cfg, estimate_memory(spec, cfg, examples))
        if est is None or est.total <= limit:
            return est
    t = spec.training
    need = f"at least {recommended_limit(est) // GiB}Gi"
    if bf16 is not None and est.host_dtype != "bfloat16":
        need += f" ({recommended_limit(bf16) // GiB}Gi with moe.hostDtype: bfloat16)"
    raise SpecError(
        f"spec.resources.limits.memory: the run needs an estimated {est.describe()}, more than "
        f"the memory limit {limit / GiB:.1f} GiB ({source}). Set spec.resources.limits.memory "
        f"(and requests.memory) to {need} (the estimate × 1.25, rounded up to a GiB: memory: auto), or "
        f"shrink the run: spec.training.batchSize: {t.batch_size} × spec.training.seqLen: "
        f"{t.seq_len} (spec.training.gradAccumulation keeps the effective batch), "
        "moe.hostDtype: bfloat16, or fewer model layers. "
        "NPU_LORA_MEMORY_LIMIT=none skips this check."
    )
