"""The real NSMC sample and the real Qwen3 tokenizer (``../shared/data``) on the tiny preset."""

from __future__ import annotations

import json
import math

import pytest
from npu_lora.cli import main
from train_helpers import SHARED, tiny_manifest

DATA = SHARED / "data"
NSMC = DATA / "nsmc" / "ratings_train.txt"
QWEN_TOK = DATA / "qwen3-tokenizer"

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(
        not (NSMC.is_file() and (QWEN_TOK / "vocab.json").is_file()),
        reason=f"shared data not found under {DATA.resolve()}",
    ),
]


def test_qwen3_tokenizer_loads_offline():
    from npu_lora.api.load import load_manifest
    from npu_lora.data import load_tokenizer, prepare_data

    m = load_manifest(
        {
            "model": {"preset": "tiny-qwen3-moe", "tokenizer": str(QWEN_TOK)},
            "data": {"path": str(NSMC), "maxExamples": 50},
            "training": {"seqLen": 64},
        }
    )
    tok = load_tokenizer(m.spec.model)
    assert len(tok) == 151669 and tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    ds, _ = prepare_data(m.spec, tok)
    assert ds.input_ids.shape == (50, 64)
    ends = [row[row != -100].tolist() for row in ds.labels]
    assert all(
        e[-1] == tok.eos_token_id and tok.decode(e[:-1]).strip() in ("긍정", "부정") for e in ends
    )


def test_nsmc_with_qwen3_tokenizer_loss_falls(tmp_path):
    cfg = tiny_manifest(
        tmp_path,
        model={"tokenizer": str(QWEN_TOK)},
        data={"path": str(NSMC), "maxExamples": 400},
        training={"steps": 16, "learningRate": 5e-3},
        checkpoint={"everySteps": 100},
    )
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 16 and all(math.isfinite(x) for x in losses)
    assert losses[0] > 10  # ~ln(151669): the embedding grew to the tokenizer
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.3, losses
