"""``npu-lora predict`` on a finished tiny run: one JSON line per row, the data's metric."""

from __future__ import annotations

import json
from pathlib import Path

from adapter_helpers import nsmc_rows
from npu_lora.cli import main


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_predict_on_nsmc_writes_a_line_per_row_and_prints_accuracy(finished_run, tmp_path, capsys):
    data = nsmc_rows(tmp_path / "test.tsv", 10)
    out = tmp_path / "pred.jsonl"
    rc = main(["predict", str(finished_run), "--data", str(data), "--out", str(out), "-q"])
    assert rc == 0
    rows = _lines(out)
    assert len(rows) == 10
    for r in rows:
        assert r["gold"] in (" 긍정", " 부정")
        assert set(r["scores"]) == {" 긍정", " 부정"}
        assert r["prediction"] == max(r["scores"], key=r["scores"].get)
        assert r["correct"] == (r["prediction"] == r["gold"])
        assert r["loss"] > 0 and r["tokens"] > 0
    text = capsys.readouterr().out
    assert "accuracy" in text and "perplexity" in text and "verified" in text
    acc = sum(r["correct"] for r in rows) / 10
    assert f"{acc:.4f}" in text


def test_compare_base_scores_differ_from_the_adapter(finished_run, tmp_path, capsys):
    data = nsmc_rows(tmp_path / "test.tsv", 4)
    out = tmp_path / "pred.jsonl"
    rc = main(
        [
            "predict",
            str(finished_run),
            "--data",
            str(data),
            "--out",
            str(out),
            "--compare-base",
            "-q",
            "--batch-size",
            "3",
        ]
    )
    assert rc == 0
    rows = _lines(out)
    assert all("base" in r for r in rows)
    assert all(r["scores"] != r["base"]["scores"] for r in rows)
    assert all(r["loss"] != r["base"]["loss"] for r in rows)
    table = capsys.readouterr().out.splitlines()
    assert "adapter" in table[0] and "base" in table[0]
    (rates,) = [line.split()[1:] for line in table if line.startswith("rows/s")]
    assert len(rates) == 2 and all(float(r) > 0 for r in rates)  # each pass's rows per second


def test_predict_text_rows_report_loss_and_perplexity(finished_run, tmp_path, capsys):
    data = tmp_path / "text.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in ("안녕 세상", "abc d")),
        encoding="utf-8",
    )
    out = tmp_path / "pred.jsonl"
    assert main(["predict", str(finished_run), "--data", str(data), "--out", str(out), "-q"]) == 0
    rows = _lines(out)
    assert len(rows) == 2 and all(r["loss"] > 0 and "scores" not in r for r in rows)
    text = capsys.readouterr().out
    assert "perplexity" in text and "accuracy" not in text


def test_prompt_rows_with_a_small_label_set_are_classified(finished_run, tmp_path, capsys):
    data = tmp_path / "labels.jsonl"
    rows = [{"prompt": f"q{i}:", "completion": " yes" if i % 2 else " no"} for i in range(6)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "pred.jsonl"
    assert main(["predict", str(finished_run), "--data", str(data), "--out", str(out), "-q"]) == 0
    got = _lines(out)
    assert all(set(r["scores"]) == {" yes", " no"} for r in got)
    assert "accuracy" in capsys.readouterr().out


def test_checkpoint_gives_the_same_scores_as_the_final_adapter(finished_run, tmp_path):
    data = nsmc_rows(tmp_path / "test.tsv", 2)
    a, c = tmp_path / "a.jsonl", tmp_path / "c.jsonl"
    assert main(["predict", str(finished_run), "--data", str(data), "--out", str(a), "-q"]) == 0
    args = ["predict", str(finished_run), "--data", str(data), "--out", str(c), "-q"]
    assert main([*args, "--adapter", "checkpoint"]) == 0
    assert [r["scores"] for r in _lines(a)] == [r["scores"] for r in _lines(c)]


def test_open_ended_prompts_get_a_greedy_prediction_and_a_loss(finished_run, tmp_path, capsys):
    data = tmp_path / "open.jsonl"
    rows = [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "pred.jsonl"
    args = ["predict", str(finished_run), "--data", str(data), "--out", str(out), "-q"]
    assert main([*args, "--max-new-tokens", "3"]) == 0
    got = _lines(out)
    assert [r["gold"] for r in got] == [" 1", " 2", " 3"]
    assert all(isinstance(r["prediction"], str) and r["loss"] > 0 for r in got)
    assert "perplexity" in capsys.readouterr().out
