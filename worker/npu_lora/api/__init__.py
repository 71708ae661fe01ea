"""The MoEFinetune API (group ``npu-lora.io``, version ``v1alpha1``): pydantic models, torch-free.

One source of truth for the CRD (``npu-lora crd``), the operator, and ``npu-lora run``.
"""

from npu_lora.api.v1alpha1 import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    VERSION,
    MoEFinetune,
    MoEFinetuneSpec,
    MoEFinetuneStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "SINGULAR",
    "VERSION",
    "MoEFinetune",
    "MoEFinetuneSpec",
    "MoEFinetuneStatus",
]
