"""The worker container's default requests/limits and the ``auto`` memory estimate."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from npu_lora.api import memory
from npu_lora.api.memory import preset_estimate, recommended_limit

from npu_lora_operator.policy.config import AUTO, Body, PodPolicy
from npu_lora_operator.policy.quantities import gib, quantity_bytes
from npu_lora_operator.policy.volumes import memory_volume_bytes

#: the estimate's runtime term: one worker process's interpreter, torch, transformers, peft,
#: tokenizer and kernel extension (measured; npu_lora.api.memory)
RUNTIME_BYTES = memory.RUNTIME_BYTES


def auto_memory(spec: Any, policy: PodPolicy) -> tuple[str, str]:
    """``(quantity, how it was found)``: for a preset, the torch-free estimate
    (:func:`npu_lora.api.memory.preset_estimate`, ``moe.hostDtype: auto`` sized as its widest
    choice, float32; the processes' runtime included) × 1.25, rounded up to a GiB; ``policy.memoryWhenUnknown`` for a
    model given by path (its config is on a volume the operator does not mount: the worker's
    pre-flight checks it against this limit before loading and names the field to set). The
    podTemplate's ``medium: Memory`` emptyDir volumes are added (tmpfs is charged to the pod's
    memory); the expert tensors a ``hugepages-2Mi`` resource holds are taken off (hugetlb pages
    are charged to the pod's hugetlb limit: :func:`npu_lora.api.memory.hugepage_expert_bytes`)."""
    pt = getattr(spec, "pod_template", None)
    tmpfs = memory_volume_bytes(pt.to_api()) if pt is not None else 0
    plus = f" + {gib(tmpfs)} of medium Memory emptyDir" if tmpfs else ""
    est = preset_estimate(spec)
    res = getattr(spec, "resources", None)
    hp = res.hugepages_bytes(memory.HUGEPAGES_RESOURCE) if res is not None else 0
    if est is not None and hp:  # experts on the pod's hugepages-2Mi are not charged to memory
        cfg = memory.text_config(memory.preset_config(spec.model.preset) or {}, spec.model.layers)
        moved = memory.hugepage_expert_bytes(spec, cfg, hp, est.host_dtype)
        if moved:
            est = dataclasses.replace(est, weights=est.weights - moved)
            plus += f" - {gib(moved)} of experts on {memory.HUGEPAGES_RESOURCE}"
    if est is None:
        unknown = policy.memory_when_unknown
        if tmpfs:
            unknown = gib((quantity_bytes(unknown) or 0) + tmpfs)
        return unknown, f"policy.memoryWhenUnknown (model size unknown){plus}"
    return gib(
        recommended_limit(est) + tmpfs
    ), f"estimated from the model ({est.with_limit()}){plus}"


def default_resources(spec: Any, res: Mapping[str, Any], policy: PodPolicy) -> Body:
    """``res`` (the spec's requests/limits as API dicts) with the policy's defaults filled in
    for the keys it leaves unset (``auto`` memory: :func:`auto_memory`)."""
    out: Body = {k: dict(v) for k, v in res.items() if isinstance(v, Mapping)}
    requests = out.get("requests", {})
    limits = out.get("limits", {})
    auto: str | None = None
    for key, target, other in (
        ("requests", requests, limits),
        ("limits", limits, requests),
    ):
        for name, value in policy.defaults(key).items():
            if name in target:
                continue
            if key == "requests" and name in other:
                continue  # a limit without a request: Kubernetes sets the request to the limit
            if value == AUTO:
                if name != "memory":
                    continue
                auto = auto or auto_memory(spec, policy)[0]
                value = auto
            if key == "limits" and name in other:
                req, lim = quantity_bytes(str(other[name])), quantity_bytes(value)
                if name == "memory" and req and lim and lim < req:
                    value = str(other[name])  # never a limit below the spec's request
                elif name != "memory":
                    continue  # a CPU request of the spec's own: leave its limit unset
            target[name] = value
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out
