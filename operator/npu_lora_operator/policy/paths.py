"""The spec's path fields: each names a file or directory on its own section's volume.

In a cluster a path is resolved inside the worker pod, and whatever the pod's filesystem holds
(in the sandbox's ``subprocess`` runtime: the node's, every namespace's claims included) would
otherwise be reachable by an absolute path or a ``..``. So every path field of a MoEFinetune is
relative to the volume it belongs to, never absolute and never climbing (fixed rules, not
configurable; the CRD refuses the same with CEL, the worker re-checks them with ``openat``-style
resolution):

=======================  ==================================================================
``model.path``           relative to ``model.volume`` (required with a path)
``model.tokenizer``      relative to ``model.volume`` (required with a tokenizer)
``data.path``            relative to ``data.volume`` (required), or ``example:<name>``
``eval.path``            relative to ``data.volume`` (required with an eval file)
``output.path``          relative to the output volume, not its root
``resumeFrom``           relative to the output volume (another run directory on it)
=======================  ==================================================================

``npu-lora run`` on a laptop keeps local paths (absolute, ``../shared/...``): these checks
are the cluster's (CRD and operator), not the pydantic models'.
"""

from __future__ import annotations

import re
from typing import Any

from npu_lora_operator.policy.config import Violation

#: the packaged datasets (``data.path: example:<name>``) are read from the worker's package
EXAMPLE_PREFIX = "example:"
EXAMPLE_RE = re.compile(r"example:[a-z0-9][-a-z0-9]*")


def path_problem(path: str, *, root_ok: bool = True) -> str | None:
    """Why ``path`` is not a relative path inside its volume (None when it is)."""
    if "\x00" in path or "\\" in path or any(c in path for c in "\n\r"):
        return "must not contain NUL, backslash or line breaks"
    if path.startswith("/"):
        return "must be relative to its volume (no leading '/')"
    parts = path.split("/")
    if ".." in parts:
        return "must not contain '..' (it may not climb out of its volume)"
    if not root_ok and not [p for p in parts if p not in ("", ".")]:
        return "must name a directory of its own, not the volume root"
    return None


def check_paths(spec: Any) -> list[Violation]:
    """The path fields of a :class:`~npu_lora.api.v1alpha1.MoEFinetuneSpec` (empty: allowed)."""
    out: list[Violation] = []

    def need(field: str, value: str | None, volume: str | None, *, root_ok: bool = True) -> None:
        if value is None:
            return
        if volume is not None:
            out.append(
                Violation(
                    field,
                    f"a path in the pod's filesystem is not allowed: set {volume} and give the "
                    "path relative to it",
                )
            )
            return
        why = path_problem(value, root_ok=root_ok)
        if why is not None:
            out.append(Violation(field, why))

    model, data = spec.model, spec.data
    no_model_vol = None if model.volume is not None else "spec.model.volume"
    need("spec.model.path", model.path, no_model_vol)
    need("spec.model.tokenizer", model.tokenizer, no_model_vol)
    if str(data.path).startswith(EXAMPLE_PREFIX):
        if not EXAMPLE_RE.fullmatch(data.path):
            out.append(Violation("spec.data.path", "example:<name> names a packaged dataset"))
    else:
        need("spec.data.path", data.path, None if data.volume is not None else "spec.data.volume")
    ev = getattr(spec, "eval", None)
    if ev is not None:
        need("spec.eval.path", ev.path, None if data.volume is not None else "spec.data.volume")
    need("spec.output.path", spec.output.path, None, root_ok=False)
    need("spec.resumeFrom", spec.resume_from, None, root_ok=False)
    return out
