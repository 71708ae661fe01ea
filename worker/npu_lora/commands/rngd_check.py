"""``npu-lora rngd-check``: compile-check every device graph with furiosa-torch's compiler on CPU.

The logic lives in :mod:`npu_lora.rngd.check`; this module only adapts it to the CLI shell.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from npu_lora.rngd import check

    check.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from npu_lora.rngd import check

    return check.run_check(args)
