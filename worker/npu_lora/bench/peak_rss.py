"""Peak RSS of each variant in a process of its own (``npu-lora bench --peak-rss``).

The A/B runs every variant in one process on one model, so that process's peak is the larger
variant's plus the other's leftovers, never one variant's own. With ``--peak-rss`` the bench
first starts, per variant, a child process (``python -m npu_lora.bench.peak_rss``) that builds the
engine as the bench does, switches it to that variant (our engine, or the stock
transformers + peft peer on the same model) and runs ``steps`` steps on the bench's first batch;
the child reports the kernel's high-water mark of its resident set (``getrusage`` ``ru_maxrss``,
what ``/usr/bin/time -v`` prints as "Maximum resident set size") and the mark once the engine was
built, before any step (``/proc/self/status`` ``VmHWM``). Both include the imports, the model and
the engine's weights; the difference is what the steps added at their peak. The children run one
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


def _hwm_bytes() -> int:
    """``VmHWM`` of this process (its peak resident set so far), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


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
    engine = build_engine(build_spec(cfg, placement="host-only"), experts_implementation=impl)
    built = _hwm_bytes()
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
    t0 = time.perf_counter()
    for _ in range(steps):
        runner.step(v, batch)
    return {
        "kind": "peak_rss",
        "variant": name,
        "steps": steps,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "built_rss_bytes": built,
        "step_s": (time.perf_counter() - t0) / max(steps, 1),
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
    peak, built = rec["peak_rss_bytes"], rec["built_rss_bytes"]
    return (
        f"peak RSS {rec['variant']} (own process, {rec['steps']} step(s)): {peak / gib:.2f} GiB "
        f"(after the engine build {built / gib:.2f} GiB; the step added {(peak - built) / gib:.2f})"
    )


def rss_lines(recs: list[dict[str, Any]]) -> list[str]:
    """``bench.md``'s section: one line per variant, and our/peer ratios of the peaks."""
    if not recs:
        return []
    md = ["", "Peak RSS, each variant in its own process (`ru_maxrss`; `--peak-rss`):"]
    md += [f"- {rss_line(r)}" for r in recs]
    ok = [r for r in recs if "error" not in r]
    peers = [r for r in ok if Variant.parse(r["variant"]).is_peer]
    ours = [r for r in ok if not Variant.parse(r["variant"]).is_peer]
    for o in ours:
        for p in peers:
            ratio = o["peak_rss_bytes"] / p["peak_rss_bytes"]
            md.append(f"- {o['variant']} / {p['variant']} peak RSS: {ratio:.2f}")
    return md


def main(argv: list[str]) -> int:
    conf, name = json.loads(argv[0]), argv[1]
    steps = int(argv[2]) if len(argv) > 2 else 1
    rec = child(BenchConfig(**conf), name, steps)
    print(MARK + json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
