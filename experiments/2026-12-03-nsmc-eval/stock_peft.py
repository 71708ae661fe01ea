"""Stock transformers + peft on the same NSMC rows as an ``npu-lora run`` of a spec (issue 27 item 5).

Same spec file as ours: the tiny model built from the same preset config and seed
(``npu_lora.models.build.build_model`` = ``AutoModelForCausalLM.from_config`` after
``torch.manual_seed(seed)`` + ``peft.get_peft_model``), the same tokenised rows in the same order
(``npu_lora.data.prepare_data``: ``TokenizedDataset.batch(step, ...)``), the same LoRA config,
AdamW(lr, weight_decay), transformers' scheduler, gradient clipping and batch size; evaluated
with the same scorer (``npu_lora.evaluate.evaluate`` on the HF model) at the same steps.
What differs: the forward/backward is transformers' own (eager attention, ``grouped_mm``
experts, full-sequence logits, ``model(..., labels=...).loss``), everything fp32.

    python experiments/2026-12-03-nsmc-eval/stock_peft.py examples/tiny-nsmc-eval.yaml \
        --out /tmp/stock.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from npu_lora.api.load import load_manifest
from npu_lora.data import prepare_data
from npu_lora.evaluate import evaluate
from npu_lora.evaluate.heldout import prepare_eval
from npu_lora.models.build import build_model
from transformers import get_scheduler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", help="the MoEFinetune YAML that `npu-lora run` trained")
    ap.add_argument("--out", help="write the result JSON here")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args(argv)

    spec = load_manifest(args.spec, args.overrides).spec
    t = spec.training
    t_all = time.perf_counter()
    ds, tok = prepare_data(spec)
    evalset = prepare_eval(spec, tok)
    assert evalset is not None, "the spec needs spec.eval"
    total = t.total_steps(len(ds))

    model, _ = build_model(
        spec.model,
        spec.lora,
        seed=t.seed,
        vocab_size=len(tok),
        host_dtype="float32",
        experts_implementation="grouped_mm",
    )
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay)
    name = {"constant": "constant_with_warmup"}.get(t.scheduler, t.scheduler)
    sched = get_scheduler(name, opt, num_warmup_steps=t.warmup_for(total), num_training_steps=total)
    max_norm = t.max_grad_norm if t.max_grad_norm is not None else float("inf")
    every = spec.eval.every_steps
    ebs = spec.eval.batch_size or t.batch_size

    evals, losses = [], []
    train_s = eval_s = 0.0
    for step in range(1, total + 1):
        t0 = time.perf_counter()
        for m in range(t.grad_accumulation):
            b = ds.batch(step, m, t.batch_size, t.grad_accumulation)
            kw = {
                k: b[k] for k in ("input_ids", "attention_mask", "labels", "position_ids") if k in b
            }
            loss = model(**kw).loss / t.grad_accumulation
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        train_s += time.perf_counter() - t0
        losses.append(float(loss) * t.grad_accumulation)
        if step == total or (every is not None and step % every == 0):
            res = evaluate(model, evalset, batch_size=ebs)
            model.train()
            eval_s += res.seconds
            rec = {"step": step, **res.to_dict()}
            evals.append(rec)
            print(json.dumps(rec), flush=True)
        if step % 50 == 0:
            print(
                f"step {step}/{total} loss {sum(losses[-50:]) / 50:.4f} train_s {train_s:.1f}",
                file=sys.stderr,
                flush=True,
            )
    out = {
        "spec": args.spec,
        "steps": total,
        "train_seconds": train_s,
        "eval_seconds": eval_s,
        "wall_seconds": time.perf_counter() - t_all,
        "final": evals[-1],
        "evals": evals,
        "train_loss": losses,
    }
    print(json.dumps({k: v for k, v in out.items() if k not in ("evals", "train_loss")}))
    if args.out:
        Path(args.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
