"""Data: NSMC/JSONL readers, example datasets, tokenisation and masking, the resumable order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from npu_lora.api.load import SpecError, load_manifest
from npu_lora.data import (
    ANSWER_WORDS,
    BYTE_VOCAB_SIZE,
    IGNORE_INDEX,
    DataError,
    Example,
    TokenizedDataset,
    byte_level_tokenizer,
    detect_format,
    encode_example,
    load_examples,
    prepare_data,
    read_jsonl,
    read_nsmc,
    resolve_data_path,
)

REPO = Path(__file__).resolve().parents[2]


def _tsv(tmp_path: Path, body: str, name: str = "d.tsv") -> Path:
    p = tmp_path / name
    p.write_text("id\tdocument\tlabel\n" + body, encoding="utf-8")
    return p


# ---------------------------------------------------------------------------- readers


def test_nsmc_quotes_are_plain_characters(tmp_path):
    p = _tsv(tmp_path, '1\t"따옴표로 시작\t1\n2\t중간에 "강추" 있음\t0\n3\t끝 따옴표"\t1\n')
    ex = read_nsmc(p)
    assert [e.text for e in ex] == ['"따옴표로 시작', '중간에 "강추" 있음', '끝 따옴표"']
    assert [e.label for e in ex] == [1, 0, 1]
    assert all(e.kind == "classify" for e in ex)
    assert ex[1].source.endswith("d.tsv:3")


def test_nsmc_bad_rows_name_field_and_line(tmp_path):
    with pytest.raises(DataError, match=r"spec\.data\.path: .*d\.tsv:3: label must be 0 or 1"):
        read_nsmc(_tsv(tmp_path, "1\tok\t1\n2\tbad\t5\n"))
    with pytest.raises(DataError, match=r"spec\.data\.path: .*d\.tsv:2: expected 3 tab-separated"):
        read_nsmc(_tsv(tmp_path, "1\tno label\n"))
    bad_header = tmp_path / "h.tsv"
    bad_header.write_text("a\tb\n1\t2\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"h\.tsv:1: expected the NSMC header"):
        read_nsmc(bad_header)
    latin = tmp_path / "l.tsv"
    latin.write_bytes(b"id\tdocument\tlabel\n1\t\xff\xfe\t1\n")
    with pytest.raises(DataError, match="not UTF-8"):
        read_nsmc(latin)


def test_jsonl_both_shapes_and_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "안녕"}\n\n{"prompt": "질문:", "completion": " 답"}\n', encoding="utf-8")
    ex = read_jsonl(p)
    assert [(e.kind, e.text, e.completion) for e in ex] == [
        ("text", "안녕", None),
        ("prompt", "질문:", " 답"),
    ]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": "broken"\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"spec\.data\.path: .*b\.jsonl:2: not valid JSON"):
        read_jsonl(bad)
    bad.write_text('{"text": "ok"}\n{"foo": 1}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"b\.jsonl:2: expected a 'text' field"):
        read_jsonl(bad)
    bad.write_text('{"prompt": "p"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"b\.jsonl:1: 'prompt' and 'completion'"):
        read_jsonl(bad)


def test_paths_examples_and_format_auto(tmp_path):
    nsmc = resolve_data_path("example:nsmc-mini")
    jsonl = resolve_data_path("example:jsonl-mini")
    assert detect_format(nsmc, "auto") == "nsmc" and detect_format(jsonl, "auto") == "jsonl"
    assert detect_format(jsonl, "nsmc") == "nsmc"
    with pytest.raises(DataError, match=r"spec\.data\.path: unknown example dataset .*nsmc-mini"):
        resolve_data_path("example:nope")
    with pytest.raises(DataError, match=r"spec\.data\.path: no such file"):
        resolve_data_path(str(tmp_path / "missing.tsv"))
    with pytest.raises(DataError, match=r"spec\.data\.path: not a regular file"):
        resolve_data_path(str(tmp_path))
    assert isinstance(DataError("x"), SpecError)


def test_shipped_examples_are_valid_and_regenerable():
    nsmc = read_nsmc(resolve_data_path("example:nsmc-mini"))
    assert 200 <= len(nsmc) <= 1000
    assert sum(e.label for e in nsmc) == len(nsmc) // 2  # balanced
    assert any(e.text.startswith('"') for e in nsmc)  # exercises QUOTE_NONE
    jl = read_jsonl(resolve_data_path("example:jsonl-mini"))
    assert {e.kind for e in jl} == {"text", "prompt"}
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_example_data.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------- tokenizer


def test_byte_level_tokenizer():
    tok = byte_level_tokenizer()
    assert len(tok) == BYTE_VOCAB_SIZE < 512
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = '영화 "최고" \t!'
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [3 + b for b in text.encode("utf-8")]
    assert tok.decode(ids) == text


def test_tokenizer_errors_name_the_field(tmp_path):
    from npu_lora.data import load_tokenizer

    m = load_manifest(
        {
            "model": {"preset": "tiny-qwen3-moe", "tokenizer": str(tmp_path / "nope")},
            "data": {"path": "example:nsmc-mini"},
        }
    )
    with pytest.raises(SpecError, match=r"spec\.model\.tokenizer: no such directory"):
        load_tokenizer(m.spec.model)
    (tmp_path / "empty").mkdir()
    m.spec.model.tokenizer = str(tmp_path / "empty")
    with pytest.raises(SpecError, match=r"spec\.model\.tokenizer: .* has no tokenizer files"):
        load_tokenizer(m.spec.model)


# ---------------------------------------------------------------------------- encoding


def _labelled(ids, labels):
    return [i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE_INDEX]


def test_classification_masking_and_padding():
    tok = byte_level_tokenizer()
    ex = Example("classify", "재밌다", label=1)
    ids, mask, labels = encode_example(ex, tok, 64)
    assert len(ids) == len(mask) == len(labels) == 64
    n = sum(mask)
    assert mask == [1] * n + [0] * (64 - n)
    assert ids[n:] == [tok.pad_token_id] * (64 - n)
    answer = [*tok.encode(ANSWER_WORDS[1], add_special_tokens=False), tok.eos_token_id]
    assert _labelled(ids, labels) == answer
    assert labels[n - len(answer) : n] == answer  # the answer ends the real tokens
    assert tok.decode(ids[:n]) == "<bos>리뷰: 재밌다\n감정: 긍정<eos>"


def test_truncation_cuts_the_document_not_the_answer():
    tok = byte_level_tokenizer()
    long = "아주 긴 리뷰 " * 40
    ids, mask, labels = encode_example(Example("classify", long, label=0), tok, 48)
    assert sum(mask) == 48
    answer = [*tok.encode(ANSWER_WORDS[0], add_special_tokens=False), tok.eos_token_id]
    assert _labelled(ids, labels) == answer
    assert ids[-len(answer) :] == answer
    assert tok.decode(ids).endswith("\n감정: 부정<eos>")
    with pytest.raises(DataError, match=r"spec\.training\.seqLen: 16 is too short"):
        encode_example(Example("classify", "x", label=0), tok, 16)


def test_text_and_prompt_records():
    tok = byte_level_tokenizer()
    ids, mask, labels = encode_example(Example("text", "abc"), tok, 8)
    assert ids[:5] == [1, 3 + 97, 3 + 98, 3 + 99, 2] and sum(mask) == 5
    assert labels[:5] == [IGNORE_INDEX, 3 + 97, 3 + 98, 3 + 99, 2]  # loss on every token
    ids, _, labels = encode_example(Example("prompt", "q" * 30, completion="ok"), tok, 12)
    assert _labelled(ids, labels) == [3 + 111, 3 + 107, 2]
    assert ids[-3:] == [3 + 111, 3 + 107, 2]
    custom = encode_example(Example("classify", "좋아", label=1), tok, 64, template="[{text}] =>")[
        0
    ]
    assert tok.decode([i for i in custom if i]).startswith("<bos>[좋아] => 긍정")
    with pytest.raises(DataError, match=r"spec\.data\.template: must contain"):
        encode_example(Example("classify", "a", label=1), tok, 64, template="no placeholder")


# ---------------------------------------------------------------------------- order


def test_order_is_deterministic_resumable_and_covers_epochs():
    tok = byte_level_tokenizer()
    exs = [Example("text", f"{i}") for i in range(10)]
    a = TokenizedDataset(exs, tok, 8, seed=3)
    b = TokenizedDataset(exs, tok, 8, seed=3)
    c = TokenizedDataset(exs, tok, 8, seed=4)
    seq_a = [a.index(g) for g in range(30)]
    assert seq_a == [b.index(g) for g in reversed(range(30))][::-1]  # random access, same order
    assert seq_a != [c.index(g) for g in range(30)]
    for e in range(3):
        assert sorted(seq_a[e * 10 : (e + 1) * 10]) == list(range(10))  # every epoch a permutation
    assert seq_a[:10] != seq_a[10:20]
    # step/micro → sample: step 3 of (batch 2, accum 2) starts at global sample 8
    batch = a.batch(3, 1, 2, 2)
    assert batch["input_ids"].tolist() == a.input_ids[[a.index(10), a.index(11)]].tolist()
    it = a.iter_batches(2, 2, 2)
    step, micro = next(it)
    assert step == 2 and micro[0]["labels"].tolist() == a.batch(2, 0, 2, 2)["labels"].tolist()


def test_prepare_data_from_spec(tmp_path):
    m = load_manifest(
        {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:jsonl-mini", "maxExamples": 7},
            "training": {"seqLen": 96, "steps": 10},
        }
    )
    ds, tok = prepare_data(m.spec)
    assert len(ds) == 7 and len(tok) == BYTE_VOCAB_SIZE
    assert ds.input_ids.shape == (7, 96)
    assert [e.text for e in load_examples(m.spec)] == [e.text for e in load_examples(m.spec)]
    m2 = load_manifest({"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": str(tmp_path)}})
    with pytest.raises(DataError, match=r"spec\.data\.path"):
        prepare_data(m2.spec)


def test_examples_file_is_json_lines():
    for line in resolve_data_path("example:jsonl-mini").read_text(encoding="utf-8").splitlines():
        assert isinstance(json.loads(line), dict)
