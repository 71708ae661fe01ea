"""Peak RSS of each variant in a process of its own (``npu-lora bench --peak-rss``).

The A/B runs every variant in one process on one model, so that process's peak is the larger
variant's plus the other's leftovers, never one variant's own. With ``--peak-rss`` the bench
first starts, per variant, a child process (``python -m npu_lora.bench.peak_rss``) that builds the
engine as the bench does, switches it to that variant (our engine, or the stock
transformers + peft peer on the same model) and runs ``steps`` steps on the bench's first batch;
the child reports the process's peak resident set (what ``/usr/bin/time -v`` prints as "Maximum
resident set size": imports, model build, engine, steps; the larger of the build's ``VmHWM`` and
the steps' peak, since the reset below resets ``ru_maxrss`` too) and, separately, the steps' own: the resident set when the steps start (``VmRSS``), then
the mark reset (``/proc/self/clear_refs`` ← 5, Linux ≥ 4.0) and read after the steps
(``VmHWM``). The build of a Qwen3-widths engine peaks above its steps (fp32 weights made, then the
experts cast), so the process peak alone hides the step: ``step_peak_rss_bytes`` is the figure
that tells two variants' steps apart (both include the model and weights). The children run one
after the other, before the parent builds its own engine, so two models are never resident at
once. Host-only and peer variants only (a ``hot`` variant needs the parent's hot set).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from npu_lora.bench.config import BenchConfig
from npu_lora.bench.variant import Variant

#: the line a child prints its answer on (the rest of its output is the engine's log)
MARK = "PEAK_RSS "


def _status_bytes(field: str) -> int:
    """``VmHWM`` (peak resident set so far) or ``VmRSS`` of this process, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (``clear_refs`` 5); False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def child(cfg: BenchConfig, name: str, steps: int = 1) -> dict[str, Any]:
    """In this process: build the engine (``cfg`` as the parent resolved it), switch it to
    variant ``name``, run ``steps`` steps; its peak RSS (bytes) at the end and after the build."""
    from npu_lora.bench.config import build_spec, make_batches
    from npu_lora.bench.runner import VariantRunner
    from npu_lora.engine import build_engine
    from npu_lora.moe.experts import register

    register()
    v = Variant.parse(name)
    if v.placement == "hot":
        raise ValueError(f"variant {name!r}: --peak-rss measures host-only and peer variants")
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    impl = (None if v.is_peer else v.experts_impl) or cfg.experts_impl
    if v.q8:  # what `npu-lora run` holds with moe.hostDtype 8-bit: quantised at load, no bf16 copy
        from dataclasses import replace

        cfg = replace(cfg, host_dtype=v.q8)
        v = replace(v, q8=None)
    engine = build_engine(build_spec(cfg, placement="host-only"), experts_implementation=impl)
    built = _status_bytes("VmHWM")
    batch = make_batches(
        1,
        batch=cfg.batch,
        seq_len=cfg.seq_len,
        vocab=int(engine.config.vocab_size),
        answer_tokens=cfg.answer_tokens,
        seed=cfg.seed,
    )[0]
    runner = VariantRunner(engine, cfg, None)
    runner.apply(v)
    import gc

    gc.collect()
    start = _status_bytes("VmRSS")
    reset = _reset_hwm()
    t0 = time.perf_counter()
    for _ in range(steps):
        runner.step(v, batch)
    step_s = (time.perf_counter() - t0) / max(steps, 1)
    return {
        "kind": "peak_rss",
        "variant": name,
        "steps": steps,
        # the reset also resets ru_maxrss: the process peak is the larger of the two phases'
        "peak_rss_bytes": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, built),
        "built_rss_bytes": built,
        "step_start_rss_bytes": start,
        "step_peak_rss_bytes": _status_bytes("VmHWM") if reset else None,
        "step_s": step_s,
    }


def measure(
    cfg: BenchConfig, names: list[str], log: Callable[[str], None], steps: int = 1
) -> list[dict[str, Any]]:
    """:func:`child` of each variant in ``names`` (host-only and peer ones), one process each,
    one after the other; a child that fails gives a record with its error."""
    out = []
    conf = json.dumps(asdict(cfg))
    for name in names:
        if Variant.parse(name).placement == "hot":
            continue
        cmd = [sys.executable, "-m", "npu_lora.bench.peak_rss", conf, name, str(steps)]
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
        if p.returncode or not lines:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            rec: dict[str, Any] = {"kind": "peak_rss", "variant": name, "error": " | ".join(tail)}
        else:
            rec = json.loads(lines[-1][len(MARK) :])
        log(rss_line(rec))
        out.append(rec)
    return out


def rss_line(rec: dict[str, Any]) -> str:
    """One variant's figures, for the log and ``bench.md``."""
    if "error" in rec:
        return f"peak RSS {rec['variant']}: failed ({rec['error']})"
    gib = 1 << 30
    peak, built, start = rec["peak_rss_bytes"], rec["built_rss_bytes"], rec["step_start_rss_bytes"]
    step = rec.get("step_peak_rss_bytes")
    steps = (
        f"steps' peak {step / gib:.2f} GiB (from {start / gib:.2f} at their start: "
        f"+{(step - start) / gib:.2f})"
        if step is not None
        else "steps' peak not measurable here (clear_refs refused)"
    )
    return (
        f"peak RSS {rec['variant']} (own process, {rec['steps']} step(s)): {steps}; "
        f"process peak {peak / gib:.2f} GiB (engine build {built / gib:.2f})"
    )


def rss_lines(recs: list[dict[str, Any]]) -> list[str]:
    """``bench.md``'s section: one line per variant, and our/peer ratios of the peaks."""
    if not recs:
        return []
    md = ["", "Peak RSS, each variant in its own process (`VmHWM`; `--peak-rss`):"]
    md += [f"- {rss_line(r)}" for r in recs]
    ok = [r for r in recs if "error" not in r]
    peers = [r for r in ok if Variant.parse(r["variant"]).is_peer]
    ours = [r for r in ok if not Variant.parse(r["variant"]).is_peer]
    key = "step_peak_rss_bytes" if all(r.get("step_peak_rss_bytes") for r in ok) else None
    for o in ours:
        for p in peers:
            k = key or "peak_rss_bytes"
            what = "steps' peak RSS" if key else "process peak RSS"
            md.append(f"- {o['variant']} / {p['variant']} {what}: {o[k] / p[k]:.2f}")
    return md


def main(argv: list[str]) -> int:
    conf, name = json.loads(argv[0]), argv[1]
    steps = int(argv[2]) if len(argv) > 2 else 1
    rec = child(BenchConfig(**conf), name, steps)
    print(MARK + json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
