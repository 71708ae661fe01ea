"""``npu-lora precompile FILE --index I`` (or ``--key K``; ``--all``): compile graphs of the run's
plan into the graph cache, atomically (what the operator's Indexed Job pods run: index =
``JOB_COMPLETION_INDEX``). A graph already present is a hit and compiles nothing.

Exit status: 0 compiled or present; 1 the compile failed (the graph and the compiler's message on
stderr and in the JSON line); 2 bad arguments / spec / no cache root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

from npu_lora.api import backends as registry
from npu_lora.commands.common import CommandError, add_overrides


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="MoEFinetune manifest or bare spec (YAML)")
    add_overrides(parser)
    parser.add_argument("--backend", choices=sorted(registry.names()), default=None)
    parser.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="the model's config.json (default: the preset's, or spec.model.path/config.json)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--index",
        type=int,
        default=None,
        help="the graph's index in the plan (default: JOB_COMPLETION_INDEX)",
    )
    which.add_argument("--key", default=None, help="the graph's content key")
    which.add_argument("--all", action="store_true", help="every graph, one after another")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="graph cache root (default: NPU_LORA_COMPILE_CACHE, else the spec's compileCache)",
    )


def run(args: argparse.Namespace) -> int:
    from npu_lora.api.load import SpecError, load_manifest
    from npu_lora.commands.compile_plan import load_plan
    from npu_lora.compile import cache

    try:
        manifest = load_manifest(args.file, args.overrides)
        plan = load_plan(args.file, args.overrides, args.backend, args.model_config)
        if args.all:
            entries = list(plan.entries)
        elif args.key:
            entries = [plan.by_key(args.key)]
        else:
            index = args.index
            if index is None:
                index = int(os.environ.get("JOB_COMPLETION_INDEX", "x"))
            entries = [plan.by_index(index)]
    except (SpecError, ValueError, KeyError, IndexError, OSError) as e:
        raise CommandError(str(e)) from e
    root = args.cache or cache.cache_root(manifest.spec)
    if args.cache is not None:
        from npu_lora.api.outpaths import check_out_dir

        check_out_dir(args.cache, "--cache")
    if root is None:
        raise CommandError("no cache root (--cache or NPU_LORA_COMPILE_CACHE)")
    from npu_lora.compile.precompile import compile_entry

    rc = 0
    for e in entries:
        try:
            row = compile_entry(plan, e, root)
        except Exception as exc:  # the graph and the compiler's message, then exit 1
            msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            row = {
                "index": e.index,
                "name": e.name,
                "key": e.key,
                "outcome": "failed",
                "error": msg[-4000:],
            }
            print(f"npu-lora precompile: {e.name} ({e.key[:16]}) failed: {msg}", file=sys.stderr)
            from npu_lora.train.termination import write_termination_message

            # the pod's termination message: the operator fails the run with the graph and why
            write_termination_message(f"compile of graph {e.index} {e.name} failed: {msg}")
            rc = 1
        print(json.dumps(row), flush=True)
    return rc
