"""``npu-lora``: the one CLI entry point.

Each subcommand lives in its own module that is imported only when that subcommand runs (so
``npu-lora operator`` never imports torch, and ``--help`` is fast). A subcommand module exposes
``add_arguments(parser)`` and ``run(args) -> int`` and keeps heavy imports inside functions.
Every command runs through :func:`npu_lora.commands.common.run_command`, the one place that
turns errors into exit codes (2 configuration, 130 interrupted, 1 otherwise); ``--set`` is
declared once there too (``add_overrides``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from npu_lora import __version__

#: This package's commands: name -> (module, one-line help).
WORKER_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("npu_lora.commands.run", "train from a MoEFinetune manifest or bare spec, locally"),
    "bench": ("npu_lora.commands.bench", "A/B benchmark of HostMLP variants in one process"),
    "kernels": (
        "npu_lora.commands.kernels",
        "build the host experts kernel for this venv (`build`) or show its cache (`status`)",
    ),
    "compile-plan": (
        "npu_lora.commands.compile_plan",
        "list every device graph a run compiles, with its cache key (torch-free)",
    ),
    "precompile": (
        "npu_lora.commands.precompile",
        "compile one graph of a run's plan (or all) into the graph cache, atomically",
    ),
    "rngd-check": (
        "npu_lora.commands.rngd_check",
        "compile every device graph with furiosa-torch's compiler on the CPU",
    ),
    "predict": (
        "npu_lora.commands.predict",
        "score a data file with a finished run's adapter (accuracy, loss) as JSONL",
    ),
    "chat": ("npu_lora.commands.chat", "chat with a finished run's adapter (terminal or pipe)"),
    "export": (
        "npu_lora.commands.export",
        "merge a finished run's adapter into its base: a Hugging Face model directory",
    ),
}
#: The operator package's commands (``npu_lora_operator``, extra ``operator``): the one place
#: the worker depends on the operator package; imported only when one of them runs.
OPERATOR_COMMANDS: dict[str, tuple[str, str]] = {
    "crd": (
        "npu_lora_operator.commands.crd",
        "print the MoEFinetune CRD (generated from the models)",
    ),
    "operator": ("npu_lora_operator.commands.operator", "run the kopf operator"),
    "sandbox": (
        "npu_lora_sandbox.command",
        "API emulator + local kubelet + operator in one process, for kubectl without a cluster",
    ),
}
SUBCOMMANDS: dict[str, tuple[str, str]] = {**WORKER_COMMANDS, **OPERATOR_COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-lora",
        description="LoRA fine-tuning of MoE LLMs with a hybrid device/host engine, as a "
        "Kubernetes batch operator.",
    )
    parser.add_argument("--version", action="version", version=f"npu-lora {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
    return parser


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:  # an optional extra is missing
        raise SystemExit(
            f"npu-lora: this command needs an optional dependency that is not installed: {e}.\n"
            "Install the matching extra, e.g. `pip install 'npu-lora[worker]'` or "
            "`pip install 'npu-lora[operator]'`."
        ) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Import only the chosen subcommand's module to add its arguments.
    if argv and argv[0] in SUBCOMMANDS:
        name = argv[0]
        module = _load(SUBCOMMANDS[name][0])
        sub_parser = parser._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
        module.add_arguments(sub_parser)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    module = _load(args._module)
    from npu_lora.commands.common import run_command

    return run_command(args.command, module.run, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
