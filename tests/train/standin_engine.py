"""A stand-in for ``npu_lora.engine.HybridEngine``: the plain peft model, same interface.

Used by the loop tests to control the engine (e.g. make the loss non-finite) and to test the
loop independently of the hybrid engine. Run as a script it runs ``npu-lora`` with this engine:
``python standin_engine.py run FILE.yaml ...``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from npu_lora.engine.profile import StepProfile as Profile


class _Adapter:
    """The trainable state's part (``engine.adapter``): the peft model's LoRA weights."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(str(path))

    def state_dict(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(self.model).items()}


class _HotSet:
    """The routing counts' part (``engine.hotset``); no device copies to sync."""

    def __init__(self, layers: int, experts: int) -> None:
        self.counts = torch.zeros(layers, experts, dtype=torch.long)

    def routing_counts(self) -> torch.Tensor:
        return self.counts.clone()

    def load_routing_counts(self, counts: torch.Tensor) -> None:
        self.counts = counts.clone()

    def sync_weights(self) -> None:
        pass


class StandinEngine:
    def __init__(self, spec: Any, vocab_size: int | None = None) -> None:
        from npu_lora.models.build import build_model

        self.spec = spec
        self.model, self.config = build_model(
            spec.model, spec.lora, seed=spec.training.seed, vocab_size=vocab_size
        )
        self.backend = None
        self.layers = self.config.num_hidden_layers
        self.experts = self.config.num_experts
        self.adapter = _Adapter(self.model)
        self.hotset = _HotSet(self.layers, self.experts)
        self._hot: dict[str, Any] | None = None
        self.poison_at_call: int | None = None  # make the loss NaN at this forward_backward call
        self.calls = 0

    def forward_backward(self, batch: dict[str, torch.Tensor], loss_scale: float = 1.0) -> Profile:
        self.calls += 1
        t0 = time.perf_counter()
        out = self.model(**batch)
        loss = out.loss
        if self.poison_at_call is not None and self.calls >= self.poison_at_call:
            loss = loss * float("nan")
        (loss * loss_scale).backward()
        self.hotset.counts += 1
        hot = 0 if self._hot is None else int(self._hot["experts"])
        return Profile(
            loss=float(loss.detach()),
            attn_head_s=time.perf_counter() - t0,
            host_fwd_s=0.0,
            host_bwd_s=0.0,
            recompute_s=0.0,
            device_calls_per_layer=1.0 + (1.0 if hot else 0.0),
            tokens=int(batch["input_ids"].numel()),
            hot_experts=hot,
            keep_graph=self.spec.moe.keep_graph,
            placement=self.spec.moe.placement,
        )

    def select_hot_experts(self, step: int) -> dict[str, Any]:
        moe = self.spec.moe
        if moe.placement != "hot" or self._hot is not None or step < moe.warmup_steps:
            return {}
        k = max(1, int(self.experts * moe.hot_fraction))
        per_layer = [list(range(k)) for _ in range(self.layers)]
        self._hot = {
            "fraction": moe.hot_fraction,
            "experts": k * self.layers,
            "selected_at_step": step,
            "per_layer": per_layer,
        }
        return dict(self._hot)

    def hot_state(self) -> dict[str, Any] | None:
        return None if self._hot is None else dict(self._hot)

    def load_hot_state(self, state: dict[str, Any] | None) -> None:
        self._hot = None if state is None else dict(state)


def install() -> None:
    """Make ``npu-lora run`` build this engine."""
    import npu_lora.commands.run as run_cmd

    run_cmd.build_engine = lambda spec, vocab_size: StandinEngine(spec, vocab_size)  # type: ignore[assignment]


if __name__ == "__main__":
    install()
    from npu_lora.cli import main

    sys.exit(main(sys.argv[1:]))
