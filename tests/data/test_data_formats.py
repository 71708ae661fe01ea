"""Data formats: chat (messages / sharegpt), alpaca, ``datasets`` files, overflow, bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npu_lora.api.load import load_manifest
from npu_lora.data import (
    IGNORE_INDEX,
    DataError,
    TokenizedDataset,
    byte_level_tokenizer,
    detect_format,
    load_examples,
    read_examples,
    resolve_data_path,
)
from npu_lora.data.chat import CHATML_TEMPLATE, encode_chat, training_chat_template
from npu_lora.data.formats import ALPACA_PROMPT

REPO = Path(__file__).resolve().parents[2]
QWEN_TOK = REPO / ".." / "shared" / "data" / "qwen3-tokenizer"

MULTI_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "3 더하기 4는?"},
    {"role": "assistant", "content": "7입니다."},
    {"role": "user", "content": "And times 2?"},
    {"role": "assistant", "content": "14."},
]


def _jsonl(tmp_path: Path, rows: list, name: str = "d.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return p


def _read(path: Path, fmt: str = "auto"):
    return read_examples(path, detect_format(path, fmt))


def _label_spans(ids: list[int], labels: list[int]) -> list[list[int]]:
    spans, cur = [], []
    for t, lab in zip(ids, labels, strict=True):
        if lab != IGNORE_INDEX:
            assert lab == t
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    return spans + ([cur] if cur else [])


def _spec(tmp_path: Path, data: dict, **training):
    return load_manifest(
        {
            "apiVersion": "npu-lora.io/v1alpha1",
            "kind": "MoEFinetune",
            "metadata": {"name": "t"},
            "spec": {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": data,
                "moe": {"placement": "host-only"},
                "training": {"steps": 1, "seqLen": 128, **training},
                "device": {"backend": "cpu"},
            },
        }
    ).spec


# ---------------------------------------------------------------------------- chat masks


@pytest.mark.shared
@pytest.mark.skipif(not (QWEN_TOK / "vocab.json").is_file(), reason="shared data not found")
def test_qwen3_template_labels_exactly_the_assistant_turns():
    """Real Qwen3 tokenizer, multi-turn row: the labelled tokens are, turn by turn, what the
    template renders for each assistant message (TRL's training template: an empty think
    block, the content, ``<|im_end|>``); system and user turns carry no label."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN_TOK), local_files_only=True)
    ids, labels = encode_chat(MULTI_TURN, tok, training_chat_template(tok))
    rendered = tok.decode(ids)
    assert rendered.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    spans = [tok.decode(s) for s in _label_spans(ids, labels)]
    answers = [m["content"] for m in MULTI_TURN if m["role"] == "assistant"]
    assert spans == [f"<think>\n\n</think>\n\n{a}<|im_end|>" for a in answers]
    for a in answers:  # each span sits right after its turn header
        assert f"<|im_start|>assistant\n<think>\n\n</think>\n\n{a}<|im_end|>" in rendered
    unlabelled = tok.decode([t for t, lab in zip(ids, labels, strict=True) if lab == -100])
    assert "3 더하기 4는?" in unlabelled and "You are terse." in unlabelled
    assert "7입니다." not in unlabelled and "14." not in unlabelled


def test_tokenizer_without_template_uses_chatml_fallback():
    tok = byte_level_tokenizer()
    assert training_chat_template(tok) == CHATML_TEMPLATE
    ids, labels = encode_chat(MULTI_TURN, tok, CHATML_TEMPLATE)
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    spans = [tok.decode(s) for s in _label_spans(ids, labels)]
    assert spans == ["7입니다.<|im_end|>", "14.<|im_end|>"]


def test_sharegpt_spelling_equals_messages_spelling(tmp_path):
    share = [
        {
            "from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]],
            "value": m["content"],
        }
        for m in MULTI_TURN
    ]
    a = _read(_jsonl(tmp_path, [{"messages": MULTI_TURN}], "m.jsonl"))
    b = _read(_jsonl(tmp_path, [{"conversations": share}], "s.jsonl"))
    assert a[0].kind == b[0].kind == "chat"
    assert a[0].messages == b[0].messages == tuple(MULTI_TURN)
    tok = byte_level_tokenizer()
    da, db = TokenizedDataset(a, tok, 128), TokenizedDataset(b, tok, 128)
    assert da.input_ids.equal(db.input_ids) and da.labels.equal(db.labels)


def test_alpaca_loss_on_the_output_only(tmp_path):
    rows = [
        {"instruction": "Add the numbers.", "input": "2 3", "output": "5"},
        {"instruction": "Say hi.", "output": "hi"},
    ]
    ex = _read(_jsonl(tmp_path, rows))
    assert [e.kind for e in ex] == ["alpaca", "alpaca"]
    assert ex[0].text == ALPACA_PROMPT.format(
        instruction="Add the numbers.", input_block="### Input:\n2 3\n\n"
    )
    assert "### Input" not in ex[1].text
    tok = byte_level_tokenizer()  # no chat template: the prompt layout
    ds = TokenizedDataset(ex, tok, 128)
    for row, e in enumerate(ex):
        ids, labels = ds.input_ids[row].tolist(), ds.labels[row].tolist()
        lab = [t for t in labels if t != IGNORE_INDEX]
        assert tok.decode(lab) == e.completion + "<eos>"
        n = labels.index(lab[0])
        assert tok.decode(ids[:n]) == "<bos>" + e.text


@pytest.mark.shared
@pytest.mark.skipif(not (QWEN_TOK / "vocab.json").is_file(), reason="shared data not found")
def test_alpaca_with_a_chat_tokenizer_is_a_conversation(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN_TOK), local_files_only=True)
    ex = _read(_jsonl(tmp_path, [{"instruction": "Add.", "input": "2 3", "output": "5"}]))
    ds = TokenizedDataset(ex, tok, 128)
    ids, labels = ds.input_ids[0].tolist(), ds.labels[0].tolist()
    assert tok.decode(ids).startswith("<|im_start|>user\nAdd.\n\n2 3<|im_end|>\n")
    assert [tok.decode(s) for s in _label_spans(ids, labels)] == [
        "<think>\n\n</think>\n\n5<|im_end|>"
    ]


# ---------------------------------------------------------------------------- datasets files

CHAT_ROWS = [
    {"messages": MULTI_TURN},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "안녕"}]},
]
ALPACA_ROWS = [
    {"instruction": "Add.", "input": "2 3", "output": "5"},
    {"instruction": "Say hi.", "input": "", "output": "hi"},
]


def _same(a, b) -> None:
    assert [(e.kind, e.text, e.completion, e.label, e.messages) for e in a] == [
        (e.kind, e.text, e.completion, e.label, e.messages) for e in b
    ]


@pytest.mark.parametrize("rows", [CHAT_ROWS, ALPACA_ROWS], ids=["chat", "alpaca"])
def test_parquet_json_and_save_to_disk_read_the_same_rows(tmp_path, rows):
    import datasets

    ref = _read(_jsonl(tmp_path, rows))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    (tmp_path / "d.json").write_text(json.dumps(rows, ensure_ascii=False), "utf-8")
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    for name in ("d.parquet", "d.json", "saved", "saved_dict"):
        p = resolve_data_path(str(tmp_path / name))
        got = _read(p)
        _same(got, ref)
        assert got[1].source == f"{p}:row 1"


def test_csv_reads_alpaca_text_and_nsmc_columns(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("instruction,input,output\nAdd.,2 3,5\nSay hi.,,hi\n", "utf-8")
    _same(_read(p), _read(_jsonl(tmp_path, ALPACA_ROWS)))
    n = tmp_path / "n.csv"
    n.write_text("id,document,label\n1,좋다,1\n2,별로,0\n", "utf-8")
    got = _read(n)
    assert [(e.kind, e.text, e.label) for e in got] == [
        ("classify", "좋다", 1),
        ("classify", "별로", 0),
    ]
    t = tmp_path / "t.csv"
    t.write_text("text\nhello\n", "utf-8")
    assert [(e.kind, e.text) for e in _read(t)] == [("text", "hello")]


def test_format_auto_detects_from_extension_and_fields(tmp_path):
    assert detect_format(_jsonl(tmp_path, CHAT_ROWS, "c.jsonl"), "auto") == "chat"
    assert detect_format(_jsonl(tmp_path, ALPACA_ROWS, "a.jsonl"), "auto") == "alpaca"
    assert detect_format(_jsonl(tmp_path, [{"text": "x"}], "t.jsonl"), "auto") == "jsonl"
    assert detect_format(tmp_path / "x.tsv", "auto") == "nsmc"
    assert detect_format(resolve_data_path("example:chat-mini"), "auto") == "chat"


# ---------------------------------------------------------------------------- overflow


def test_overflow_truncate_keeps_and_drop_removes_long_rows_and_counts_them(tmp_path):
    S = 240  # the two CHAT_ROWS fit (209 and 69 byte tokens), the long row does not
    long = {
        "messages": [
            {"role": "user", "content": "x" * 30},
            {"role": "assistant", "content": "y" * 300},
        ]
    }
    ex = _read(_jsonl(tmp_path, [*CHAT_ROWS, long]))
    tok = byte_level_tokenizer()
    t = TokenizedDataset(ex, tok, S, overflow="truncate")
    assert len(t) == 3 and t.stats.truncated == 1 and t.stats.dropped == 0
    assert int(t.attention_mask[2].sum()) == S  # cut at seqLen, answer tokens kept
    assert int((t.labels[2] != IGNORE_INDEX).sum()) > 0
    d = TokenizedDataset(ex, tok, S, overflow="drop")
    assert len(d) == 2 and d.stats.dropped == 1 and d.stats.truncated == 0
    assert d.stats.to_dict()["dropped"] == 1 and t.stats.to_dict()["truncated"] == 1
    assert d.input_ids.equal(t.input_ids[:2])
    with pytest.raises(DataError, match=r"spec\.data\.overflow: no example is left"):
        TokenizedDataset(ex[2:], tok, S, overflow="drop")
    # truncation that cuts every assistant token leaves the row out (counted as no_label)
    late = {
        "messages": [
            {"role": "user", "content": "z" * 300},
            {"role": "assistant", "content": "ok"},
        ]
    }
    n = TokenizedDataset(_read(_jsonl(tmp_path, [*CHAT_ROWS, late], "l.jsonl")), tok, S)
    assert len(n) == 2 and n.stats.no_label == 1


# ---------------------------------------------------------------------------- bad rows


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        (
            [
                *CHAT_ROWS,
                {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
            ],
            r"d\.jsonl:3: messages\[1\]\.role: must be one of system, user, assistant, tool \(got 'bot'\)",
        ),
        (
            [{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": 5}]}],
            r"d\.jsonl:1: conversations\[1\]\.value: must be a string \(got int\)",
        ),
        (
            [{"messages": [{"role": "user", "content": "only a question"}]}],
            r"d\.jsonl:1: messages: needs at least one non-empty assistant message",
        ),
        (
            [*CHAT_ROWS, {"messages": []}],
            r"d\.jsonl:3: messages: must be a non-empty list",
        ),
        (
            [ALPACA_ROWS[0], {"instruction": "x", "input": ""}],
            r"d\.jsonl:2: output: must be a non-empty string \(missing\)",
        ),
        (
            [*CHAT_ROWS, {"text": "hi"}],
            r"d\.jsonl:3: expected a 'messages' \(or 'conversations'\) list",
        ),
    ],
    ids=["role", "sharegpt-value", "no-assistant", "empty", "alpaca-output", "wrong-format"],
)
def test_bad_rows_name_file_line_and_field(tmp_path, rows, pattern):
    with pytest.raises(DataError, match=r"spec\.data\.path: .*" + pattern):
        _read(_jsonl(tmp_path, rows))


def test_bad_row_in_parquet_names_the_row_index(tmp_path):
    import datasets

    rows = [*ALPACA_ROWS, {"instruction": "x", "input": "y", "output": ""}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "a.parquet"))
    with pytest.raises(DataError, match=r"a\.parquet:row 2: output: must be a non-empty string"):
        _read(tmp_path / "a.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: cannot read it with datasets"):
        _read(tmp_path / "broken.parquet")


def test_bad_row_fails_the_run_before_anything_is_written(tmp_path, capsys):
    from npu_lora.cli import main

    data = _jsonl(tmp_path, [{"messages": [{"role": "bot", "content": "x"}]}])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        json.dumps(
            {
                "apiVersion": "npu-lora.io/v1alpha1",
                "kind": "MoEFinetune",
                "metadata": {"name": "bad"},
                "spec": {
                    "model": {"preset": "tiny-qwen3-moe"},
                    "data": {"path": str(data), "format": "chat"},
                    "moe": {"placement": "host-only"},
                    "training": {"steps": 1, "seqLen": 64},
                    "device": {"backend": "cpu"},
                },
            }
        )
    )
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 2
    assert "d.jsonl:1: messages[0].role: must be one of" in capsys.readouterr().err
    assert not out.exists()


def test_load_examples_reads_chat_example_from_spec(tmp_path):
    spec = _spec(tmp_path, {"path": "example:chat-mini", "format": "chat"})
    ex = load_examples(spec)
    assert len(ex) == 200 and {e.kind for e in ex} == {"chat"}
    assert any(len(e.messages) >= 4 for e in ex)
    assert any(e.messages[0]["role"] == "system" for e in ex)


def test_tiny_chat_example_runs(tmp_path):
    """``npu-lora run examples/tiny-chat.yaml --steps 2``: chat rows, packed, assistant-only
    labels; the summary's data stats carry the overflow and packing figures."""
    from npu_lora.cli import main

    out = tmp_path / "run"
    cfg = REPO / "examples" / "tiny-chat.yaml"
    args = ["run", str(cfg), "--steps", "2", "--out", str(out), "--quiet", "--no-plot"]
    assert main(args) == 0
    data = json.loads((out / "summary.json").read_text())["data"]
    assert data["kinds"] == {"chat": data["examples"]} and data["packed"] is True
    assert data["rows"] < data["examples"] and 0 <= data["pad_fraction"] < 0.3
    assert {"truncated", "dropped", "real_tokens_per_step", "tokens_per_step"} <= data.keys()
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "step" in r][:2] == [1, 2]


def test_load_examples_takes_a_data_spec_alone(tmp_path):
    """A held-out file described by a DataSpec reads through the same entry point."""
    from npu_lora.api.v1alpha1 import DataSpec

    p = _jsonl(tmp_path, ALPACA_ROWS)
    ex = load_examples(DataSpec(path=str(p), format="auto"))
    assert [e.kind for e in ex] == ["alpaca", "alpaca"]
    assert load_examples(DataSpec(path=str(p), max_examples=1), seed=3)[0].source


def test_parquet_with_mixed_row_kinds_reads_each_row_by_its_own_fields(tmp_path):
    """Columns a row lacks come back as None from ``datasets``: a text row next to a
    prompt/completion row, and a sharegpt row next to a messages row, still read."""
    import datasets

    rows = [{"text": "hello"}, {"prompt": "q", "completion": "a"}]
    cols = {"text": ["hello", None], "prompt": [None, "q"], "completion": [None, "a"]}
    datasets.Dataset.from_dict(cols).to_parquet(str(tmp_path / "j.parquet"))
    _same(_read(tmp_path / "j.parquet"), _read(_jsonl(tmp_path, rows, "j.jsonl")))
    share = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "안녕"}]
    cols = {"messages": [CHAT_ROWS[1]["messages"], None], "conversations": [None, share]}
    datasets.Dataset.from_dict(cols).to_parquet(str(tmp_path / "c.parquet"))
    got = _read(tmp_path / "c.parquet")
    assert got[0].messages == got[1].messages == tuple(CHAT_ROWS[1]["messages"])


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.skipif(not (QWEN_TOK / "vocab.json").is_file(), reason="shared data not found")
def test_chat_example_with_qwen3_template_trains_packed(tmp_path):
    """example:chat-mini rendered by the real Qwen3 template, packed, through ``npu-lora run``."""
    import math

    from npu_lora.cli import main

    cfg = tmp_path / "c.json"
    cfg.write_text(
        json.dumps(
            {
                "model": {"preset": "tiny-qwen3-moe", "tokenizer": str(QWEN_TOK)},
                "data": {"path": "example:chat-mini", "packing": True, "maxExamples": 60},
                "moe": {"placement": "host-only"},
                "training": {"steps": 2, "seqLen": 256, "batchSize": 2},
                "device": {"backend": "cpu"},
            }
        )
    )
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    data = json.loads((out / "summary.json").read_text())["data"]
    assert data["kinds"] == {"chat": 60} and data["rows"] < 20 and data["pad_fraction"] < 0.1
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in recs if "loss" in r)


def test_json_file_may_hold_lines_an_array_or_a_pretty_printed_array(tmp_path):
    ref = _read(_jsonl(tmp_path, ALPACA_ROWS))
    lines = tmp_path / "lines.json"
    lines.write_text("".join(json.dumps(r) + "\n" for r in ALPACA_ROWS), "utf-8")
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(ALPACA_ROWS, indent=2), "utf-8")
    for p in (lines, pretty):
        _same(_read(p), ref)
    assert _read(lines)[1].source == f"{lines}:2" and _read(pretty)[1].source == f"{pretty}:row 1"
