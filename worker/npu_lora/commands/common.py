"""What every ``npu-lora`` command shares: the ``--set`` option, the arguments of the commands
that read a finished run (``predict``, ``chat``, ``export``) and the exit codes.

Exit codes (:func:`run_command`, which ``npu_lora.cli.main`` runs every command through): 0
success; 2 (``EXIT_CONFIG_ERROR``) invalid configuration or input: a :class:`SpecError` (the
API's, with its field) or a :class:`CommandError` a command raises for its own options; 130
interrupted (Ctrl-C); 1 any other error, after its traceback. Each line reads
``npu-lora COMMAND: error: MESSAGE`` on stderr. A command returns its own code for outcomes that
are not errors of this kind (``npu-lora run``'s non-finite loss, a failed graph compile).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from npu_lora.api import backends as registry
from npu_lora.api.load import SpecError
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR

__all__ = [
    "EXIT_CONFIG_ERROR",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "CommandError",
    "add_overrides",
    "add_run_arguments",
    "fail",
    "load_from_args",
    "quiet_libraries",
    "run_command",
]

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


class CommandError(Exception):
    """A command's refusal of its own input: the message (naming the option) and the exit code
    (default ``EXIT_CONFIG_ERROR``)."""

    def __init__(self, message: str, code: int = EXIT_CONFIG_ERROR) -> None:
        super().__init__(message)
        self.code = code


def fail(command: str, message: str, code: int) -> int:
    """Print ``npu-lora COMMAND: error: MESSAGE`` on stderr; return ``code``."""
    print(f"npu-lora {command}: error: {message}", file=sys.stderr)
    return code


def run_command(command: str, run: Callable[[argparse.Namespace], int | None], args: Any) -> int:
    """``run(args)`` with the exit codes of the module doc."""
    try:
        return int(run(args) or 0)
    except CommandError as e:
        return fail(command, str(e), e.code)
    except SpecError as e:
        return fail(command, str(e), EXIT_CONFIG_ERROR)
    except KeyboardInterrupt:
        return fail(command, "interrupted", EXIT_INTERRUPTED)
    except Exception as e:
        traceback.print_exc()
        return fail(command, f"{type(e).__name__}: {e}", EXIT_ERROR)


def add_overrides(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--set dotted.path=value`` (repeatable) into ``args.overrides``: a spec field's value,
    applied by :func:`npu_lora.api.load.load_manifest`."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="dotted.path=value",
        help=help or "override a spec field, e.g. --set training.learningRate=1e-3 (repeatable)",
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``RUN_DIR``, ``--adapter``, ``--set`` and ``--backend`` of the commands that read a
    finished run."""
    from npu_lora.inference.load import ADAPTERS

    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished `npu-lora run` directory")
    parser.add_argument(
        "--adapter",
        choices=ADAPTERS,
        default="adapter",
        help="which trained weights: adapter/ (default, the final one), adapter-best/ (best eval "
        "loss, runs with spec.eval) or checkpoint/ (the last checkpoint of an unfinished run)",
    )
    add_overrides(
        parser,
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
    """``load_run`` with :func:`add_run_arguments`' arguments (raises SpecError/RunDirError:
    exit 2)."""
    from npu_lora.inference.load import load_run

    quiet_libraries()
    return load_run(
        args.run_dir, adapter=args.adapter, overrides=args.overrides, backend=args.backend
    )
