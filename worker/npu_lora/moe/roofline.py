"""The host experts kernel's roofline: tokens per pass as a tuning fact.

One pass = one layer's experts, one direction, over the T tokens a rank hands the host (T =
micro-batch × sequence length). Per pass (frozen experts, Qwen3 layout; S = T·K rows):

    flops  = 6 · S · H · I            forward: gate/up (2I·H) + down (H·I) MACs per row;
                                      backward: z = dout·W_d (H·I) + dx = dh·W_gu (2I·H)
    bytes  = hit(T) · expert_bytes    each hit expert's weights read once per direction
    hit(T) ≈ E · (1 − (1 − K/E)^T)    expected hit experts with evenly spread routing (a model;
                                      the bench counts the real ones)

against two lines of this machine: the read bandwidth (``a.sum()`` over arrays far larger than
the caches) and the FMA peak (a large square torch ``mm`` in the pass's dtype); both *measured*
by ``npu-lora bench --roofline``, which stores them in ``<kernel cache>/../roofline.json``
(``NPU_LORA_ROOFLINE`` names another file). A pass is bandwidth-bound when ``bytes / bandwidth``
exceeds ``flops / peak`` (below the ridge intensity ``peak / bandwidth``), else compute-bound.
The lines give the time floor ``max(bytes/bw, flops/peak)``; :func:`scaling` uses it to say what
n× the tokens per pass (a larger micro-batch, or n ranks of a node handing their tokens to one
pass) would give in tokens/s. The floor is a ceiling on that gain: a kernel that does not overlap
its memory stream with its arithmetic near the ridge gets less (measured on a 2-core Zen 5:
1.54× at 128 → 256 bf16 where the floor says 2.00×). So the sweep also stores the kernel's own
times per T (``Machine.sweep``), and :func:`measured_scaling` reads the gain off them (log-log
interpolation between the measured T) wherever the widths, dtype and tokens fall inside the sweep.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Machine:
    """The two measured lines (GB/s = 1e9 B/s; GFLOP/s per dtype name)."""

    read_gbs: float
    peak_gflops: dict[str, float]
    threads: int
    how: str = ""
    # the kernel's measured pass times: {"widths": {"H", "inter", "E", "K"}, "seconds":
    # {dtype: {str(T): forward + backward seconds per layer}}} (empty: lines only)
    sweep: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pass_flops(T: int, K: int, H: int, inter: int) -> float:
    return 6.0 * T * K * H * inter


def expected_hit(T: int, K: int, E: int) -> float:
    return E * (1.0 - (1.0 - K / E) ** T)


def bound(seconds: float | None, flops: float, nbytes: float, m: Machine, dtype: str) -> dict:
    """Time on each line, which bounds the pass, the ridge, and the measured time against the
    roof (``of_roof`` = floor / measured)."""
    t_bw = nbytes / (m.read_gbs * 1e9)
    peak = m.peak_gflops.get(dtype) or math.nan
    t_fma = flops / (peak * 1e9)
    floor = max(t_bw, t_fma)
    out = {
        "bandwidth_line_s": t_bw,
        "fma_line_s": t_fma,
        "bound": "bandwidth" if t_bw >= t_fma else "compute",
        "intensity": flops / nbytes if nbytes else math.nan,
        "ridge": peak / m.read_gbs,
        "floor_s": floor,
    }
    if seconds:
        out["measured_s"] = seconds
        out["of_roof"] = floor / seconds
    return out


def scaling(
    T: int, n: int, *, K: int, E: int, H: int, inter: int, expert_bytes: int, m: Machine, dtype: str
) -> float:
    """Tokens/s of one pass over n·T tokens against n passes over T, on the roofline floor."""

    def floor(t: int) -> float:
        return bound(
            None, pass_flops(t, K, H, inter), expected_hit(t, K, E) * expert_bytes, m, dtype
        )["floor_s"]

    return n * floor(T) / floor(n * T)


def _sweep_seconds(m: Machine, dtype: str, **widths: int) -> list[tuple[int, float]] | None:
    sw = m.sweep or {}
    if {k: int(v) for k, v in (sw.get("widths") or {}).items()} != widths:
        return None
    pts = sorted(
        (int(t), float(s)) for t, s in ((sw.get("seconds") or {}).get(dtype) or {}).items()
    )
    pts = [(t, s) for t, s in pts if t > 0 and s > 0]
    return pts if len(pts) >= 2 else None


def measured_seconds(
    T: int, *, K: int, E: int, H: int, inter: int, m: Machine, dtype: str
) -> float | None:
    """The kernel's forward + backward seconds per layer at T tokens per pass, read off this
    machine's sweep (log-log interpolation between the two measured T around it); None when the
    sweep does not cover these widths, this dtype or this T."""
    pts = _sweep_seconds(m, dtype, H=H, inter=inter, E=E, K=K)
    if pts is None or not pts[0][0] <= T <= pts[-1][0]:
        return None
    for (t0, s0), (t1, s1) in itertools.pairwise(pts):
        if t0 <= T <= t1:
            if t0 == T:
                return s0
            a = math.log(T / t0) / math.log(t1 / t0)
            return math.exp(math.log(s0) + a * (math.log(s1) - math.log(s0)))
    return None


def measured_scaling(
    T: int, n: int, *, K: int, E: int, H: int, inter: int, m: Machine, dtype: str
) -> float | None:
    """Tokens/s of one pass over n·T tokens against n passes over T, from the kernel's measured
    times (None outside the sweep)."""
    kw = {"K": K, "E": E, "H": H, "inter": inter, "m": m, "dtype": dtype}
    one, big = measured_seconds(T, **kw), measured_seconds(n * T, **kw)
    return None if one is None or big is None else n * one / big


def default_path() -> Path:
    env = os.environ.get("NPU_LORA_ROOFLINE")
    if env:
        return Path(env)
    from npu_lora.moe.kernels import cache_dir

    return cache_dir().parent / "roofline.json"


def load(path: Path | None = None) -> Machine | None:
    """The machine's lines as ``npu-lora bench --roofline`` stored them (None: not measured)."""
    try:
        d = json.loads((path or default_path()).read_text(encoding="utf-8"))
        return Machine(
            float(d["read_gbs"]),
            dict(d["peak_gflops"]),
            int(d["threads"]),
            d.get("how", ""),
            dict(d.get("sweep") or {}),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(m: Machine, path: Path | None = None) -> Path:
    p = path or default_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}")
    tmp.write_text(json.dumps(m.to_dict(), indent=1), encoding="utf-8")
    os.replace(tmp, p)
    return p


def tuning_lines(
    T: int,
    *,
    K: int,
    E: int,
    H: int,
    inter: int,
    expert_bytes: int,
    dtype: str,
    m: Machine | None,
    measured_s: float | None = None,
) -> list[str]:
    """The summary's and the bench's words on tokens per pass T."""
    if m is None:
        return [
            f"host MoE tokens per pass: {T}; bound: not measured on this machine "
            "(`npu-lora bench --roofline DIR` measures its lines)"
        ]
    hit = expected_hit(T, K, E)
    b = bound(measured_s, pass_flops(T, K, H, inter), hit * expert_bytes, m, dtype)
    text = (
        f"host MoE tokens per pass: {T} ({dtype}, ~{hit:.0f} of {E} experts hit): "
        f"{b['bound']}-bound (intensity {b['intensity']:.1f} flop/B vs ridge {b['ridge']:.1f}; "
        f"bandwidth line {1e3 * b['bandwidth_line_s']:.1f} ms, FMA line "
        f"{1e3 * b['fma_line_s']:.1f} ms per layer and direction"
    )
    if measured_s:
        text += f"; measured {1e3 * measured_s:.1f} ms = {b['of_roof']:.0%} of the roof"
    text += ")"
    gains = [
        f"{n}×: {scaling(T, n, K=K, E=E, H=H, inter=inter, expert_bytes=expert_bytes, m=m, dtype=dtype):.2f}×"
        for n in (2, 4, 8)
    ]
    out = [
        text,
        "host MoE tokens/s per pass with n× the tokens per pass (larger micro-batch, or n ranks "
        f"of a node in one pass), on the roofline floor: {', '.join(gains)}",
    ]
    kw = {"K": K, "E": E, "H": H, "inter": inter, "m": m, "dtype": dtype}
    got = [(n, measured_scaling(T, n, **kw)) for n in (2, 4, 8)]
    got = [(n, g) for n, g in got if g is not None]
    if got:
        out.append(
            "the same from this machine's measured kernel sweep (forward + backward, "
            f"{m.threads} threads): " + ", ".join(f"{n}×: {g:.2f}×" for n, g in got)
        )
    elif m.sweep:
        out.append(
            "this machine's measured kernel sweep does not cover these widths, this dtype or "
            f"{T}–{8 * T} tokens: the floor above is the only estimate (a ceiling)"
        )
    return out
