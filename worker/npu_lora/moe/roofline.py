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
pass) would give in tokens/s.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Machine:
    """The two measured lines (GB/s = 1e9 B/s; GFLOP/s per dtype name)."""

    read_gbs: float
    peak_gflops: dict[str, float]
    threads: int
    how: str = ""

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
            float(d["read_gbs"]), dict(d["peak_gflops"]), int(d["threads"]), d.get("how", "")
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
    return [
        text,
        "host MoE tokens/s per pass with n× the tokens per pass (larger micro-batch, or n ranks "
        f"of a node in one pass), on the roofline floor: {', '.join(gains)}",
    ]
