"""The device backends, registered in one place (torch-free: the API, the CRD and the operator
read it; the implementations are imported only by ``npu_lora.backends.get_backend``).

A new accelerator backend is one module (a ``npu_lora.backends.base.Backend`` subclass with a
``name``, ``available()`` and a constructor taking the card index) and one :func:`register`
line below, as peft's ``dispatch_*`` functions: ``spec.device.backend``'s enum and the CRD,
the CLI choices, ``auto``'s order, the card check, the operator's extended resource and the
compile plan's backends all derive from this registry.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUTO",
    "BackendEntry",
    "accelerators",
    "choices",
    "entry",
    "names",
    "register",
    "unregister",
]

#: the pseudo-backend that picks the first available in registration order
AUTO = "auto"


@dataclass(frozen=True)
class BackendEntry:
    """``implementation``: ``"package.module:Class"``; ``cards``: needs accelerator cards
    (``device.cards >= 1``); ``resource``: the Kubernetes extended resource a card is requested
    as; ``device_gather``: the hot rows may be gathered on the device (``HotLayer``; off where
    that graph is not yet verified); ``compiler``: what compiles its graphs (``inductor``,
    ``furiosa-torch``; ``npu_lora.compile.plan.compiler_id``); ``precompile``: ``device.precompile:
    auto`` is on (compiles that take minutes); ``sdpa``: long rows run torch's memory-efficient
    ``scaled_dot_product_attention`` (``npu_lora.api.sizing.attention_impl``; off where the
    compiler takes only the eager form); ``summary``: a few words for the API reference."""

    name: str
    implementation: str
    cards: bool = False
    resource: str | None = None
    device_gather: bool = True
    compiler: str = "inductor"
    precompile: bool = False
    summary: str = ""
    sdpa: bool = True


_REGISTRY: dict[str, BackendEntry] = {}


def register(e: BackendEntry) -> BackendEntry:
    """Add (or replace) a backend; ``auto`` tries them in registration order."""
    if e.name == AUTO:
        raise ValueError(f"{AUTO!r} is not a backend name")
    _REGISTRY[e.name] = e
    return e


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered backends in ``auto``'s order."""
    return tuple(_REGISTRY)


def choices() -> tuple[str, ...]:
    """``auto`` and the backends, sorted (the API enum, CLI choices)."""
    return (AUTO, *sorted(_REGISTRY))


def accelerators() -> tuple[str, ...]:
    """The backends that need cards, in ``auto``'s order."""
    return tuple(n for n, e in _REGISTRY.items() if e.cards)


def entry(name: str) -> BackendEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown device backend {name!r}; choose one of {choices()}") from None


def describe() -> str:
    """The API's words for ``spec.device.backend``."""

    def one(e: BackendEntry) -> str:
        return f"`{e.name}` ({e.summary})" if e.summary else f"`{e.name}`"

    listed = ", ".join(one(e) for e in _REGISTRY.values())
    return f"{listed}, or `{AUTO}` (the first available of {', '.join(names())})."


def card_resource() -> str | None:
    """The extended resource of ``auto`` with cards (the first accelerator's)."""
    return next((_REGISTRY[n].resource for n in accelerators() if _REGISTRY[n].resource), None)


def card_rule() -> tuple[str, str]:
    """The CEL rule (and its message) that an accelerator backend asks for cards."""
    rule = " || ".join(f"self.backend == '{n}'" for n in accelerators())
    return (
        f"!({rule}) || self.cards >= 1",
        f"cards must be at least 1 with backend {' or '.join(accelerators())}",
    )


# --- the registry (auto's order: the first available wins) -------------------------------------
register(BackendEntry("furiosa", "npu_lora.backends.furiosa:FuriosaBackend", cards=True, resource="furiosa.ai/rngd", device_gather=False, compiler="furiosa-torch", precompile=True, summary="RNGD via furiosa-torch", sdpa=False))  # fmt: skip
register(BackendEntry("cuda", "npu_lora.backends.cuda:CudaBackend", cards=True, resource="nvidia.com/gpu"))  # fmt: skip
register(BackendEntry("cpu", "npu_lora.backends.cpu:CpuBackend", summary="the host stands in for the device"))  # fmt: skip
