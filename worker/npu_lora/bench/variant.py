"""The variant grammar of ``npu-lora bench``: :mod:`npu_lora.api.variant` (the API validates
manifests with it, so it lives in the lowest layer); re-exported here for the bench."""

from npu_lora.api.variant import HOST_MODIFIERS, PEER_MODIFIERS, Variant

__all__ = ["HOST_MODIFIERS", "PEER_MODIFIERS", "Variant"]
