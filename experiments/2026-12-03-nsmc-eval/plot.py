"""Eval loss and held-out accuracy per eval step, ours and stock, into one PNG (not committed).

    python experiments/2026-12-03-nsmc-eval/plot.py RUN_DIR/eval.jsonl stock.json --out curve.png
    python experiments/2026-12-03-nsmc-eval/plot.py experiments/raw/2026-12-03-nsmc-eval.tar.gz

Inputs: an ``npu-lora run``'s ``eval.jsonl`` (one record per evaluation: ``step``, ``loss``,
``accuracy`` (calibrated when ``calibrated``), ``accuracy_total``) and/or the JSON that
``stock_peft.py --out`` writes (its ``evals`` hold the same records); an archive is read for
every ``eval.jsonl`` and ``stock*.json`` it holds. Needs only matplotlib and the standard library.
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from pathlib import Path


def _records(name: str, text: str) -> list[dict]:
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return list(json.loads(text)["evals"])


def load(paths: list[str]) -> dict[str, list[dict]]:
    """``{label: [eval record, ...]}`` from eval.jsonl files, stock JSONs or .tar.gz archives."""
    out: dict[str, list[dict]] = {}
    for p in paths:
        if p.endswith(".tar.gz"):
            with tarfile.open(p) as tar:
                for m in tar.getmembers():
                    if m.isfile() and (
                        m.name.endswith("eval.jsonl")
                        or (Path(m.name).name.startswith("stock") and m.name.endswith(".json"))
                    ):
                        f = tar.extractfile(m)
                        assert f is not None
                        out[m.name] = _records(m.name, io.TextIOWrapper(f).read())
        else:
            out[p] = _records(p, Path(p).read_text())
    return out


def draw(curves: dict[str, list[dict]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, recs in sorted(curves.items()):
        recs = sorted(recs, key=lambda r: r["step"])
        steps = [r["step"] for r in recs]
        a1.plot(steps, [r["loss"] for r in recs], "o-", label=label)
        a2.plot(steps, [100 * r["accuracy"] for r in recs], "o-", label=f"{label} (calibrated)")
        if recs and recs[0].get("accuracy_total") is not None:
            a2.plot(
                steps,
                [100 * r["accuracy_total"] for r in recs],
                "x--",
                label=f"{label} (plain total LL)",
            )
    a1.set(
        xlabel="step",
        ylabel="eval loss (nats / answer token)",
        yscale="log",
        title="held-out eval loss",
    )
    a2.axhline(50, color="grey", lw=0.8)
    a2.axhline(54, color="red", lw=0.8, ls=":", label="54 % (p < 0.01, 1,000 rows)")
    a2.set(xlabel="step", ylabel="accuracy on ratings_test.txt (%)", title="held-out accuracy")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(png)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="eval.jsonl, stock JSON or raw .tar.gz")
    ap.add_argument("--out", default="experiments/plots/2026-12-03-nsmc-eval/curve.png")
    args = ap.parse_args(argv)
    draw(load(args.inputs), Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
