"""Redraw the benchmark plots (``bench.png``) from the kept raw data, instead of committing PNGs.

    python experiments/plot.py                          # every bench.jsonl in experiments/raw/*.tar.gz
    python experiments/plot.py experiments/raw/2026-12-03-axpy-tile.tar.gz --out /tmp/plots
    python experiments/plot.py runs/my-bench            # a directory holding bench.jsonl files

A record that cites ``experiments/raw/<run>/<case>/bench.png`` finds it redrawn at
``<out>/<run>/<case>/bench.png`` (default ``--out experiments/plots``, ignored by git): per
variant, the medians of the timing columns stacked (attention + head, HostMLP forward, HostMLP
backward less recompute, recompute, the stock peers' forward/backward, the rest of the step), the
same figure ``npu-lora bench`` draws. Needs only matplotlib and the standard library, so it runs on
any archive whatever the engine's code has become since.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import tarfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (label, function of one variant's medians) in stacking order; "other" is the step's rest.
PARTS = [
    ("attn+head", lambda m: m.get("attn_head_s")),
    ("HostMLP fwd", lambda m: m.get("host_fwd_s")),
    (
        "HostMLP bwd (excl. recompute)",
        lambda m: (
            None if m.get("host_bwd_s") is None else m["host_bwd_s"] - (m.get("recompute_s") or 0.0)
        ),
    ),
    ("recompute", lambda m: m.get("recompute_s")),
    ("stock fwd (peers)", lambda m: m.get("fwd_s")),
    ("stock bwd (peers)", lambda m: m.get("bwd_s")),
]
COLUMNS = ("step_s", "attn_head_s", "host_fwd_s", "host_bwd_s", "recompute_s", "fwd_s", "bwd_s")


def _num(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) and not math.isnan(float(x)) else 0.0


def read_records(text: str) -> list[dict]:
    """The JSON lines of a ``bench.jsonl`` (NaN allowed, as the harness writes it)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def medians(records: list[dict]) -> tuple[list[str], dict[str, dict[str, float]], str]:
    """Variants in run order, their medians per column, and a title, from one bench.jsonl."""
    meta = next((r for r in records if r.get("kind") == "meta"), {})
    summary = next((r for r in records if r.get("kind") == "summary"), None)
    steps = [r for r in records if r.get("kind") == "step"]
    variants = list(meta.get("variants") or dict.fromkeys(r["variant"] for r in steps))
    if summary and summary.get("medians"):
        med = {v: summary["medians"][v] for v in variants if v in summary["medians"]}
    else:
        med = {}
        for v in variants:
            rows = [r for r in steps if r.get("variant") == v]
            med[v] = {
                c: statistics.median(_num(r.get(c)) for r in rows)
                for c in COLUMNS
                if any(c in r for r in rows)
            }
    variants = [v for v in variants if med.get(v)]
    title = (meta.get("config") or {}).get("title") or "npu-lora bench"
    return variants, med, title


def plot(variants: list[str], med: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(variants) + 4.5), 4.8))
    bottoms = [0.0] * len(variants)
    for label, f in PARTS:
        vals = [max(_num(f(med[v])), 0.0) for v in variants]
        ax.bar(variants, vals, bottom=bottoms, label=label)
        bottoms = [b + x for b, x in zip(bottoms, vals, strict=True)]
    steps = [_num(med[v].get("step_s")) for v in variants]
    rest = [max(s - b, 0.0) for s, b in zip(steps, bottoms, strict=True)]
    ax.bar(variants, rest, bottom=bottoms, label="other (step − parts)", color="lightgray")
    for i, s in enumerate(steps):
        ax.text(i, s, f"{s:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds per step (medians; parts are medians too)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bench_files(source: Path) -> Iterator[tuple[str, str]]:
    """(relative directory, bench.jsonl text) for every bench.jsonl in an archive or directory."""
    if source.is_dir():
        for f in sorted(source.rglob("bench.jsonl")):
            yield str(f.parent.relative_to(source.parent)), f.read_text(encoding="utf-8")
        return
    with tarfile.open(source, "r:gz") as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile() and Path(m.name).name == "bench.jsonl":
                data = tar.extractfile(m)
                assert data is not None
                text = io.TextIOWrapper(data, encoding="utf-8").read()
                yield str(Path(m.name).parent), text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "sources",
        nargs="*",
        type=Path,
        help="raw archives (.tar.gz) or directories; default: experiments/raw/*.tar.gz",
    )
    ap.add_argument("--out", type=Path, default=HERE / "plots", help="where the PNGs go")
    ap.add_argument("--list", action="store_true", help="only list the plots that would be drawn")
    args = ap.parse_args(argv)
    sources = args.sources or sorted((HERE / "raw").glob("*.tar.gz"))
    n = 0
    for source in sources:
        for rel, text in bench_files(source):
            variants, med, title = medians(read_records(text))
            if not variants:
                continue
            dest = args.out / rel / "bench.png"
            print(dest if args.list else plot(variants, med, dest, title))
            n += 1
    print(f"{n} plot(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
