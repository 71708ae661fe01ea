"""A run's host memory, estimated torch-free: arithmetic on the model's widths and the spec.

One formula for both sides: the operator sizes ``memory: auto`` from it for presets
(:func:`npu_lora_operator.policy.auto_memory`), and the worker's pre-flight
(:mod:`npu_lora.train.preflight`) checks it against its own memory limit for every model, before
it loads a single weight. Nothing here imports torch or looks at the CPU it runs on.

The estimate (bytes), per micro-batch of ``T = batchSize × seqLen`` tokens and ``L`` decoder
layers::

    weights      = host-resident parameters × their dtype's bytes
                   (the experts and router in the host dtype; with device.backend cpu also
                    embeddings, attention, norms and LM head in device.dtype)
    trainable    = LoRA parameters × 16 (fp32 weight, gradient, two AdamW moments)
                   (+ the expert parameters × 12 with lora.trainExperts)
    activations  = 4 × T × L × A + 4 × T × (L·H + Lk·k·3·I) + rows
                   A = 6·H            attention side: two norm outputs, q, k, v, attention
                                      output (only with device.backend cpu)
                   H, k·3·I           MoE block: its input in every layer, and in the Lk layers
                                      that keep their graph the k routed experts' gate, up and
                                      activation rows (I wide each; the other layers recompute)
                   rows               what grows with S² or with the vocabulary, per micro-batch
                                      (npu_lora.api.sizing decides which form runs):
                                      the additive mask B·S·S in device.dtype + its boolean
                                      intermediates (2 bytes), the label gather's one-hot
                                      B·N·S (N up to S) in device.dtype; with device.backend cpu
                                      also the eager attention core's saved probabilities
                                      L·B·heads·S·S + one layer's fp32 scores (rows under
                                      sizing.SDPA_MIN_SEQ; sdpa keeps O(S)), and the LM head's
                                      chunk (3 × its fp32 logits) + dhn B·N·H fp32
                                      (the vocabulary-blocked form cpu runs holds one block
                                      of the same 64 MiB budget + B·N·H fp32 sums: within
                                      it; the mask is counted though plain causal sdpa rows
                                      run without one: an over-count of B·S·S·(dt + 2))
    data         = examples × seqLen × 24 (input ids, labels, attention mask as int64)
    transient    = one layer's expert gate_up_proj (E × 2I × H in the host dtype: the experts
                   are copied into huge pages one tensor at a time), + one more copy of the
                   experts with more than one rank sharing them (every other rank builds its
                   own before it points at the shared one): load_transient_bytes
    runtime      = the backend's runtime (the interpreter, torch, transformers, peft, tokenizers,
                   the stream kernel's extension, the data pipeline, the run's summary plot and
                   TensorBoard writer: RUNTIME_BYTES measured on cpu; UNMEASURED_RUNTIME_BYTES
                   where not measured: furiosa, cuda, auto) + a Hugging Face tokenizer's
                   TOKENIZER_BYTES_PER_TOKEN × vocabulary (a model given by path; a preset's
                   byte-level tokenizer is in the constant)
    estimate     = weights + trainable + activations + data + transient + runtime

With ``R`` > 1 ranks in the worker (``distributed.ranksPerWorker``) every rank holds its own
trainable state, activations, data, runtime and (``device.backend: cpu``) non-expert weights;
the experts are shared (one copy a worker, not with ``lora.trainExperts``), and the launcher
process adds :data:`LAUNCHER_BYTES`.

with ``H`` hidden size, ``k`` experts per token, ``I`` the expert intermediate size; ``Lk`` = L
with ``moe.keepGraph: true`` (and with ``auto`` when no memory limit is given), 0 with ``false``,
and with ``auto`` under a limit the most layers that fit it (:func:`kept_graph_layers`).

The estimate is what a run's peak RSS is expected to be (measured within 15 % at tiny and
Qwen3 widths: experiments/2026-12-05-memory-fit.md); it leaves out the step's short-lived buffers and the
allocator's slack. :func:`recommended_limit` (``memory: auto``) is the estimate × :data:`HEADROOM`
rounded up to a whole GiB; the worker's pre-flight refuses a run whose estimate exceeds its
memory limit, and ``moe.keepGraph`` auto keeps graphs while estimate × HEADROOM fits it.

The host dtype: ``moe.hostDtype`` when the spec sets it. ``auto`` is resolved by the worker on
its own CPU (:mod:`npu_lora.moe.host_dtype`: bfloat16 with the stream kernel's extension or
native bf16, else float32); where that CPU is not at hand (the operator) the estimate assumes
:data:`AUTO_HOST_DTYPE`, the widest choice ``auto`` can make, so an ``auto`` limit is never too
small for what the worker picks (at the price of up to 2x the experts' bytes when it picks
bfloat16: set ``moe.hostDtype: bfloat16`` to size for that).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from npu_lora.api import backends
from npu_lora.api.backends import is_host
from npu_lora.api.sizing import attention_impl, head_chunk_rows, hot_count, tokens_per_pass
from npu_lora.api.volumes import volume_root

GiB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "float8_e4m3fn": 1}
#: 8-bit host experts (``moe.hostDtype``): fp32 scales per (BR x BC) block, BC 0 = a whole row;
#: the router keeps a wide dtype (sized as float32)
Q8_SCALE_BLOCKS = {"int8": (1, 0), "float8_e4m3fn": (128, 128)}
#: what ``moe.hostDtype: auto`` is sized as without the worker's CPU: its widest choice
AUTO_HOST_DTYPE = "float32"
MiB = 1 << 20
#: one training process's runtime on the ``cpu`` backend: python, torch, transformers, peft,
#: tokenizers (a preset's byte-level one), the stream kernel's extension, the data pipeline,
#: the summary plot and the TensorBoard writer: the cpu registry entry's measured
#: ``runtime_bytes`` (:mod:`npu_lora.api.backends` has the figures)
_CPU_RUNTIME = backends.entry("cpu").runtime_bytes
if _CPU_RUNTIME is None:  # the cpu entry is where the measured runtime lives
    raise ImportError("npu_lora.api.backends: the cpu entry has no runtime_bytes")
RUNTIME_BYTES: int = _CPU_RUNTIME
#: the runtime assumed where it has not been measured (``furiosa``: furiosa-torch and the RNGD
#: runtime; ``cuda``: the CUDA libraries; ``auto``, which may pick either): the allowance
#: ``memory: auto`` has always made for them
UNMEASURED_RUNTIME_BYTES = 2 * GiB
#: a Hugging Face fast tokenizer (``model.path`` / ``model.tokenizer``) per vocabulary entry,
#: loaded: measured on a 151,936-entry byte-level BPE (Qwen3's size)
TOKENIZER_BYTES_PER_TOKEN = 1024
#: the launcher of a worker with more than one local rank (torch imported, no model)
LAUNCHER_BYTES = 224 * MiB
#: ``memory: auto`` = the estimate × this, rounded up to a GiB (transients, allocator slack)
HEADROOM = 1.25


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    trainable: int
    activations: int
    data: int
    tokens: int
    layers: int
    host_dtype: str = AUTO_HOST_DTYPE
    #: decoder layers whose MoE block keeps its graph (``moe.keepGraph``)
    kept_layers: int | None = None
    #: the processes' own memory (the module doc's ``runtime``, all ranks and the launcher)
    runtime: int = 0
    #: training processes in the worker (``distributed.ranksPerWorker``)
    ranks: int = 1
    #: what building the engine holds above the weights for a moment (:func:`load_transient_bytes`)
    transient: int = 0

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.trainable
            + self.activations
            + self.data
            + self.runtime
            + self.transient
        )

    @property
    def limit(self) -> int:
        """``memory: auto``: :func:`recommended_limit`."""
        return recommended_limit(self)

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.1f} GiB" if b >= GiB // 10 else f"{b / MiB:.0f} MiB"  # noqa: E731
        ranks = f" × {self.ranks} ranks" if self.ranks > 1 else ""
        return (
            f"{g(self.total)} (weights {g(self.weights)} in {self.host_dtype} + optimizer "
            f"{g(self.trainable)} + activations {g(self.activations)} for {self.tokens} tokens "
            f"per micro-batch × {self.layers} layers{self._kept()}{ranks} + data "
            f"{g(self.data)} + runtime {g(self.runtime)} + load transient {g(self.transient)})"
        )

    def with_limit(self) -> str:
        """The estimate and ``memory: auto``'s limit, as printed."""
        return f"estimate {self.describe()}; limit {self.limit // GiB} GiB (× {HEADROOM})"

    def _kept(self) -> str:
        k = self.kept_layers
        return "" if k is None or k == self.layers else f", {k} keeping the MoE graph"


def preset_config(preset: str) -> dict[str, Any] | None:
    """A preset's packaged ``config.json`` (``npu_lora/models/configs/<preset>.json``), or None
    when there is none (read as a resource: no worker module is imported)."""
    try:
        text = resources.files("npu_lora").joinpath(f"models/configs/{preset}.json").read_text()
        cfg = json.loads(text)
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def text_config(cfg: dict[str, Any], layers: int | None = None) -> dict[str, Any]:
    """The decoder's fields (``text_config`` of a multimodal config), ``model.layers`` applied."""
    inner = cfg.get("text_config")
    out = dict(inner if isinstance(inner, dict) else cfg)
    if layers is not None:
        out["num_hidden_layers"] = layers
    return out


def model_widths(spec: Any) -> dict[str, Any] | None:
    """The model's config.json fields (presets: the packaged configs), or None if unknown."""
    m = spec.model
    if m.preset:
        cfg = preset_config(m.preset)
    else:
        p = Path(m.path).expanduser()
        if m.volume is not None and not p.is_absolute():
            p = volume_root("model") / p
        try:
            cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    if not isinstance(cfg, dict):
        return None
    return text_config(cfg, m.layers)


def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int | None:
    v = cfg.get(key, default)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def assumed_host_dtype(spec: Any) -> str:
    """``moe.hostDtype``, or :data:`AUTO_HOST_DTYPE` for ``auto``."""
    requested = spec.moe.host_dtype
    return requested if requested in DTYPE_BYTES else AUTO_HOST_DTYPE


def estimate(
    spec: Any,
    cfg: dict[str, Any],
    examples: int = 0,
    host_dtype: str | None = None,
    kept_layers: int | None = None,
) -> MemoryEstimate | None:
    """The estimate for ``spec`` on a model with config ``cfg`` (:func:`text_config` applied);
    ``host_dtype`` the resolved one (default :func:`assumed_host_dtype`); ``kept_layers`` the
    layers keeping their MoE graph under ``moe.keepGraph`` omitted (auto) (default: all). None without
    the model's hidden size or layer count."""
    H, L = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    if not H or not L:
        return None
    host = host_dtype or assumed_host_dtype(spec)
    V = _int(cfg, "vocab_size", 0) or 0
    E = _int(cfg, "num_experts", 0) or 0
    k = _int(cfg, "num_experts_per_tok", 0) or 0
    I_moe = _int(cfg, "moe_intermediate_size", 0) or 0
    nh = _int(cfg, "num_attention_heads", 1) or 1
    hd = _int(cfg, "head_dim", H // nh) or H // nh
    nkv = _int(cfg, "num_key_value_heads", nh) or nh
    on_host_all = is_host(spec.device.backend)  # the host stands in for the device
    t = spec.training
    tokens = tokens_per_pass(t.batch_size, t.seq_len)
    ranks = worker_ranks(spec)

    experts = L * (3 * E * I_moe * H + E * H)
    attn_dims = {"q_proj": (H, nh * hd), "k_proj": (H, nkv * hd), "v_proj": (H, nkv * hd)}
    attn_dims["o_proj"] = (nh * hd, H)
    attention = L * sum(a * b for a, b in attn_dims.values())
    embed_head = V * H * (1 if cfg.get("tie_word_embeddings") else 2)
    weights = _expert_weight_bytes(host, L, E, H, I_moe)
    if spec.lora.train_experts:  # trained experts are per rank (not shared)
        weights *= ranks
    if on_host_all:
        weights += ranks * (attention + embed_head + 2 * L * H) * DTYPE_BYTES[spec.device.dtype]

    r = spec.lora.r
    lora = L * sum(r * (a + b) for n, (a, b) in attn_dims.items() if n in spec.lora.target_modules)
    trainable = 16 * lora + (12 * experts if spec.lora.train_experts else 0)

    kg = spec.moe.keep_graph
    kept = (
        L
        if kg is True
        else 0
        if kg is False
        else min(L, kept_layers if kept_layers is not None else L)
    )
    attn_per_token = 6 * H if on_host_all else 0
    activations = 4 * tokens * (L * attn_per_token + L * H + kept * k * 3 * I_moe)
    activations += long_row_bytes(spec, cfg)
    data = examples * t.seq_len * 24
    runtime = ranks * (runtime_bytes(spec) + tokenizer_bytes(spec, V)) + (
        LAUNCHER_BYTES if ranks > 1 else 0
    )
    return MemoryEstimate(
        weights,
        ranks * trainable,
        ranks * activations,
        ranks * data,
        tokens,
        L,
        host,
        kept,
        runtime,
        ranks,
        load_transient_bytes(spec, host, L, E, H, I_moe, ranks),
    )


def load_transient_bytes(
    spec: Any, host: str, L: int, E: int, H: int, inter: int, ranks: int
) -> int:
    """What building the engine holds above the weights for a moment: the expert tensors are
    copied into huge pages one at a time (:func:`npu_lora.moe.pages.place_experts`: THP
    ``madvise`` or hugetlb), so one layer's ``gate_up_proj`` (E × 2I × H in the host dtype) is
    there twice; and in a worker of more than one rank sharing its experts, every other rank
    builds its own copy of the experts before it points at the shared one (one rank at a time:
    one more copy; ``npu_lora.distributed.launch.build_shared``). Measured: an int8 run at
    Qwen3-30B-A3B widths peaked one ``gate_up_proj`` (384 MiB) above its other terms."""
    width = 1 if host in Q8_SCALE_BLOCKS else DTYPE_BYTES[host]
    out = E * 2 * inter * H * width
    if ranks > 1 and not spec.lora.train_experts:
        out += _expert_weight_bytes(host, L, E, H, inter)
    return out


def worker_ranks(spec: Any) -> int:
    """Training processes in one worker (pod): ``distributed.ranksPerWorker``, else
    ``device.cards`` (at least 1)."""
    d = getattr(spec, "distributed", None)
    return d.ranks(spec.device.cards) if d is not None else 1


def runtime_bytes(spec: Any) -> int:
    """One training process's own memory on ``device.backend`` (its registry entry's measured
    ``runtime_bytes``; :data:`UNMEASURED_RUNTIME_BYTES` where none was measured, and for
    ``auto``)."""
    name = spec.device.backend
    if name not in backends.names():
        return UNMEASURED_RUNTIME_BYTES
    measured = backends.entry(name).runtime_bytes
    return measured if measured is not None else UNMEASURED_RUNTIME_BYTES


def tokenizer_bytes(spec: Any, vocab: int) -> int:
    """A Hugging Face tokenizer's memory (``model.path`` or ``model.tokenizer``: one of
    ``vocab`` entries); 0 for a preset's byte-level tokenizer (in :data:`RUNTIME_BYTES`)."""
    m = spec.model
    return TOKENIZER_BYTES_PER_TOKEN * vocab if (m.path or m.tokenizer) else 0


def long_row_bytes(spec: Any, cfg: dict[str, Any]) -> int:
    """The activations that grow with S² or the vocabulary (the module doc's ``rows``)."""
    t = spec.training
    B, S = t.batch_size, t.seq_len
    dt = DTYPE_BYTES[spec.device.dtype]
    H, L = _int(cfg, "hidden_size", 0) or 0, _int(cfg, "num_hidden_layers", 0) or 0
    V = _int(cfg, "vocab_size", 0) or 0
    nh = _int(cfg, "num_attention_heads", 1) or 1
    out = B * S * S * (dt + 2) + B * S * S * dt  # the mask (+ booleans), the label gather
    if is_host(spec.device.backend):  # attention and head on the host
        if attention_impl(spec.device.backend, S) == "eager":
            out += L * B * nh * S * S * dt + B * nh * S * S * 4
        rows = head_chunk_rows(B, S, V) if V else 0
        out += 3 * B * rows * V * 4 + B * S * H * 4
    return out


def kept_graph_layers(
    spec: Any,
    cfg: dict[str, Any],
    limit: int | None,
    examples: int = 0,
    host_dtype: str | None = None,
) -> int:
    """``moe.keepGraph`` omitted (auto): the most decoder layers whose MoE block may keep its graph
    with the run's estimate × :data:`HEADROOM` within ``limit`` bytes;
    every layer when no limit is known. The others recompute their block in backward."""
    L = _int(cfg, "num_hidden_layers", 0) or 0
    if limit is None:
        return L
    for n in range(L, 0, -1):
        est = estimate(spec, cfg, examples, host_dtype, kept_layers=n)
        if est is not None and int(est.total * HEADROOM) <= limit:
            return n
    return 0


def _expert_weight_bytes(host: str, L: int, E: int, H: int, inter: int) -> int:
    """The MoE blocks' weights on the host: experts + router in ``host``; 8-bit experts add
    their fp32 scales and keep the router in float32."""
    if host not in Q8_SCALE_BLOCKS:
        return L * (3 * E * inter * H + E * H) * DTYPE_BYTES[host]
    br, bc = Q8_SCALE_BLOCKS[host]

    def scales(r: int, c: int) -> int:
        return -(-r // br) * -(-c // (bc or c))

    per_expert = 3 * inter * H + 4 * (scales(2 * inter, H) + scales(H, inter))
    return L * (E * per_expert + 4 * E * H)


def preset_estimate(spec: Any) -> MemoryEstimate | None:
    """The estimate of a preset model's run (None for a model given by path)."""
    if not spec.model.preset:
        return None
    cfg = preset_config(spec.model.preset)
    return estimate(spec, text_config(cfg, spec.model.layers)) if cfg else None


def recommended_limit(est: MemoryEstimate) -> int:
    """``memory: auto``: bytes, a whole number of GiB: the estimate × :data:`HEADROOM`, rounded
    up (the estimate includes the runtime)."""
    return max(1, math.ceil(int(est.total * HEADROOM) / GiB)) * GiB


def device_weight_bytes(spec: Any, cfg: dict[str, Any]) -> int | None:
    """Bytes of the weights one device rank holds, in ``device.dtype``: embeddings, attention
    projections, norms and LM head (the experts stay on the host; with ``moe.placement: hot``
    also the hot experts). A lower bound of the rank's device memory (no activations, LoRA or
    optimizer state): ``spec.device.partition`` is refused when it exceeds one partition's
    memory. None without the model's widths."""
    H, L = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    if not H or not L:
        return None
    V = _int(cfg, "vocab_size", 0) or 0
    nh = _int(cfg, "num_attention_heads", 1) or 1
    hd = _int(cfg, "head_dim", H // nh) or H // nh
    nkv = _int(cfg, "num_key_value_heads", nh) or nh
    attention = L * (2 * H * nh * hd + 2 * H * nkv * hd)
    embed_head = V * H * (1 if cfg.get("tie_word_embeddings") else 2)
    params = attention + embed_head + 2 * L * H
    if spec.moe.placement == "hot":
        E = _int(cfg, "num_experts", 0) or 0
        I_moe = _int(cfg, "moe_intermediate_size", 0) or 0
        hot = hot_count(spec.moe.hot_fraction, E) if E else 0
        params += L * hot * 3 * I_moe * H
    return params * DTYPE_BYTES[spec.device.dtype]


#: the pod resource that backs the host experts with reserved 2 MiB pages (npu_lora.moe.pages)
HUGEPAGES_RESOURCE = "hugepages-2Mi"
HUGE_PAGE = 2 << 20


def hugepage_expert_bytes(
    spec: Any, cfg: dict[str, Any], budget: int, host_dtype: str | None = None
) -> int:
    """Bytes of host expert weights that ``budget`` bytes of 2 MiB pages take off the pod's
    memory: :func:`npu_lora.moe.pages.place_experts` puts each expert tensor (per layer
    ``gate_up_proj`` then ``down_proj``, in layer order) that fits the remaining budget (rounded
    up to whole pages) on them; hugetlb pages are charged to the pod's ``hugepages-2Mi``, not
    to its memory limit."""
    H, L = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    E = _int(cfg, "num_experts", 0) or 0
    I_moe = _int(cfg, "moe_intermediate_size", 0) or 0
    if not H or not L or not E or budget < HUGE_PAGE:
        return 0
    width = DTYPE_BYTES[host_dtype or assumed_host_dtype(spec)]
    moved = 0
    for _ in range(L):
        for n in (E * 2 * I_moe * H * width, E * H * I_moe * width):  # gate_up, down
            pages = -(-n // HUGE_PAGE) * HUGE_PAGE
            if n >= HUGE_PAGE and pages <= budget:
                budget -= pages
                moved += n
    return moved
