"""Packing: several examples a row, positions restarting per example, block-diagonal attention
(the engine's loss on a packed row equals the same examples run unpacked)."""

from __future__ import annotations

import pytest
import torch
from npu_lora.api.v1alpha1 import MoEFinetuneSpec
from npu_lora.data import (
    BYTE_VOCAB_SIZE,
    IGNORE_INDEX,
    TokenizedDataset,
    byte_level_tokenizer,
    read_examples,
    resolve_data_path,
)
from npu_lora.device.graphs import causal_mask


def _chat_examples(n: int):
    return read_examples(resolve_data_path("example:chat-mini"), "chat")[:n]


def test_packed_rows_hold_every_example_with_restarting_positions():
    tok = byte_level_tokenizer()
    ex = _chat_examples(40)
    plain = TokenizedDataset(ex, tok, 256, rows_per_step=4)
    packed = TokenizedDataset(ex, tok, 256, packing=True, rows_per_step=4)
    sp, su = packed.stats.to_dict(), plain.stats.to_dict()
    assert sp["real_tokens"] == su["real_tokens"] and sp["examples"] == su["examples"] == 40
    assert sp["rows"] < su["rows"] == 40 and sp["pad_fraction"] < su["pad_fraction"]
    assert sp["real_tokens_per_step"] > su["real_tokens_per_step"]
    assert sp["tokens_per_step"] == su["tokens_per_step"] == 4 * 256
    # the label tokens are the same multiset, less nothing (a first token never has a label)
    assert sp["label_tokens"] == su["label_tokens"]
    b = packed.batch(1, 0, 2, 1)
    assert set(b) == {"input_ids", "attention_mask", "labels", "position_ids"}
    assert "position_ids" not in plain.batch(1, 0, 2, 1)
    # every example of the unpacked set appears whole in some packed row, at positions 0..n-1
    rows = {
        tuple(packed.input_ids[r, s : s + n].tolist())
        for r in range(len(packed))
        for s in (packed.position_ids[r] == 0).nonzero().flatten().tolist()
        for n in [int(plain.attention_mask[0].sum())]
    }
    first = tuple(plain.input_ids[0, : int(plain.attention_mask[0].sum())].tolist())
    assert first in rows
    starts_per_row = (packed.position_ids == 0).sum(1)
    assert int(starts_per_row.max()) >= 2 and int(starts_per_row.sum()) == 40
    first_tokens = packed.labels[packed.position_ids == 0]
    assert (first_tokens == IGNORE_INDEX).all()


def test_causal_mask_is_block_diagonal_for_packed_positions():
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    am = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    m = causal_mask(am, 1, 7, torch.float32, pos)[0, 0] == 0
    assert m[2, :3].all() and not m[3, :3].any() and m[4, 3:5].all() and not m[4, :3].any()
    assert not m[:, 5:].any()  # padding is never attended


def _spec() -> MoEFinetuneSpec:
    return MoEFinetuneSpec.model_validate(
        {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:chat-mini"},
            "moe": {"placement": "host-only", "hostDtype": "float32"},
            "training": {"seqLen": 256, "batchSize": 1, "steps": 10},
            "device": {"backend": "cpu"},
        }
    )


def _shortest(n: int):
    """The ``n`` shortest conversations of ``example:chat-mini`` (they fit one 256-byte row)."""
    chats = _chat_examples(200)
    size = [sum(len(m["content"].encode()) for m in c.messages) for c in chats]
    return [chats[i] for i in sorted(sorted(range(len(chats)), key=size.__getitem__)[:n])]


@pytest.fixture(scope="module")
def engine():
    from npu_lora.engine import build_engine

    eng = build_engine(_spec(), vocab_size=BYTE_VOCAB_SIZE)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero LoRA B, so the adapters take part
        for n, p in eng.model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return eng


def _loss(eng, batch) -> float:
    """The engine's mean CE over the batch's label tokens (gradients accumulate; unused)."""
    return eng.forward_backward(batch).loss


def test_packed_row_loss_equals_the_examples_run_unpacked(engine):
    """One packed row of 3 conversations vs the 3 as separate rows: per-example loss (labels of
    one example kept, the others' set to -100) and the row's mean loss agree to fp32 tolerance;
    the same packed row without its position ids (plain causal attention across examples,
    positions 0..S-1) does not — the equality is the block-diagonal mask's doing."""
    tok = byte_level_tokenizer()
    S = 256
    chats = _chat_examples(200)
    short = sorted(
        range(200), key=lambda i: sum(len(m["content"].encode()) for m in chats[i].messages)
    )
    ex = [chats[i] for i in sorted(short[:3])]
    plain = TokenizedDataset(ex, tok, S)
    lens = plain.attention_mask.sum(1).tolist()
    assert sum(lens) <= S, lens
    packed = TokenizedDataset(ex, tok, S, packing=True)
    assert len(packed) == 1
    row = {k: v[:1] for k, v in packed.batch(1, 0, 1, 1).items()}
    starts = (row["position_ids"][0] == 0).nonzero().flatten().tolist()
    assert len(starts) == 3
    bounds = [*starts, int(row["attention_mask"].sum())]
    # which unpacked row sits in which segment (BFD reorders by length)
    seg_of = {}
    for k in range(3):
        seg = tuple(row["input_ids"][0, bounds[k] : bounds[k + 1]].tolist())
        seg_of[k] = next(
            i for i in range(3) if tuple(plain.input_ids[i, : lens[i]].tolist()) == seg
        )

    for k in range(3):
        one = {key: v.clone() for key, v in row.items()}
        keep = torch.zeros(S, dtype=torch.bool)
        keep[bounds[k] : bounds[k + 1]] = True
        one["labels"][0, ~keep] = IGNORE_INDEX
        i = seg_of[k]
        ref = {
            "input_ids": plain.input_ids[i : i + 1],
            "attention_mask": plain.attention_mask[i : i + 1],
            "labels": plain.labels[i : i + 1],
        }
        lp, lu = _loss(engine, one), _loss(engine, ref)
        assert lp == pytest.approx(lu, rel=1e-5, abs=1e-5), (k, lp, lu)

    whole_packed = _loss(engine, row)
    whole_plain = _loss(
        engine,
        {
            "input_ids": plain.input_ids,
            "attention_mask": plain.attention_mask,
            "labels": plain.labels,
        },
    )
    assert whole_packed == pytest.approx(whole_plain, rel=1e-5, abs=1e-5)
    leaky = {k: v for k, v in row.items() if k != "position_ids"}
    assert abs(_loss(engine, leaky) - whole_packed) > 1e-3


def test_packed_row_matches_stock_transformers_given_the_position_ids(engine):
    """The stock peft model, given only the packed row's ``position_ids`` (no attention mask),
    builds its own block-diagonal mask (transformers' ``find_packed_sequence_indices``): its
    loss equals the engine's on the packed row — the engine follows transformers' rule."""
    from npu_lora.models import build_model

    packed = TokenizedDataset(_shortest(3), byte_level_tokenizer(), 256, packing=True)
    row = packed.batch(1, 0, 1, 1)
    spec = _spec()
    plain, _ = build_model(spec.model, spec.lora, seed=0, vocab_size=BYTE_VOCAB_SIZE)
    plain.load_state_dict(engine.model.state_dict())
    plain.eval()
    with torch.no_grad():
        stock = plain(
            input_ids=row["input_ids"], position_ids=row["position_ids"], labels=row["labels"]
        ).loss.item()
        arange = torch.arange(256)[None]
        leaky = plain(input_ids=row["input_ids"], position_ids=arange, labels=row["labels"])
    assert _loss(engine, row) == pytest.approx(stock, rel=1e-5, abs=1e-5)
    assert abs(leaky.loss.item() - stock) > 1e-3
