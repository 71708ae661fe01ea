"""The trainable state's owner (:class:`AdapterState`): which parameters train, the adapter on
disk (peft ``save_pretrained`` + ``experts.safetensors`` + the base's fingerprint) and the
in-memory state dict a checkpoint holds. The hot set's part of a checkpoint is
``engine.hotset.HotSet.state``; ``HybridEngine.hot_state`` joins it with the ``auto`` trials.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npu_lora.models.build import EXPERT_PARAM_NAMES
from npu_lora.moe.host_mlp import HostMLP

__all__ = ["EXPERTS_FILE", "AdapterState"]

EXPERTS_FILE = "experts.safetensors"


class AdapterState:
    """LoRA parameters (+ expert weights when ``lora.trainExperts``) of ``model``;
    ``fingerprint``: the base it was built on (``npu_lora.models.fingerprint``), or None."""

    def __init__(
        self, model: nn.Module, mlps: list[HostMLP], fingerprint: dict[str, Any] | None = None
    ) -> None:
        self.model = model
        self.mlps = mlps
        self.fingerprint = fingerprint

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The trainable parameters by (peft) name, in a stable order."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_parameters()]

    def expert_state_dict(self) -> dict[str, torch.Tensor]:
        """Trained expert weights as ``model.layers.<i>.mlp.experts.<name>`` (CPU)."""
        out = {}
        for i, m in enumerate(self.mlps):
            for name in EXPERT_PARAM_NAMES:
                p = getattr(m.experts, name)
                if p.requires_grad:
                    out[f"model.layers.{i}.mlp.experts.{name}"] = p.detach().cpu().contiguous()
        return out

    def save(self, path: str | Path) -> None:
        """peft ``save_pretrained`` (+ ``experts.safetensors`` when experts are trained, keys
        ``model.layers.<i>.mlp.experts.{gate_up_proj,down_proj}``; + the base's fingerprint)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path))
        experts = self.expert_state_dict()
        if experts:
            from safetensors.torch import save_file

            save_file(experts, str(path / EXPERTS_FILE))
        if self.fingerprint:  # which base this adapter belongs to (npu_lora.models.fingerprint)
            from npu_lora.models.fingerprint import FILE

            text = json.dumps(self.fingerprint, indent=2) + "\n"
            (path / FILE).write_text(text, encoding="utf-8")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Trainable weights by (peft) parameter name, CPU copies."""
        return {n: p.detach().cpu().clone() for n, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`state_dict` (device copies of hot experts are the caller's)."""
        params = dict(self.named_parameters())
        missing = set(params) - set(state)
        if missing:
            raise KeyError(f"adapter state lacks {sorted(missing)[:3]}...")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(state[n].to(p.device, p.dtype))
