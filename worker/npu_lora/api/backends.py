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
    "NodeFacts",
    "accelerators",
    "choices",
    "entry",
    "names",
    "node_facts",
    "partitions",
    "products",
    "register",
    "unregister",
]

#: the pseudo-backend that picks the first available in registration order
AUTO = "auto"


@dataclass(frozen=True)
class NodeFacts:
    """What a backend's Kubernetes device plugin and node feature discovery advertise.

    ``family_label``/``family``: the label every node of the accelerator family carries (the
    operator always requires it); ``product_label``/``products``: the label naming a node's
    product (``spec.device.product`` becomes a required node affinity on it); ``count_label``,
    ``driver_label``: further labels the discovery sets (the sandbox's node carries them);
    ``partitions``: the device plugin's partitioned resources, ``<resource>-<partition>``, with
    how many of them one card gives (``spec.device.partition``); ``partition_memory_gb``:
    the device memory of one partition (GB); ``max_cards``: cards on the largest node."""

    family_label: str
    family: str
    product_label: str
    products: tuple[str, ...]
    count_label: str = ""
    driver_label: str = ""
    partitions: tuple[tuple[str, int], ...] = ()
    partition_memory_gb: tuple[tuple[str, int], ...] = ()
    max_cards: int = 8

    def per_card(self, partition: str) -> int:
        return dict(self.partitions)[partition]

    def memory_gb(self, partition: str) -> int | None:
        return dict(self.partition_memory_gb).get(partition)


@dataclass(frozen=True)
class BackendEntry:
    """``implementation``: ``"package.module:Class"``; ``cards``: needs accelerator cards
    (``device.cards >= 1``); ``resource``: the Kubernetes extended resource a card is requested
    as; ``device_gather``: the hot rows may be gathered on the device (``HotLayer``; off where
    that graph is not yet verified); ``compiler``: what compiles its graphs (``inductor``,
    ``furiosa-torch``; ``npu_lora.compile.plan.compiler_id``); ``precompile``: ``device.precompile:
    auto`` is on (compiles that take minutes); ``sdpa``: long rows run torch's memory-efficient
    ``scaled_dot_product_attention`` (``npu_lora.api.sizing.attention_impl``; off where the
    compiler takes only the eager form); ``summary``: a few words for the API reference;
    ``runtime_bytes``: one worker process's own host memory on this backend (python, torch,
    transformers, the backend's runtime: ``npu_lora.api.memory``'s runtime term), measured; None
    where nobody has measured it (``api.memory.UNMEASURED_RUNTIME_BYTES`` is assumed)."""

    name: str
    implementation: str
    cards: bool = False
    resource: str | None = None
    device_gather: bool = True
    compiler: str = "inductor"
    precompile: bool = False
    summary: str = ""
    sdpa: bool = True
    node: NodeFacts | None = None
    runtime_bytes: int | None = None

    def partition_resource(self, partition: str) -> str:
        """The extended resource of one ``partition`` of a card (``<resource>-<partition>``)."""
        if (
            self.node is None
            or self.resource is None
            or partition not in dict(self.node.partitions)
        ):
            raise ValueError(
                f"device.partition {partition!r}: backend {self.name} has no partitions"
                + (f"; choose one of {partitions()}" if partitions() else "")
            )
        return f"{self.resource}-{partition}"


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


def node_facts() -> tuple[BackendEntry, ...]:
    """The backends whose nodes carry discovery labels (:class:`NodeFacts`), in ``auto``'s
    order."""
    return tuple(e for e in _REGISTRY.values() if e.node is not None)


def products() -> tuple[str, ...]:
    """``spec.device.product``'s values: every backend's products."""
    return tuple(p for e in node_facts() for p in e.node.products)  # type: ignore[union-attr]


def partitions() -> tuple[str, ...]:
    """``spec.device.partition``'s values: every backend's partitions."""
    return tuple(p for e in node_facts() for p, _ in e.node.partitions)  # type: ignore[union-attr]


def node_backend(backend: str, cards: int) -> BackendEntry | None:
    """The backend a run's node facts come from: ``backend``'s entry, or for ``auto`` with
    cards the first accelerator's (what a cluster run resolves to); None when it has none."""
    if backend == AUTO:
        if cards <= 0:
            return None
        e = next((_REGISTRY[n] for n in accelerators()), None)
    else:
        e = _REGISTRY.get(backend)
    return e if e is not None and e.node is not None else None


def example_node(cards: int = 8) -> tuple[dict[str, str], dict[str, str]]:
    """``(labels, allocatable)`` of a node with ``cards`` cards of every backend with node facts,
    as its discovery and device plugin would advertise them: the family, the first product,
    the count and a driver version; the whole cards and every partitioned resource (a real
    node advertises one resource strategy; the sandbox's node offers all of them)."""
    labels: dict[str, str] = {}
    capacity: dict[str, str] = {}
    for e in node_facts():
        f = e.node
        assert f is not None
        labels[f.family_label] = f.family
        labels[f.product_label] = f.products[0]
        if f.count_label:
            labels[f.count_label] = str(cards)
        if f.driver_label:
            labels[f.driver_label] = "2026.4.0"
        if e.resource:
            capacity[e.resource] = str(cards)
        for p, n in f.partitions:
            capacity[e.partition_resource(p)] = str(n * cards)
    return labels, capacity


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


def node_rules() -> list[dict[str, str]]:
    """CEL rules on ``spec.device``: ``product`` and ``partition`` need a backend with node
    facts (or ``auto`` with cards, which resolves to the first accelerator)."""
    with_facts = [e.name for e in node_facts()]
    first = accelerators()[0] if accelerators() else None
    ok = [f"self.backend == '{n}'" for n in with_facts]
    if first in with_facts:
        ok.append(f"(self.backend == '{AUTO}' && self.cards >= 1)")
    cond = " || ".join(ok) or "false"
    return [
        {
            "rule": f"!has(self.{key}) || {cond}",
            "message": f"{key} needs backend {' or '.join(with_facts)} (or auto with cards)",
            "fieldPath": f".{key}",
        }
        for key in ("product", "partition")
    ]


# --- the registry (auto's order: the first available wins) -------------------------------------
#: RNGD nodes as Furiosa's feature discovery labels them and its device plugin advertises them
#: (resource strategies generic / single-core / dual-core / quad-core: 1, 8, 4, 2 per card; a
#: card has 8 cores and 48 GB)
RNGD_NODE = NodeFacts(
    family_label="furiosa.ai/npu.family",
    family="rngd",
    product_label="furiosa.ai/npu.product",
    products=("rngd", "rngd-s", "rngd-max"),
    count_label="furiosa.ai/npu.count",
    driver_label="furiosa.ai/driver.version",
    partitions=(("1core.6gb", 8), ("2core.12gb", 4), ("4core.24gb", 2)),
    partition_memory_gb=(("1core.6gb", 6), ("2core.12gb", 12), ("4core.24gb", 24)),
)
register(BackendEntry("furiosa", "npu_lora.backends.furiosa:FuriosaBackend", cards=True, resource="furiosa.ai/rngd", device_gather=False, compiler="furiosa-torch", precompile=True, summary="RNGD via furiosa-torch", sdpa=False, node=RNGD_NODE))  # fmt: skip
register(BackendEntry("cuda", "npu_lora.backends.cuda:CudaBackend", cards=True, resource="nvidia.com/gpu"))  # fmt: skip
# the cpu backend's runtime: peak RSS of `npu-lora run` of the tiny preset less its estimated
# terms, 496-540 MiB at seqLen 256-4,096 (experiments/2026-12-05-memory-fit.md)
register(BackendEntry("cpu", "npu_lora.backends.cpu:CpuBackend", summary="the host stands in for the device", runtime_bytes=520 << 20))  # fmt: skip
