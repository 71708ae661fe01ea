"""One place for what every command shares (``npu_lora.commands.common``): ``--set`` and the
exit codes."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from npu_lora import cli
from npu_lora.api.load import SpecError
from npu_lora.commands.common import EXIT_INTERRUPTED, CommandError, run_command

PACKAGE = Path(cli.__file__).resolve().parent
WITH_SET = ("run", "compile-plan", "precompile", "rngd-check", "predict", "chat", "export")


def test_set_is_declared_in_one_place() -> None:
    declared = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if re.search(r"""add_argument\(\s*["']--set["']""", p.read_text(encoding="utf-8"))
    ]
    assert declared == ["commands/common.py"]


@pytest.mark.parametrize("name", WITH_SET)
def test_every_command_with_set_collects_the_overrides_alike(name: str) -> None:
    parser = cli.build_parser()
    module = importlib.import_module(cli.SUBCOMMANDS[name][0])
    module.add_arguments(parser._subparsers._group_actions[0].choices[name])  # type: ignore[union-attr]
    positional = {"predict": ["d", "--data", "x"], "chat": ["d"], "export": ["d", "--merged", "m"]}
    rest = positional.get(name, [] if name == "rngd-check" else ["f.yaml"])
    args = parser.parse_args([name, *rest, "--set", "a.b=1", "--set", "c=2"])
    assert args.overrides == ["a.b=1", "c=2"]


def _raises(exc: BaseException):
    def run(_args: object) -> int:
        raise exc

    return run


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (CommandError("--steps: must be at least 1"), 2, "error: --steps: must be at least 1"),
        (CommandError("the build failed", 1), 1, "error: the build failed"),
        (SpecError("spec.training.steps: bad"), 2, "error: spec.training.steps: bad"),
        (KeyboardInterrupt(), EXIT_INTERRUPTED, "error: interrupted"),
        (RuntimeError("boom"), 1, "error: RuntimeError: boom"),
    ],
)
def test_run_command_turns_errors_into_exit_codes(
    exc: BaseException, code: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_command("demo", _raises(exc), None) == code
    assert f"npu-lora demo: {line}" in capsys.readouterr().err


def test_run_command_passes_a_commands_own_code_through() -> None:
    assert run_command("demo", lambda _a: 3, None) == 3
    assert run_command("demo", lambda _a: None, None) == 0


def test_the_cli_runs_every_command_through_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile-plan", "/nonexistent/plan.yaml"]) == 2
    assert "npu-lora compile-plan: error: " in capsys.readouterr().err
