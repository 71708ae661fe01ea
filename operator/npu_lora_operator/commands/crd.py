"""``npu-lora crd``: print (or write, or check) the MoEFinetune CRD generated from the models."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--write",
        metavar="PATH",
        action="append",
        help="write the CRD YAML to PATH instead of printing it (repeatable)",
    )
    parser.add_argument(
        "--check",
        metavar="PATH",
        action="append",
        help="exit 1 when PATH is missing or differs from the generated CRD (repeatable; "
        "default with no PATH given elsewhere: crds/npu-lora.io_moefinetunes.yaml)",
    )


def run(args: argparse.Namespace) -> int:
    from npu_lora_operator.crd import crd_yaml, is_stale, write_crd

    if args.check:
        stale = [p for p in args.check if is_stale(p)]
        for p in stale:
            print(
                f"{p}: stale or missing; regenerate with: npu-lora crd --write {p}",
                file=sys.stderr,
            )
        return 1 if stale else 0
    if args.write:
        for p in args.write:
            changed = write_crd(p)
            print(f"{p}: {'written' if changed else 'unchanged'}", file=sys.stderr)
        return 0
    sys.stdout.write(crd_yaml())
    return 0
