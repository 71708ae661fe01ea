"""``spec.data.maxRowBytes``: a row longer than the limit is an error naming ``file:line``,
raised before the row is read in full or tokenised; undecodable bytes name the line too."""

from __future__ import annotations

import json

import pytest
from npu_lora.api.load import load_manifest
from npu_lora.data import DataError, load_examples, read_jsonl, read_nsmc
from npu_lora.data.base import Example
from npu_lora.data.readers import DEFAULT_MAX_ROW_BYTES, check_row_sizes


def test_a_jsonl_row_over_the_limit_names_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "ok"}\n' + json.dumps({"text": "x" * 5000}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"d\.jsonl:2: the row is longer than spec\.data\.maxRow"):
        read_jsonl(p, max_row_bytes=4096)
    assert len(read_jsonl(p, max_row_bytes=8192)) == 2


def test_an_nsmc_line_over_the_limit_names_file_and_line(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_text("id\tdocument\tlabel\n1\tok\t1\n2\t" + "가" * 2000 + "\t0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"d\.tsv:3: the row is longer than .* \(4096 bytes\)"):
        read_nsmc(p, max_row_bytes=4096)


def test_the_default_is_4_mib_and_the_spec_field_sets_it(tmp_path):
    assert DEFAULT_MAX_ROW_BYTES == 4 << 20
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"text": "y" * 3000}) + "\n", encoding="utf-8")
    spec = {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": str(p)}}
    assert len(load_examples(load_manifest(spec).spec)) == 1
    spec["data"]["maxRowBytes"] = 2048
    with pytest.raises(DataError, match=r"d\.jsonl:1: .*maxRowBytes \(2048 bytes\)"):
        load_examples(load_manifest(spec).spec)


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path):
    p = tmp_path / "big.jsonl"
    with p.open("wb") as f:  # 64 MiB on one line, no newline
        f.write(b'{"text": "')
        f.write(b"z" * (64 << 20))
    with pytest.raises(DataError, match=r"big\.jsonl:1: the row is longer"):
        read_jsonl(p, max_row_bytes=1 << 20)


def test_undecodable_bytes_name_the_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: not UTF-8 text"):
        read_jsonl(p)


def test_rows_from_datasets_files_are_checked_after_reading():
    rows = [Example("prompt", "p", completion="c" * 3000, source="f.parquet:row 7")]
    with pytest.raises(DataError, match=r"f\.parquet:row 7: the row is longer"):
        check_row_sizes(rows, 2048)
