"""Draft an ``experiments/`` record from a bench output directory.

    python -m npu_lora.bench.record experiments/raw/<run> --command "npu-lora bench ..." > record.md

It fills in what the raw data says (date, machine facts, load during the run, bandwidth before
and after, the table, paired comparisons, targets); the author adds the interpretation.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(run_dir: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in (run_dir / "bench.jsonl").read_text().splitlines()
        if line.strip()
    ]


def _when(when: str | None) -> str:
    if not when or when in ("before", "after"):
        return f"{when or 'before'} the rounds"
    return f"at the start of {when}"


def draft(run_dir: Path, command: str | None = None) -> str:
    recs = load(run_dir)
    meta = next(r for r in recs if r["kind"] == "meta")
    steps = [r for r in recs if r["kind"] == "step"]
    limits = [r for r in recs if r["kind"] == "limits"]
    summary = next((r for r in recs if r["kind"] == "summary"), None)
    m = meta["machine"]
    loads = [r["loadavg"][0] for r in steps]
    lines = [
        f"- date (UTC): {m.get('time_utc')}",
        f"- command: `{command or '(see config below)'}`",
        f"- machine: {m.get('cpu_model')}, {m.get('cpu_count')} CPUs, flags {m.get('cpu_flags')}, "
        f"{m.get('mem_gib')} GiB RAM; torch {m.get('torch')}, transformers {m.get('transformers')}, "
        f"python {m.get('python')}; intra-op threads {m.get('torch_threads')}",
        f"- raw: `{run_dir}/bench.jsonl` (one record per measured step), `{run_dir}/bench.png`, `{run_dir}/log.txt`",
    ]
    if loads:
        lines.append(
            f"- load average (1 min) during the measured steps: min {min(loads):.1f}, median "
            f"{statistics.median(loads):.1f}, max {max(loads):.1f} (2 cores)"
        )
    for lim in limits:
        lines.append(
            f"- copy / triad bandwidth ({_when(lim.get('when'))}): {lim['copy_gbs']:.1f} / "
            f"{lim['triad_gbs']:.1f} GB/s (samples {', '.join(f'{x:.1f}' for x in lim['copy_samples_gbs'])})"
        )
    rounds = [r for r in recs if r["kind"] == "round"]
    if rounds:
        from npu_lora.bench.report import rounds_line

        lines.append(f"- rounds: {rounds_line(rounds)}")
    cfg = meta["config"]
    lines.append(
        f"- config: variants {meta['variants']}, baseline {meta['baseline']}, rounds {cfg['rounds']}, "
        f"steps/round {cfg['steps_per_round']}, warm-up {cfg['warmup']}/variant, hot warm-up "
        f"{cfg['hot_warmup_steps']} steps, S={cfg['seq_len']}, B={cfg['batch']}, host dtype "
        f"{cfg['host_dtype']}, experts kernel {cfg['experts_impl']}, label tokens {cfg['answer_tokens']}"
    )
    md = run_dir / "bench.md"
    if md.exists():
        lines += ["", md.read_text().split("\n", 2)[2].strip()]
    if summary:
        lines += [
            "",
            "Paired per-round comparisons (ratio a/b, median over rounds; same-sign rounds):",
        ]
        for k, p in summary.get("pairs", {}).items():
            lines.append(
                f"- {k}: {p['median_ratio']:.2f} ({p['same_sign_rounds']}/{p['rounds']}); per-round ratios "
                + ", ".join(f"{x:.2f}" for x in p["ratios"])
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--command")
    a = p.parse_args(argv)
    print(draft(a.run_dir, a.command))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
