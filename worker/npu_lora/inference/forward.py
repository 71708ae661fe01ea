"""The engine's forward without backward: log-probabilities of the label tokens.

Same path as a training step's forward (``HybridEngine.forward_backward``): embeddings, attention
and head on the device (``engine.embed``, ``engine.attn[i]``, ``DeviceHead.logits``), each MoE
block on the host (``HostMLP``), the LM head only at the label positions. Under ``no_grad``.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def label_logprobs(engine: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_BN, valid_BN)``: the log-probability of each label token of each row (HF label
    convention: ``labels[t+1]`` scored from position t; N = the most label tokens of a row,
    padded), and which of the N entries are real. CPU float32 / bool tensors."""
    from npu_lora.device.graphs import causal_mask, label_gather, positions

    be = engine.backend
    ids, labels = batch["input_ids"], batch["labels"]
    am = batch.get("attention_mask")
    B, S = ids.shape
    dt = engine.device_dtype
    mask = be.to_device(causal_mask(am, B, S, dt))
    pos = be.to_device(positions(B, S))
    lg = label_gather(labels, dt)
    sel = be.to_device(lg.sel_BNS)
    moe = torch.zeros(B, S, engine.config.hidden_size, dtype=dt, device=be.device)
    h = be.call("embed", engine.embed, be.to_device(ids.to(torch.int32)))
    for i, layer in enumerate(engine.layers):
        h, x = be.call("attention", engine.attn[i], h, moe, pos, mask, layer=i)
        moe = layer.mlp(x)
    head = getattr(engine.head, "_orig_mod", engine.head)  # a compiled module's original
    z_BNV = be.call("head_logits", head.logits, h, moe, sel)
    logp_BNV = torch.log_softmax(z_BNV.float().cpu(), dim=-1)
    picked = logp_BNV.gather(-1, lg.labels_BN.long()[..., None]).squeeze(-1)
    valid = lg.w_BN > 0
    return picked * valid, valid


def row_scores(engine: Any, batch: dict[str, torch.Tensor]) -> tuple[list[float], list[int]]:
    """Per row: the summed log-likelihood of its label tokens and their number."""
    logp, valid = label_logprobs(engine, batch)
    return logp.sum(-1).tolist(), valid.sum(-1).tolist()
