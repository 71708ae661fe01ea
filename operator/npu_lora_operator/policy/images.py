"""The worker's image (``spec.image``) and the Secrets the kubelet may pull it with
(``podTemplate.imagePullSecrets``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npu_lora_operator.messages import quote
from npu_lora_operator.policy.common import allowed_name, allowed_text, matches
from npu_lora_operator.policy.config import PodPolicy, Violation

#: the most ``imagePullSecrets`` a podTemplate may list
MAX_PULL_SECRETS = 8


def check_image(image: str | None, policy: PodPolicy, worker_image: str) -> list[Violation]:
    """``spec.image`` against ``allowedImages`` (empty: the operator's worker image only)."""
    images = policy.allowed_images or (worker_image,)
    if not image or image == worker_image or matches(image, images):
        return []
    return [
        Violation(
            "spec.image", f"image {quote(image)} is not allowed ({allowed_text(images, 'image')})"
        )
    ]


def check_pull_secrets(secrets: Any, policy: PodPolicy) -> list[Violation]:
    """``podTemplate.imagePullSecrets``: each ``{name}`` a Secret in
    ``allowedImagePullSecrets`` (empty: none). The kubelet reads a pull secret on the pod's
    behalf, so naming one is using that Secret's registry credentials."""
    if secrets is None:
        return []
    where = "spec.podTemplate.imagePullSecrets"
    if not isinstance(secrets, list) or len(secrets) > MAX_PULL_SECRETS:
        return [Violation(where, f"expected a list of at most {MAX_PULL_SECRETS} items")]
    out: list[Violation] = []
    allowed = allowed_text(policy.allowed_image_pull_secrets, "image pull Secret")
    for i, s in enumerate(secrets):
        name = s.get("name") if isinstance(s, Mapping) else None
        if not isinstance(s, Mapping) or set(s) - {"name"} or not isinstance(name, str):
            out.append(Violation(f"{where}[{i}]", "expected {name: <DNS name>}"))
        elif not allowed_name(name, policy.allowed_image_pull_secrets):
            out.append(
                Violation(
                    f"{where}[{i}].name",
                    f"Secret not allowed as an image pull secret ({allowed}; "
                    "policy.allowedImagePullSecrets)",
                )
            )
    return out
