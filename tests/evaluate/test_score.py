"""npu_lora.evaluate: the engine's eval forward equals plain peft, leaves training untouched;
candidate log-likelihood accuracy; loss/perplexity aggregation."""

from __future__ import annotations

import math

import pytest
import torch
from npu_lora.data import byte_level_tokenizer
from npu_lora.data.readers import Example
from npu_lora.engine import build_engine
from npu_lora.evaluate import (
    build_eval_set,
    candidate_answers,
    evaluate,
    score_rows,
    sequence_nll,
    token_nll,
)
from npu_lora.models import build_model


@pytest.mark.parametrize("placement", ["host-only", "hot"])
def test_engine_token_nll_equals_plain_peft_per_token(tiny, placement):
    spec = tiny.spec(moe={"placement": placement, "warmupSteps": 0})
    eng = build_engine(spec)
    tiny.randomize_lora(eng.model)
    eng.select_hot_experts(0)
    plain, _ = build_model(spec.model, spec.lora, seed=spec.training.seed)
    plain.load_state_dict(eng.model.state_dict())
    batch = tiny.batch()
    got = eng.token_nll(batch)
    ref = token_nll(plain, batch)  # the plain HF path of the same function
    assert got.shape == batch["labels"].shape
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    mask = batch["labels"] != -100
    mask[:, 0] = False
    assert (got[~mask] == 0).all() and (got[mask] > 0).all()
    # token mean == the training loss of the same batch
    prof = eng.forward_backward(batch)
    assert abs(got.sum().item() / mask.sum().item() - prof.loss) < 1e-5


def test_engine_token_nll_leaves_training_state_untouched(tiny):
    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 0}, lora={"dropout": 0.1})
    eng = build_engine(spec)
    tiny.randomize_lora(eng.model)
    batch = tiny.batch()
    eng.forward_backward(batch)
    counts = eng.hotset.routing_counts()
    rng = torch.get_rng_state()
    grads = [p.grad.clone() for p in eng.adapter.parameters()]
    a = eng.token_nll(batch)
    b = eng.token_nll(batch)
    assert torch.equal(a, b)  # eval mode: no dropout, deterministic
    assert torch.equal(eng.hotset.routing_counts(), counts)
    assert torch.equal(torch.get_rng_state(), rng)
    assert eng.model.training
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, eng.adapter.parameters(), strict=True))
    assert all(m._kept is None for m in eng.mlps)


def _classify_rows() -> list[Example]:
    return [Example("classify", f"doc {i}", label=i % 2, source=f"f:{i}") for i in range(5)]


def test_candidate_answers_for_nsmc_prompt_label_sets_and_not_open_text():
    answers, gold, cands = candidate_answers(_classify_rows())
    assert answers == [" 부정", " 긍정"] and gold == [0, 1, 0, 1, 0] and len(cands) == 10
    rows = [Example("prompt", f"q{i}", completion=["yes", "no", "maybe"][i % 3]) for i in range(7)]
    answers, gold, cands = candidate_answers(rows)
    assert answers == ["maybe", "no", "yes"] and gold[:3] == [2, 1, 0] and len(cands) == 21
    open_ended = [Example("prompt", f"q{i}", completion=f"a{i}") for i in range(7)]
    assert candidate_answers(open_ended) is None
    assert candidate_answers([Example("text", "x")]) is None
    many = [Example("prompt", f"q{i}", completion=f"a{i % 9}") for i in range(30)]
    assert candidate_answers(many) is None  # 9 > MAX_LABELS


class _Oracle:
    """A scorer whose NLL per label token is 1.0, or 0.1 for the tokens of ``good`` rows."""

    def __init__(self, good_answer_tokens: set[int]) -> None:
        self.good = good_answer_tokens

    def token_nll(self, batch):
        labels = batch["labels"]
        out = torch.zeros(labels.shape)
        valid = labels != -100
        valid[:, 0] = False
        out[valid] = 1.0
        for b in range(labels.shape[0]):
            if any(int(t) in self.good for t in labels[b][valid[b]]):
                out[b][valid[b]] = 0.1
        return out


def test_accuracy_is_argmax_candidate_log_likelihood_and_loss_is_gold_rows():
    tok = byte_level_tokenizer()
    rows = _classify_rows()
    es = build_eval_set(rows, tok, 48)
    assert es.classification and es.cand_input_ids.shape == (10, 48)
    # the byte tokenizer: " 긍정" (label 1) starts with byte 0x20 then 0xEA...; make the positive
    # answer's first byte "good" → every row predicts label 1 (index 1)
    pos_first = tok.encode(" 긍정", add_special_tokens=False)[1]
    neg_first = tok.encode(" 부정", add_special_tokens=False)[1]
    assert pos_first != neg_first
    rs = score_rows(_Oracle({pos_first}), es, batch_size=3)
    assert rs.pred == [1] * 5 and rs.gold == [0, 1, 0, 1, 0]
    res = evaluate(_Oracle({pos_first}), es, batch_size=3)
    assert res.accuracy == pytest.approx(2 / 5)
    n_tok = len(tok.encode(" 긍정", add_special_tokens=False)) + 1  # + eos
    assert res.tokens == 5 * n_tok
    # gold rows: 2 positives at 0.1, 3 negatives at 1.0
    assert res.loss == pytest.approx((2 * 0.1 + 3 * 1.0) / 5)
    assert res.perplexity == pytest.approx(math.exp(res.loss))
    assert res.labels == 2 and res.seconds >= 0


def test_text_rows_give_loss_only_and_padding_rows_do_not_count(tiny):
    tok = byte_level_tokenizer()
    rows = [Example("text", "hello world " * (i + 1)) for i in range(5)]
    es = build_eval_set(rows, tok, 32)
    assert not es.classification
    spec = tiny.spec()
    eng = build_engine(spec)
    s3, c3 = sequence_nll(eng, es.input_ids, es.attention_mask, es.labels, batch_size=3)
    s5, c5 = sequence_nll(eng, es.input_ids, es.attention_mask, es.labels, batch_size=5)
    assert torch.equal(c3, c5)
    torch.testing.assert_close(s3, s5, rtol=1e-5, atol=1e-5)
    res = evaluate(eng, es, batch_size=2)
    assert res.accuracy is None and res.examples == 5 and res.tokens == int(c5.sum())
    assert res.loss == pytest.approx(float(s5.sum()) / int(c5.sum()), rel=1e-5)


class _BiasedOracle:
    """NLL 1.0 per label token; the positive answer costs +0.4 a token (a class prior that the
    total log-likelihood cannot overcome) and -0.3 a token when the document has a "g"."""

    def __init__(self, pos_token: int, g_token: int) -> None:
        self.pos, self.g = pos_token, g_token

    def token_nll(self, batch):
        labels, ids = batch["labels"], batch["input_ids"]
        out = torch.zeros(labels.shape)
        valid = labels != -100
        valid[:, 0] = False
        for b in range(labels.shape[0]):
            per = 1.0
            if any(int(t) == self.pos for t in labels[b][valid[b]]):
                per += 0.4 - (0.3 if (ids[b] == self.g).any() else 0.0)
            out[b][valid[b]] = per
        return out


def test_calibrated_accuracy_removes_the_answer_prior_of_total_log_likelihood():
    tok = byte_level_tokenizer()
    rows = [
        Example("classify", "good movie" if i % 3 == 0 else "bad movie", label=int(i % 3 == 0))
        for i in range(9)
    ]
    pos = tok.encode(" 긍정", add_special_tokens=False)[1]
    g = tok.encode("g", add_special_tokens=False)[0]
    scorer = _BiasedOracle(pos, g)
    plain = evaluate(scorer, build_eval_set(rows, tok, 48), batch_size=4)
    assert plain.accuracy == pytest.approx(6 / 9) and not plain.calibrated  # always " 부정"
    es = build_eval_set(rows, tok, 48, calibrate=True)
    assert es.calibrated and es.null_input_ids.shape[0] == 2
    res = evaluate(scorer, es, batch_size=4)
    assert res.calibrated and res.accuracy == 1.0 and res.accuracy_total == pytest.approx(6 / 9)
    assert res.loss == pytest.approx(plain.loss)  # calibration changes predictions only
    rs = score_rows(scorer, es, batch_size=4)
    assert rs.null_nll is not None and len(rs.null_nll) == 2
