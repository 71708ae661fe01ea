"""``npu-lora rngd-check``: compile-check every device graph with furiosa-torch's compiler on CPU.

The arguments are parsed here; the check is :mod:`npu_lora.rngd.check`. ``python -m
npu_lora.commands.rngd_check`` is how the check runs each probe/compile job in a child process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from npu_lora.commands.common import add_overrides, run_command
from npu_lora.rngd import check


def _csv(value: str) -> list[str]:
    return [v for v in (s.strip() for s in value.split(",")) if v]


def _buckets(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in _csv(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"buckets are integers: {value!r}") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``rngd-check`` options (``npu-lora rngd-check``; ``python -m`` for the jobs)."""
    parser.add_argument(
        "--widths",
        choices=("tiny", "qwen3-30b-a3b"),
        default="tiny",
        help="model widths of the device graphs (default: tiny)",
    )
    parser.add_argument("--seq-len", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument(
        "--buckets",
        type=_buckets,
        default=None,
        help="hot-expert bucket sizes, comma separated (default: the graphs' own)",
    )
    parser.add_argument(
        "--graphs", type=_csv, default=None, help="only these graphs, comma separated"
    )
    parser.add_argument(
        "--directions",
        type=_csv,
        default=list(check.DIRECTIONS),
        help="forward,backward (default both)",
    )
    parser.add_argument(
        "--tier",
        choices=(*check.TIERS, "all"),
        default="all",
        help="inventory (seconds), probe (per-op compiles), compile (whole graphs), all",
    )
    parser.add_argument("--json", dest="json_out", type=Path, default=None, help="write results")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="persistent furiosa compile cache (XDG_CACHE_HOME); default: a scratch dir, removed",
    )
    parser.add_argument(
        "--source",
        default=check.DEFAULT_SOURCE,
        help=f"where the graphs come from, MODULE:FUNC or FILE.py:FUNC (default {check.DEFAULT_SOURCE})",
    )
    parser.add_argument(
        "--plan",
        type=Path,
        default=None,
        help="check the compile plan of this MoEFinetune manifest (`npu-lora compile-plan`: "
        "its graphs, shapes and names) instead of --widths/--seq-len",
    )
    add_overrides(parser, help="with --plan: override a spec field, e.g. training.seqLen=256")
    parser.add_argument(
        "--dtype", default=None, help="device dtype passed to the graph factory (e.g. bfloat16)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds per probe/compile job before it is killed (default 1800)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run probe/compile jobs in this process (no isolation; peak RSS is the process's)",
    )
    parser.add_argument("--list", action="store_true", help="list the graphs and exit")
    # a probe/compile job in a child process (``check.run_job_subprocess``)
    parser.add_argument("--_job", help=argparse.SUPPRESS)
    parser.add_argument("--_job-out", dest="job_out", type=Path, help=argparse.SUPPRESS)
    parser.set_defaults(load_plan=load_plan, plan_graphs=plan_graphs)


def plan_graphs(plan: Any, names: list[str] | None = None) -> list[Any]:
    """``--plan FILE``: the plan's own graph list (:func:`npu_lora.compile.graphs.plan_graphs`,
    the one ``npu-lora precompile`` compiles; ``check.build_graphs`` calls it)."""
    from npu_lora.compile.graphs import plan_graphs as build

    return build(plan, names)


def load_plan(args: argparse.Namespace) -> Any:
    """``--plan FILE``: the compile plan (``npu_lora.compile.plan``) of that manifest for the
    ``furiosa`` backend, ``--set`` overrides applied (``check.plan_of`` calls it)."""
    from npu_lora.api.load import load_manifest
    from npu_lora.compile.plan import compile_plan

    spec = load_manifest(args.plan, list(getattr(args, "overrides", None) or [])).spec
    return compile_plan(spec, backend="furiosa")


def run(args: argparse.Namespace) -> int:
    if args._job:  # child: XDG_CACHE_HOME / TMPDIR come from the parent
        graph_name, direction, tier = json.loads(args._job)
        row = check.run_job(args, graph_name, direction, tier)
        args.job_out.write_text(json.dumps(row.to_dict()))
        return 0
    if args.json_out is not None:
        from npu_lora.api.outpaths import check_out_file

        check_out_file(args.json_out, "--json")
    return check.run_check(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="npu-lora rngd-check",
        description="Compile every device graph with furiosa-torch's compiler on the CPU.",
    )
    add_arguments(parser)
    return run_command("rngd-check", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
