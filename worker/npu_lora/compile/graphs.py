"""The compile plan's graph list as modules: :func:`plan_graphs` builds every entry of a
:class:`~npu_lora.compile.plan.Plan` (torch; the plan itself stays torch-free) at the plan's
widths, shapes, dtype and LoRA settings, from the builders of :mod:`npu_lora.device.examples`.
``npu-lora precompile`` compiles these; ``npu-lora rngd-check --plan`` checks them.
"""

from __future__ import annotations

from typing import Any

import torch

from npu_lora.device.examples import (
    DeviceGraph,
    GraphBuild,
    attention_graph,
    embed_graph,
    gathered_graph,
    head_graph,
    hot_graphs,
)

__all__ = ["config_from_widths", "plan_graphs"]


def config_from_widths(w: dict[str, Any]) -> Any:
    """A one-layer ``Qwen3MoeConfig`` at a plan's widths (``Plan.model``), eager attention."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        hidden_size=w["hidden_size"],
        vocab_size=w["vocab_size"],
        num_attention_heads=w["num_attention_heads"],
        num_key_value_heads=w["num_key_value_heads"],
        head_dim=w["head_dim"],
        attention_bias=w["attention_bias"],
        rms_norm_eps=w["rms_norm_eps"],
        rope_theta=w["rope_theta"],
        num_experts=w["num_experts"],
        num_experts_per_tok=w["num_experts_per_tok"],
        moe_intermediate_size=w["moe_intermediate_size"],
        num_hidden_layers=1,
        max_window_layers=1,
        tie_word_embeddings=False,
        output_router_logits=False,
    )
    cfg._attn_implementation = "eager"
    return cfg


def plan_graphs(plan: Any, names: list[str] | None = None, *, seed: int = 0) -> list[DeviceGraph]:
    """The :class:`DeviceGraph` of every entry of a compile plan (``names``: only these), built
    at the plan's widths, shapes, dtype and LoRA settings (one layer, random weights, fixed
    seed): what ``npu-lora precompile`` compiles and ``npu-lora rngd-check --plan`` checks."""
    cfg = config_from_widths(plan.model)
    run = plan.run
    dtype = getattr(torch, run["device_dtype"])
    b = GraphBuild(cfg, torch.manual_seed(seed), run["batch_size"], run["seq_len"], dtype)
    want = set(names) if names else None
    out: list[DeviceGraph] = []
    attention: DeviceGraph | None = None

    def attn() -> DeviceGraph:
        nonlocal attention
        if attention is None:
            att = next(x for x in plan.entries if x.graph == "DeviceAttentionBlock")
            lora = att.params["lora"]
            attention = attention_graph(
                b,
                int(lora["r"]),
                targets=tuple(lora["target_modules"]),
                alpha=lora["alpha"],
                dropout=float(lora["dropout"]),
            )
        return attention

    for e in plan.entries:
        if want is not None and e.name not in want:
            continue  # built only when asked for (the embed and head hold V x D weights)
        if e.graph == "DeviceEmbed":
            g = embed_graph(b)
        elif e.graph == "DeviceAttentionBlock":
            g = attn()
        elif e.graph == "DeviceHead":
            if e.params.get("lora_head"):
                raise NotImplementedError("LoRA on lm_head: the head graph is not in the catalogue")
            h, moe = attn().example_inputs[:2]
            n = int(e.inputs[2]["shape"][1])
            g = head_graph(b, h, moe, n_bucket=n, name=e.name)
        elif e.graph == "HotExpertsBatched":
            bk = int(e.inputs[0]["shape"][1])
            eh = int(e.inputs[0]["shape"][0])
            g = hot_graphs(b, (bk,), 1.0, eh=eh)[0]
        elif e.graph == "HotExpertsGathered":
            eh, bk = (int(v) for v in e.inputs[1]["shape"])
            hot = hot_graphs(b, (bk,), 1.0, eh=eh)[0]
            g = gathered_graph(b, hot, int(e.inputs[0]["shape"][0]))
        else:
            raise ValueError(f"plan entry {e.name}: unknown graph {e.graph!r}")
        g.name = e.name
        g.plan_key = e.key
        out.append(g)
    return out
