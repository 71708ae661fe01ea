"""Arguments and error handling shared by ``npu-lora predict``, ``chat`` and ``export``."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from typing import Any

from npu_lora.api import backends as registry
from npu_lora.inference.load import ADAPTERS

EXIT_ERROR = 1


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished `npu-lora run` directory")
    parser.add_argument(
        "--adapter",
        choices=ADAPTERS,
        default="adapter",
        help="which trained weights: adapter/ (default, the final one), adapter-best/ (best eval "
        "loss, runs with spec.eval) or checkpoint/ (the last checkpoint of an unfinished run)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="dotted.path=value",
        help="override a field of the run's config.yaml, e.g. --set model.path=/models/qwen3 "
        "when the weights moved (the base is still checked against the run's fingerprint)",
    )
    parser.add_argument(
        "--backend",
        choices=registry.choices(),
        default=None,
        help="device backend (default: the run's spec.device.backend)",
    )


def quiet_libraries() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def load_from_args(args: argparse.Namespace) -> Any:
    """``load_run`` with the shared arguments (raises SpecError/RunDirError: exit 2)."""
    from npu_lora.inference.load import load_run

    quiet_libraries()
    return load_run(
        args.run_dir, adapter=args.adapter, overrides=args.overrides, backend=args.backend
    )


def fail(command: str, message: str, code: int) -> int:
    print(f"npu-lora {command}: error: {message}", file=sys.stderr)
    return code
