"""The progress of ``npu-lora run`` without a terminal width (a pod's log, CI, ``script``): a
plain line every N steps, where the tqdm bar printed nothing (issue 41)."""

from __future__ import annotations

from types import SimpleNamespace

from npu_lora.train import callbacks as cb


def _ctx(total: int) -> SimpleNamespace:
    return SimpleNamespace(total_steps=total, start_step=1, name="tiny")


def test_without_a_terminal_a_line_every_n_steps(capsys):
    bar = cb.ProgressBar()
    ctx = _ctx(40)
    bar.on_start(ctx)  # pytest's captured stderr is not a terminal
    for step in range(1, 41):
        bar.on_step({"loss": 5.0, "step_s": 0.25, "hot_experts": 4, "step": step}, ctx)
    bar.on_end({}, ctx)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tiny:")]
    assert len(lines) == 40 // cb.lines_every(40) == 20
    assert lines[-1].startswith("tiny: step 40/40 loss=5.0000 s_step=0.250 hot=4")


def test_quiet_prints_nothing_and_every_is_bounded(capsys):
    bar = cb.ProgressBar(disable=True)
    bar.on_start(_ctx(10))
    bar.on_step({"loss": None, "step_s": 0.1}, _ctx(10))
    assert capsys.readouterr().err == ""
    assert [cb.lines_every(n) for n in (None, 5, 40, 1000, 10**6)] == [10, 1, 2, 50, 100]
    assert cb.terminal_columns(SimpleNamespace(isatty=lambda: False)) == 0
