"""A MoEFinetune as the policy tests build it (unique module name)."""

from __future__ import annotations

from typing import Any

from npu_lora_operator import builders as b


def run(**spec: Any) -> b.Run:
    """Run ``r1`` of namespace ``team`` on the tiny preset; ``spec``: fields set over it."""
    base: dict[str, Any] = {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "example:x"}}
    base.update(spec)
    return b.Run.from_body(
        {"metadata": {"name": "r1", "namespace": "team", "uid": "u1"}, "spec": base}
    )
