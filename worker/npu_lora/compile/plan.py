"""The compile plan: every device graph a run compiles, from its spec alone, each with a content key.

Torch-free (the operator computes it too): the model's widths come from the preset's packaged
config or the model directory's ``config.json`` (:func:`npu_lora.api.memory.model_widths`),
the graphs' source is read as text from the package files, and library/compiler versions come
from ``importlib.metadata`` (no import).

The graphs, as the engine builds them (:mod:`npu_lora.engine.hybrid`, :mod:`npu_lora.moe.hot`)::

    embed                 DeviceEmbed          ids [B,S] int32                       forward
    attention             DeviceAttentionBlock h, moe [B,S,D], pos [B,S] int32,      forward+backward
                                               mask [B,1,S,S]       (one graph, all layers;
                                               params.attention: sdpa for long rows on cpu/cuda,
                                               else eager: api.sizing.attention_impl)
    head_n<N>             DeviceHead           h, moe [B,S,D], sel [B,N,S], labels [B,N] int32,
                                               w [B,N] fp32; N = the label bucket (powers of two
                                               below S, and S): the data decides which are used;
                                               long rows: the loss chunk_rows positions at a time
                                               (api.sizing.head_chunk_rows, in the key's params)
    hot_experts_b<Bk>     HotExpertsBatched    x [Eh,Bk,D], r [Eh,Bk]   (placement hot/auto;
                                               Eh = ceil(hotFraction·E); Bk = moe.bucketSizes or
                                               powers of two from 8 to the tokens per step)
    hot_gathered_b<Bk>    HotExpertsGathered   x [T,D], idx [Eh,Bk] int32, r [Eh,Bk]
                                               (cpu/cuda only, where Eh·Bk > T)

The key (:func:`entry_key`): sha256 over the canonical JSON (sorted keys, no spaces) of
``{"v", "name", "graph", "inputs", "weights", "params", "directions", "source", "compiler",
"libraries"}``: input shapes and dtypes, the shapes of the weights/buffers the graph holds, the
constants baked into it (eps, rope theta, LoRA r/alpha/dropout/targets, ...), the sha256 of the
text of the files that define the device graphs (``device/graphs.py``, ``device/ops.py``), the
compiler (``furiosa-torch==V torch==V`` for ``furiosa``; ``torch==V inductor`` for cpu/cuda)
and, for the graphs that trace their code, the transformers and peft versions; for a backend
whose nodes carry a product label (:class:`npu_lora.api.backends.NodeFacts`) also the
``target``: ``{"family", "product"}`` (``spec.device.product``, ``null`` for any product of the
family), so a graph compiled for one product is a cache miss for another. Nothing of the
machine (CPU, environment, paths) enters it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from npu_lora.api import backends as registry
from npu_lora.api.sizing import (
    attention_impl,
    head_chunk_rows,
    head_loss_blocks,
    hot_buckets,
    hot_count,
    label_buckets,
    tokens_per_pass,
)

PLAN_VERSION = 1
#: the files whose text defines the device graphs (relative to the ``npu_lora`` package)
GRAPH_SOURCES = ("device/graphs.py", "device/ops.py")
#: what the worker image pins for RNGD (pyproject's ``rngd`` extra; Dockerfile) — used for the
#: key where furiosa-torch is not installed (the operator, a laptop)
PINNED_FURIOSA_TORCH = "2026.4.0"
PINNED_TORCH_FOR_FURIOSA = "2.10.0"
PLAN_BACKENDS = tuple(sorted(registry.names()))


@dataclass
class PlanEntry:
    """One device graph of the plan."""

    index: int
    name: str
    graph: str  # the module class in npu_lora.device.graphs
    inputs: list[dict[str, Any]]
    weights: list[dict[str, Any]]
    params: dict[str, Any]
    directions: list[str]
    depends_on: list[str]  # the spec fields/widths this graph's key depends on (documentation)
    libraries: dict[str, str] = field(default_factory=dict)
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    backend: str
    compiler: str
    source_digest: str
    model: dict[str, Any]  # the widths the graphs were planned at
    run: dict[str, Any]  # the spec fields that shape the graphs
    entries: list[PlanEntry]
    notes: list[str] = field(default_factory=list)
    target: dict[str, Any] | None = None  # {"family", "product"} (compile_target)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "backend": self.backend,
            "compiler": self.compiler,
            "target": self.target,
            "source_digest": self.source_digest,
            "model": self.model,
            "run": self.run,
            "graphs": [e.to_dict() for e in self.entries],
            "notes": list(self.notes),
        }

    @property
    def keys(self) -> list[str]:
        return [e.key for e in self.entries]

    def by_index(self, index: int) -> PlanEntry:
        if not 0 <= index < len(self.entries):
            raise IndexError(f"graph index {index} outside the plan's 0..{len(self.entries) - 1}")
        return self.entries[index]

    def by_key(self, key: str) -> PlanEntry:
        for e in self.entries:
            if e.key == key:
                return e
        raise KeyError(f"no graph of the plan has key {key}")


# ---------------------------------------------------------------------------------------------
# versions and sources (no imports of torch/transformers/peft)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def compiler_id(backend: str) -> str:
    """The compiler that turns the graphs into device code, with its version as installed here
    (``furiosa``: the worker image's pins where furiosa-torch is not installed)."""
    compiler = registry.entry(backend).compiler if backend in registry.names() else None
    if compiler == "furiosa-torch":
        ft = _version("furiosa-torch")
        if ft is None:
            return f"furiosa-torch=={PINNED_FURIOSA_TORCH} torch=={PINNED_TORCH_FOR_FURIOSA}"
        return f"furiosa-torch=={ft} torch=={_version('torch') or 'unknown'}"
    if compiler == "inductor":
        return f"torch=={_version('torch') or 'unknown'} inductor-{backend}"
    raise ValueError(f"no compiler for backend {backend!r}; choose one of {PLAN_BACKENDS}")


def source_digest(package_root: Path | None = None) -> str:
    """sha256 over the text of :data:`GRAPH_SOURCES` (name, NUL, text, NUL for each), read as
    files of the installed package (``package_root`` to digest another checkout)."""
    h = hashlib.sha256()
    root = resources.files("npu_lora") if package_root is None else package_root
    for rel in GRAPH_SOURCES:
        text = root.joinpath(rel).read_bytes()
        h.update(rel.encode() + b"\0" + text.replace(b"\r\n", b"\n") + b"\0")
    return h.hexdigest()


def compile_target(spec: Any, backend: str) -> dict[str, Any] | None:
    """What the graphs are compiled for beyond the compiler: ``{"family", "product"}`` for a
    backend with node facts (``product``: ``spec.device.product``, None for any product of
    the family), None elsewhere."""
    e = registry.entry(backend) if backend in registry.names() else None
    if e is None or e.node is None:
        return None
    return {"family": e.node.family, "product": getattr(spec.device, "product", None)}


def entry_key(
    entry: PlanEntry,
    *,
    compiler: str,
    source: str,
    plan_version: int = PLAN_VERSION,
    target: dict[str, Any] | None = None,
) -> str:
    """The content key of one graph (see the module doc)."""
    doc = {
        "v": plan_version,
        "name": entry.name,
        "graph": entry.graph,
        "inputs": entry.inputs,
        "weights": entry.weights,
        "params": entry.params,
        "directions": entry.directions,
        "source": source,
        "compiler": compiler,
        "libraries": entry.libraries,
    }
    if target is not None:  # cpu/cuda keys stay as they were
        doc["target"] = target
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# widths


def _i(cfg: dict[str, Any], key: str, default: int | None = None) -> int | None:
    v = cfg.get(key, default)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def widths(cfg: dict[str, Any]) -> dict[str, Any]:
    """The fields of a Qwen3-MoE ``config.json`` that shape the device graphs."""
    D = _i(cfg, "hidden_size")
    H = _i(cfg, "num_attention_heads")
    if not D or not H:
        raise ValueError("the model config has no hidden_size / num_attention_heads")
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    return {
        "hidden_size": D,
        "vocab_size": _i(cfg, "vocab_size"),
        "num_attention_heads": H,
        "num_key_value_heads": _i(cfg, "num_key_value_heads", H),
        "head_dim": _i(cfg, "head_dim", D // H),
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        "rope_type": str(rope.get("rope_type", "default")),
        "num_experts": _i(cfg, "num_experts"),
        "num_experts_per_tok": _i(cfg, "num_experts_per_tok"),
        "moe_intermediate_size": _i(cfg, "moe_intermediate_size"),
        "num_hidden_layers": _i(cfg, "num_hidden_layers"),
    }


def model_config(spec: Any) -> dict[str, Any]:
    """The spec's model config (preset: the packaged config; path: its ``config.json``)."""
    from npu_lora.api.memory import model_widths

    cfg = model_widths(spec)
    if cfg is None:
        raise ValueError(
            f"cannot read the model's config.json (spec.model.path={spec.model.path!r}): the "
            "plan needs the model's widths"
        )
    return cfg


# ---------------------------------------------------------------------------------------------
# the graphs


def _t(name: str, shape: list[int], dtype: str) -> dict[str, Any]:
    return {"name": name, "shape": [int(s) for s in shape], "dtype": dtype}


def resolve_backend(spec: Any, backend: str | None = None) -> str:
    """``backend`` if given, else ``spec.device.backend``; ``auto`` means ``furiosa`` when the
    spec asks for cards (what a cluster run resolves to), else ``cpu``."""
    b = backend or spec.device.backend
    if b == registry.AUTO:  # the first accelerator with cards, else the first without
        want_cards = spec.device.cards > 0
        b = next(n for n in registry.names() if registry.entry(n).cards == want_cards)
    if b not in PLAN_BACKENDS:
        raise ValueError(f"unknown backend {b!r}; choose one of {PLAN_BACKENDS}")
    return b


def compile_plan(
    spec: Any,
    *,
    backend: str | None = None,
    cfg: dict[str, Any] | None = None,
    compiler: str | None = None,
) -> Plan:
    """The compile plan of ``spec`` (a :class:`~npu_lora.api.v1alpha1.MoEFinetuneSpec`)."""
    be = resolve_backend(spec, backend)
    w = widths(cfg if cfg is not None else model_config(spec))
    comp = compiler or compiler_id(be)
    src = source_digest()
    t, lora, moe = spec.training, spec.lora, spec.moe
    B, S, dt = t.batch_size, t.seq_len, spec.device.dtype
    D, V = w["hidden_size"], w["vocab_size"]
    H, K, d = w["num_attention_heads"], w["num_key_value_heads"], w["head_dim"]
    E, k, inter = w["num_experts"], w["num_experts_per_tok"], w["moe_intermediate_size"]
    T = tokens_per_pass(B, S)
    libs = {
        "transformers": _version("transformers") or "unknown",
        "peft": _version("peft") or "unknown",
    }
    entries: list[PlanEntry] = []
    notes: list[str] = []

    def add(**kw: Any) -> None:
        entries.append(PlanEntry(index=len(entries), **kw))

    add(
        name="embed",
        graph="DeviceEmbed",
        inputs=[_t("ids_BS", [B, S], "int32")],
        weights=[_t("embed_tokens", [V, D], dt)],
        params={},
        directions=["forward"],
        depends_on=["training.batchSize", "training.seqLen", "device.dtype", "vocab", "hidden"],
    )
    add(
        name="attention",
        graph="DeviceAttentionBlock",
        inputs=[
            _t("h_BSD", [B, S, D], dt),
            _t("moe_BSD", [B, S, D], dt),
            _t("pos_BS", [B, S], "int32"),
            _t("mask_B1SS", [B, 1, S, S], dt),
        ],
        weights=[
            _t("q_proj", [H * d, D], dt),
            _t("k_proj", [K * d, D], dt),
            _t("v_proj", [K * d, D], dt),
            _t("o_proj", [D, H * d], dt),
            _t("q_norm", [d], dt),
            _t("k_norm", [d], dt),
            _t("input_layernorm", [D], dt),
            _t("post_attention_layernorm", [D], dt),
        ],
        params={
            # api.sizing: sdpa's memory-efficient core for long rows on cpu/cuda, else eager
            "attention": attention_impl(be, S),
            "attention_bias": w["attention_bias"],
            "rms_norm_eps": w["rms_norm_eps"],
            "rope_theta": w["rope_theta"],
            "rope_type": w["rope_type"],
            "lora": {
                "r": lora.r,
                "alpha": lora.alpha,
                "dropout": lora.dropout,
                "target_modules": sorted(lora.target_modules),
            },
        },
        directions=["forward", "backward"],
        depends_on=["training.batchSize", "training.seqLen", "device.dtype", "lora.*", "widths"],
        libraries=libs,
    )
    for n in label_buckets(S):
        rows = head_chunk_rows(B, n, V)
        # long rows on cpu/cuda: the same budget cut across the vocabulary (api.sizing)
        blocks = {"loss_blocks": head_loss_blocks(be)} if rows < n else {}
        add(
            name=f"head_n{n}",
            graph="DeviceHead",
            inputs=[
                _t("h_BSD", [B, S, D], dt),
                _t("moe_BSD", [B, S, D], dt),
                _t("sel_BNS", [B, n, S], dt),
                _t("labels_BN", [B, n], "int32"),
                _t("w_BN", [B, n], "float32"),
            ],
            weights=[_t("norm", [D], dt), _t("lm_head", [V, D], dt)],
            params={
                "rms_norm_eps": w["rms_norm_eps"],
                "lora_head": "lm_head" in lora.target_modules,
                # api.sizing: the loss over label positions `chunk_rows` at a time
                "chunk_rows": rows,
                **blocks,
            },
            directions=["forward", "backward"],
            depends_on=["training.batchSize", "training.seqLen", "device.dtype", "vocab", "hidden"],
            libraries={"transformers": libs["transformers"]},
        )
    hot = moe.placement in ("hot", "auto") and not lora.train_experts
    if hot and moe.hot_memory is not None:
        notes.append(
            "moe.hotMemory: the hot experts per layer are chosen at run time, so the hot-expert "
            "graphs (their Eh) are not in the plan; they compile in the training pod"
        )
        hot = False
    if hot:
        Eh = hot_count(moe.hot_fraction, E)
        buckets = hot_buckets(moe.bucket_sizes, T, k)
        w_hot = [
            _t("w_gate_up_EhFD", [Eh, 2 * inter, D], dt),
            _t("w_down_EhDI", [Eh, D, inter], dt),
        ]
        dep = ["moe.hotFraction", "moe.bucketSizes", "device.dtype", "experts"]
        for bk in buckets:
            add(
                name=f"hot_experts_b{bk}",
                graph="HotExpertsBatched",
                inputs=[_t("x_EhBD", [Eh, bk, D], dt), _t("r_EhB", [Eh, bk], dt)],
                weights=w_hot,
                params={},
                directions=["forward", "backward"],
                depends_on=dep,
            )
        if registry.entry(be).device_gather:  # HotLayer.device_gather (off for furiosa)
            for bk in buckets:
                if Eh * bk > T:
                    add(
                        name=f"hot_gathered_b{bk}",
                        graph="HotExpertsGathered",
                        inputs=[
                            _t("x_TD", [T, D], dt),
                            _t("idx_EhB", [Eh, bk], "int32"),
                            _t("r_EhB", [Eh, bk], dt),
                        ],
                        weights=w_hot,
                        params={},
                        directions=["forward", "backward"],
                        depends_on=[*dep, "training.batchSize", "training.seqLen"],
                    )
    target = compile_target(spec, be)
    for e in entries:
        e.key = entry_key(e, compiler=comp, source=src, target=target)
    run = {
        "batch_size": B,
        "seq_len": S,
        "device_dtype": dt,
        "lora_r": lora.r,
        "lora_targets": sorted(lora.target_modules),
        "placement": moe.placement,
        "hot_fraction": moe.hot_fraction if hot else None,
        "hot_experts_per_layer": hot_count(moe.hot_fraction, E) if hot else None,
        "buckets": list(hot_buckets(moe.bucket_sizes, T, k)) if hot else None,
    }
    return Plan(be, comp, src, w, run, entries, notes, target)


def format_plan(plan: Plan) -> str:
    """The plan as a table (one row per graph)."""
    lines = [
        f"compile plan: {len(plan.entries)} device graphs, backend {plan.backend}, "
        f"compiler {plan.compiler}, source {plan.source_digest[:12]}",
        f"{'#':>3}  {'graph':<20} {'key':<16}  {'dirs':<4}  inputs",
    ]
    for e in plan.entries:
        shapes = ", ".join(f"{i['name']}{list(i['shape'])}:{i['dtype']}" for i in e.inputs)
        dirs = "f+b" if len(e.directions) == 2 else "f"
        how = []  # the long-row forms (api.sizing)
        if "attention" in e.params:
            how.append(f"attention {e.params['attention']}")
        n = e.inputs[2]["shape"][1] if e.graph == "DeviceHead" else None
        if n is not None and e.params.get("loss_blocks") == "vocab":
            how.append("loss in vocabulary blocks")
        elif n is not None and e.params.get("chunk_rows", n) < n:
            how.append(f"loss in chunks of {e.params['chunk_rows']}")
        tail = f"  [{'; '.join(how)}]" if how else ""
        lines.append(f"{e.index:>3}  {e.name:<20} {e.key[:16]}  {dirs:<4}  {shapes}{tail}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return "\n".join(lines)
