"""The device backends, registered in one place (torch-free: the API, the CRD and the operator
read it; the implementations are imported only by ``npu_lora.backends.get_backend``).

A new accelerator backend is one module (a ``npu_lora.backends.base.Backend`` subclass with a
``name``, ``available()`` and a constructor taking the card index) and one :func:`register`
line below, as peft's ``dispatch_*`` functions: ``spec.device.backend``'s enum and the CRD
(its CEL rules), the CLI choices, ``auto``'s order, the card check, the operator's extended
resources and node requirements, the policy's default node-selector and toleration keys (and
the chart's values, checked equal by a test), the compile plan's backends, the precompile step's
compiler and compile device, the compile cache folder, whether the host stands in for the
device (:attr:`BackendEntry.host`) and the sandbox node's capacity all derive from this
registry (``tests/backends/`` adds one and follows it through all of them).
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
    "is_host",
    "names",
    "node_facts",
    "node_keys",
    "partitions",
    "products",
    "register",
    "resolve",
    "taint_keys",
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
    compiler takes only the eager form); ``summary``: a few words for the API reference.

    ``host``: the host computes what the device would (CPU-like: the memory estimate counts
    attention and the head on the host, the LM head takes the host's streaming kernel);
    ``compile_device``: the torch device an ``inductor`` compile targets (the precompile step
    refuses an ``inductor`` backend without one rather than compile for the CPU);
    ``cache_folder``: the folder under ``$XDG_CACHE_HOME`` the compile cache volume is mounted
    at (the compiler's own cache; the graph cache is its ``npu-lora/``; default: the name);
    ``node_keys``/``taint_keys``: the node-label keys (globs) its nodes carry that a run may
    select on, the taint keys a run may tolerate (the policy's defaults); ``sandbox_cards``:
    cards of it on the sandbox's node (0: none);
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
    host: bool = False
    compile_device: str | None = None
    cache_folder: str = ""
    node_keys: tuple[str, ...] = ()
    taint_keys: tuple[str, ...] = ()
    sandbox_cards: int = 0
    runtime_bytes: int | None = None

    @property
    def cache_dir(self) -> str:
        """The compile cache folder's name (``cache_folder``, else the backend's name)."""
        return self.cache_folder or self.name

    def resources(self) -> tuple[str, ...]:
        """Every extended resource its device plugin advertises: the card, its partitions."""
        if self.resource is None:
            return ()
        parts = self.node.partitions if self.node is not None else ()
        return (self.resource, *(f"{self.resource}-{p}" for p, _ in parts))

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


def resolve(backend: str, cards: int) -> BackendEntry:
    """The entry ``backend`` runs as: itself, or for ``auto`` the first backend (in ``auto``'s
    order) that needs cards when ``cards`` > 0, else the first that needs none (what a cluster
    run resolves to)."""
    if backend != AUTO:
        return entry(backend)
    want = cards > 0
    found = next((e for e in _REGISTRY.values() if e.cards == want), None)
    if found is None:
        raise ValueError(
            f"device.backend auto: no registered backend {'with' if want else 'without'} cards"
        )
    return found


def is_host(backend: str) -> bool:
    """Whether backend ``backend`` is CPU-like (its entry's ``host``; ``auto`` and an unknown
    name: not known to be, False)."""
    e = _REGISTRY.get(backend)
    return e is not None and e.host


def node_keys() -> tuple[str, ...]:
    """Every backend's node-label keys (globs), in ``auto``'s order, once each."""
    return tuple(dict.fromkeys(k for e in _REGISTRY.values() for k in e.node_keys))


def taint_keys() -> tuple[str, ...]:
    """Every backend's taint keys (globs), in ``auto``'s order, once each."""
    return tuple(dict.fromkeys(k for e in _REGISTRY.values() for k in e.taint_keys))


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


def example_node(cards: int | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(labels, allocatable)`` of the sandbox's node: of every backend with a resource,
    ``cards`` cards (default: its ``sandbox_cards``; none when 0) as its discovery and device
    plugin would advertise them: with node facts the family, the first product, the count and a
    driver version; the whole cards and every partitioned resource (a real node advertises one
    resource strategy; the sandbox's node offers all of them)."""
    labels: dict[str, str] = {}
    capacity: dict[str, str] = {}
    for e in _REGISTRY.values():
        n_cards = e.sandbox_cards if cards is None else cards
        if e.resource is None or n_cards <= 0:
            continue
        capacity[e.resource] = str(n_cards)
        f = e.node
        if f is None:
            continue
        labels[f.family_label] = f.family
        labels[f.product_label] = f.products[0]
        if f.count_label:
            labels[f.count_label] = str(n_cards)
        if f.driver_label:
            labels[f.driver_label] = "2026.4.0"
        for p, per in f.partitions:
            capacity[e.partition_resource(p)] = str(per * n_cards)
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
register(BackendEntry("furiosa", "npu_lora.backends.furiosa:FuriosaBackend", cards=True, resource="furiosa.ai/rngd", device_gather=False, compiler="furiosa-torch", precompile=True, summary="RNGD via furiosa-torch", sdpa=False, node=RNGD_NODE, cache_folder="furiosa", node_keys=("furiosa.ai/*",), taint_keys=("furiosa.ai/*",), sandbox_cards=8))  # fmt: skip
register(BackendEntry("cuda", "npu_lora.backends.cuda:CudaBackend", cards=True, resource="nvidia.com/gpu", compile_device="cuda", node_keys=("nvidia.com/*",), taint_keys=("nvidia.com/gpu",)))  # fmt: skip
# the cpu backend's runtime: peak RSS of `npu-lora run` of the tiny preset less its estimated
# terms, 478-540 MiB on a Zen 4 guest at seqLen 256-4,096, 632 MiB on one CI host (its CPU not
# seen): the middle of that range (experiments/2026-12-05-memory-fit.md §1, §6)
register(BackendEntry("cpu", "npu_lora.backends.cpu:CpuBackend", summary="the host stands in for the device", host=True, compile_device="cpu", runtime_bytes=560 << 20))  # fmt: skip
