"""``npu-lora predict RUN_DIR --data FILE``: batch inference with a run's adapter, and a metric.

Rebuilds the run's base (verified) + adapter (:mod:`npu_lora.inference.load`), encodes every row
of FILE as training encodes it and scores it through the engine's forward (device attention and
head, host experts; :mod:`npu_lora.inference.predict` says what is scored). Writes one JSON line
per row to ``--out`` (default ``RUN_DIR/predictions/<FILE stem>.jsonl``) and prints the metric:
accuracy (classification data: NSMC, prompt/completion rows with a small label set) and
loss / perplexity. ``--compare-base`` scores the base too (peft ``disable_adapter()``) and
prints both side by side.

Exit codes: 0 done, 2 bad input (a RUN_DIR without config.yaml or adapter, a base that differs
from the run's, a bad data row: file, line and field named; nothing written), 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from npu_lora.commands.common import CommandError, add_run_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument(
        "--data",
        required=True,
        metavar="FILE",
        help="data file in one of the run's formats (NSMC TSV, JSONL), or example:<name>",
    )
    parser.add_argument(
        "--format",
        default="auto",
        help="data format (default auto: by extension, as spec.data.format)",
    )
    parser.add_argument(
        "--out", metavar="FILE", help="JSONL output (default RUN_DIR/predictions/<stem>.jsonl)"
    )
    parser.add_argument(
        "--compare-base", action="store_true", help="also score the base model (adapter off)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="sequences per forward (default: the run's training.batchSize)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=0,
        metavar="N",
        help="open-ended prompt/completion rows: also generate a greedy prediction of up to N "
        "tokens (default 0: score only)",
    )
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def read_rows(data: str, fmt: str, limit: int | None) -> tuple[Path, list[Any]]:
    """The data file's examples; DataError messages name ``--data`` and file:line."""
    from npu_lora.data import DataError, detect_format, read_examples, resolve_data_path

    try:
        path = resolve_data_path(data)
        return path, read_examples(path, detect_format(path, fmt), limit=limit)
    except DataError as e:
        raise DataError(
            str(e).replace("spec.data.path", "--data").replace("spec.data.format", "--format")
        ) from None


def run(args: argparse.Namespace) -> int:
    """Exit codes: :mod:`npu_lora.commands.common` (``run_command``)."""
    from npu_lora.inference.load import check_run_dir

    if args.batch_size is not None and args.batch_size < 1:
        raise CommandError("--batch-size: must be at least 1")
    check_run_dir(Path(args.run_dir), args.adapter)  # before the data and the model
    if args.out:
        from npu_lora.api.outpaths import check_out_file

        check_out_file(Path(args.out).expanduser(), "--out")
    path, examples = read_rows(args.data, args.format, args.limit)
    return _predict(args, path, examples)


def _predict(args: argparse.Namespace, path: Path, examples: list[Any]) -> int:
    import json

    from tqdm.auto import tqdm

    from npu_lora.commands.common import load_from_args
    from npu_lora.evaluate import build_eval_set
    from npu_lora.inference.predict import gold_answers, score_file

    run = load_from_args(args)
    spec = run.spec
    es = build_eval_set(examples, run.tokenizer, spec.training.seq_len, template=spec.data.template)
    bs = args.batch_size or spec.training.batch_size
    out = Path(args.out) if args.out else run.run_dir / "predictions" / f"{path.stem}.jsonl"

    variants: list[tuple[str, Any]] = [("adapter", contextlib.nullcontext)]
    if args.compare_base:
        variants.append(("base", run.model.disable_adapter))
        # One unmeasured batch first: the first pass of a process pays one-time costs (the
        # kernels' first calls, first touch of the expert weights) that made the adapter pass
        # look several times slower than the base pass after it. Both passes run the same
        # engine and host experts kernel (docs/adapter.md: the measured ratio).
        warm = build_eval_set(
            examples[:bs], run.tokenizer, spec.training.seq_len, template=spec.data.template
        )
        score_file(run.engine, warm, bs)
    scored = {}
    for name, ctx in variants:
        with tqdm(desc=f"predict ({name})", unit="seq", disable=args.quiet) as bar:

            def progress(done: int, total: int, bar: Any = bar) -> None:
                bar.total = total
                bar.update(done - bar.n)

            with ctx():
                scored[name] = score_file(run.engine, es, bs, progress=progress)
    generated = _generate(run, es, args.max_new_tokens, args.quiet)

    lines = []
    for i, (ex, gold) in enumerate(zip(es.examples, gold_answers(es), strict=True)):
        rec: dict[str, Any] = {"row": i, "source": ex.source, "gold": gold}
        rec.update(scored["adapter"].rows[i])
        if i in generated:
            rec["prediction"] = generated[i]
        if "base" in scored:
            rec["base"] = scored["base"].rows[i]
        lines.append(json.dumps(rec, ensure_ascii=False))
    _write_atomic(out, "".join(line + "\n" for line in lines))
    summary = {name: s.metrics for name, s in scored.items()}
    print(_table(summary))
    print(f"base: {run.base_check}")
    print(f"predictions: {out} ({len(lines)} rows)")
    from npu_lora.train.termination import write_termination_message

    write_termination_message(json.dumps({"predictions": str(out), **summary}))
    return 0


def _generate(run: Any, es: Any, max_new_tokens: int, quiet: bool) -> dict[int, str]:
    """Greedy completions of open-ended prompt rows (``--max-new-tokens``)."""
    if max_new_tokens <= 0 or es.candidates is not None or es.labels is None:
        return {}
    rows = [i for i, e in enumerate(es.examples) if e.kind == "prompt"]
    if not rows:
        return {}
    from tqdm.auto import tqdm

    from npu_lora.inference.generate import generate

    out = {}
    for i in tqdm(rows, desc="generate", unit="row", disable=quiet):
        ids, labels = es.input_ids[i].tolist(), es.labels[i].tolist()
        n_prompt = next(t for t, lab in enumerate(labels) if lab != -100)  # the answer starts
        new = generate(run, ids[:n_prompt], max_new_tokens=max_new_tokens)
        out[i] = run.tokenizer.decode(new, skip_special_tokens=True)
    return out


def _write_atomic(path: Path, text: str) -> None:
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def _rate(metrics: dict[str, Any]) -> str | None:
    secs, rows = metrics.get("seconds"), metrics.get("examples")
    return f"{rows / secs:.1f}" if secs and rows else None


def _table(summary: dict[str, dict]) -> str:
    first = next(iter(summary.values()))
    task = "classify" if first.get("accuracy") is not None else "loss"
    keys = (["accuracy"] if task == "classify" else []) + ["loss", "perplexity", "examples"]
    names = list(summary)
    lines = ["metric      " + "".join(f"{n:>12}" for n in names)]
    for k in keys:
        lines.append(f"{k:<12}" + "".join(f"{_fmt(summary[n].get(k)):>12}" for n in names))
    rates = [_rate(summary[n]) for n in names]
    if any(r is not None for r in rates):
        lines.append(f"{'rows/s':<12}" + "".join(f"{_fmt(r):>12}" for r in rates))
    if task == "classify":
        lines.append("candidates: " + ", ".join(repr(x) for x in first.get("candidates", [])))
    return "\n".join(lines)
