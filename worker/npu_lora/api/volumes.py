"""Where the operator mounts a run's volumes in the worker pod (torch-free)."""

from __future__ import annotations

import os
from pathlib import Path


def volume_root(kind: str) -> Path:
    """Where a volume is mounted (``NPU_LORA_<KIND>_ROOT``; default: the operator's mounts).

    The operator rewrites paths to absolute ones under these mounts and drops the volumes from
    the worker's config, so this matters only for a manifest with volumes run by hand.
    """
    default = {"model": "/mnt/model", "data": "/mnt/data", "output": "/mnt/output"}[kind]
    return Path(os.environ.get(f"NPU_LORA_{kind.upper()}_ROOT", default))
