"""An eval file whose rows are also training rows is counted before training: a warning in the
log, ``overlap`` in the eval records, ``status.eval.overlap`` and the summary."""

from __future__ import annotations

import logging

from npu_lora.api.load import load_manifest
from npu_lora.api.v1alpha1 import MoEFinetuneStatus
from npu_lora.data import byte_level_tokenizer
from npu_lora.data.base import Example
from npu_lora.evaluate.heldout import HeldOutEval, count_overlap, prepare_eval
from npu_lora.report.status import StatusReporter

ROWS = [
    '{"prompt": "a", "completion": "1"}',
    '{"prompt": "b", "completion": "2"}',
    '{"prompt": "c", "completion": "3"}',
]


def _spec(tmp_path, train: list[str], ev: list[str]):
    (tmp_path / "train.jsonl").write_text("\n".join(train) + "\n", encoding="utf-8")
    (tmp_path / "eval.jsonl").write_text("\n".join(ev) + "\n", encoding="utf-8")
    return load_manifest(
        {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": str(tmp_path / "train.jsonl")},
            "training": {"steps": 10, "seqLen": 32},
            "eval": {"path": str(tmp_path / "eval.jsonl")},
        }
    ).spec


def test_count_overlap_compares_kind_text_and_answer():
    a = Example("prompt", "p", completion="x")
    assert count_overlap([a], [a, Example("prompt", "p", completion="y")]) == 1
    assert count_overlap([a], [Example("text", "p")]) == 0


def test_an_eval_file_equal_to_the_training_data_is_warned_and_counted(tmp_path, caplog):
    spec = _spec(tmp_path, ROWS, [*ROWS[:2], '{"prompt": "z", "completion": "9"}'])
    with caplog.at_level(logging.WARNING):
        es = prepare_eval(spec, byte_level_tokenizer())
    assert es.overlap == 2
    assert "2 of the 3 eval rows are also training rows" in caplog.text
    ev = HeldOutEval(spec, es)
    assert ev.summary()["overlap"] == 2


def test_a_disjoint_eval_file_has_no_overlap(tmp_path, caplog):
    spec = _spec(tmp_path, ROWS[:2], ROWS[2:])
    with caplog.at_level(logging.WARNING):
        es = prepare_eval(spec, byte_level_tokenizer())
    assert es.overlap == 0 and "training rows" not in caplog.text
    assert "overlap" not in HeldOutEval(spec, es).summary()


def test_status_eval_carries_the_overlap():
    calls: list[dict] = []
    rep = StatusReporter("r1", total_steps=10, patch=lambda body: calls.append(body) or True)
    rep._set_eval({"step": 4, "loss": 0.5, "examples": 3, "overlap": 2}, None)
    assert rep._state["eval"]["overlap"] == 2
    MoEFinetuneStatus.model_validate({"eval": rep._state["eval"]})
    rep._set_eval({"step": 5, "loss": 0.5, "examples": 3}, None)
    assert "overlap" not in rep._state["eval"]
