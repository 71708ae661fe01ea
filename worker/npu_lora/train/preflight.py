"""Pre-flight checks of ``npu-lora run``, before anything is written or torch is imported.

:func:`check_out_writable`: ``--out`` (the run directory) can be created and written: no
component of its path is a regular file, and the directory (or its nearest existing ancestor) is
writable (``access(W_OK)``, which also reports a read-only filesystem).

:func:`check_memory`: a memory estimate from the model's widths, ``training.batchSize`` and
``training.seqLen`` against the memory limit. The estimate (bytes), per micro-batch of
``T = batchSize × seqLen`` tokens and ``L`` decoder layers::

    weights      = host-resident parameters × their dtype's bytes
                   (the experts and router in moe.hostDtype; with device.backend cpu also
                    embeddings, attention, norms and LM head in device.dtype)
    trainable    = LoRA parameters × 16 (fp32 weight, gradient, two AdamW moments)
                   (+ the expert parameters × 12 with lora.trainExperts)
    activations  = 4 × T × L × (A + M)
                   A = 6·H            attention side: two norm outputs, q, k, v, attention
                                      output (only with device.backend cpu)
                   M = H + k·3·I      MoE block: its input, and with moe.keepGraph the k routed
                                      experts' gate, up and activation rows (I wide each);
                                      without keepGraph only H (the block is recomputed)
    data         = examples × seqLen × 24 (input ids, labels, attention mask as int64)
    estimate     = weights + trainable + activations + data

with ``H`` hidden size, ``k`` experts per token, ``I`` the expert intermediate size. It leaves out
the framework's own overhead (a few hundred MB) and transient buffers (attention scores, the
LM head's logits at the labelled positions), so it is a lower bound: a run refused by it cannot
fit; a run it passes can still run out of memory.

The limit: ``NPU_LORA_MEMORY_LIMIT`` (bytes, or with a ``Ki``/``Mi``/``Gi`` suffix; ``none``
turns the check off), else the cgroup's memory limit (``memory.max`` of cgroup v2, or v1's
``memory.limit_in_bytes``) when one is set, else ``MemAvailable`` of ``/proc/meminfo``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from npu_lora.api.load import SpecError

GiB = 1 << 30
_SUFFIX = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---------------------------------------------------------------------------------------------
# --out


def check_out_writable(run_dir: Path) -> None:
    """Raise SpecError naming ``--out`` when ``run_dir`` cannot be created or written."""
    p = Path(os.path.abspath(run_dir))
    chain = [p, *p.parents]
    existing = next((q for q in chain if os.path.lexists(q)), None)
    if existing is None:  # pragma: no cover - "/" always exists
        return
    for q in chain:
        if not os.path.lexists(q):
            continue
        if not q.is_dir():
            what = "is a file" if q.is_file() else "is not a directory"
            raise SpecError(
                f"--out: cannot create the run directory {run_dir}: {q} {what}"
                if q != p
                else f"--out: {run_dir} {what}"
            )
        break
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = "permission denied"
        try:
            if os.statvfs(existing).f_flag & os.ST_RDONLY:
                reason = "read-only file system"
        except OSError:
            pass
        target = run_dir if existing == p else existing
        raise SpecError(f"--out: cannot write the run directory {run_dir}: {target}: {reason}")


# ---------------------------------------------------------------------------------------------
# memory


@dataclass
class MemoryEstimate:
    weights: int
    trainable: int
    activations: int
    data: int
    tokens: int
    layers: int

    @property
    def total(self) -> int:
        return self.weights + self.trainable + self.activations + self.data

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.1f} GiB"  # noqa: E731
        return (
            f"{g(self.total)} (weights {g(self.weights)} + optimizer {g(self.trainable)} + "
            f"activations {g(self.activations)} for {self.tokens} tokens per micro-batch × "
            f"{self.layers} layers + data {g(self.data)})"
        )


def model_widths(spec: Any) -> dict[str, Any] | None:
    """The model's config.json fields (presets: the packaged configs), or None if unknown."""
    m = spec.model
    try:
        if m.preset:
            name = f"models/configs/{m.preset}.json"
            cfg = json.loads(resources.files("npu_lora").joinpath(name).read_text())
        else:
            p = Path(m.path).expanduser()
            if m.volume is not None and not p.is_absolute():
                from npu_lora.data.tokenizer import volume_root

                p = volume_root("model") / p
            cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    cfg = dict(cfg.get("text_config") or cfg)
    if m.layers is not None:
        cfg["num_hidden_layers"] = m.layers
    return cfg


def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int | None:
    v = cfg.get(key, default)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def estimate_memory(spec: Any, cfg: dict[str, Any], examples: int = 0) -> MemoryEstimate | None:
    H, L = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    if not H or not L:
        return None
    V = _int(cfg, "vocab_size", 0) or 0
    E = _int(cfg, "num_experts", 0) or 0
    k = _int(cfg, "num_experts_per_tok", 0) or 0
    I_moe = _int(cfg, "moe_intermediate_size", 0) or 0
    nh = _int(cfg, "num_attention_heads", 1) or 1
    hd = _int(cfg, "head_dim", H // nh) or H // nh
    nkv = _int(cfg, "num_key_value_heads", nh) or nh
    on_host_all = spec.device.backend == "cpu"
    t = spec.training
    tokens = t.batch_size * t.seq_len

    experts = L * (3 * E * I_moe * H + E * H)
    attn_dims = {"q_proj": (H, nh * hd), "k_proj": (H, nkv * hd), "v_proj": (H, nkv * hd)}
    attn_dims["o_proj"] = (nh * hd, H)
    attention = L * sum(a * b for a, b in attn_dims.values())
    embed_head = V * H * (1 if cfg.get("tie_word_embeddings") else 2)
    from npu_lora.moe.host_dtype import resolve_host_dtype

    host_dtype = resolve_host_dtype(spec.moe.host_dtype, spec.moe.experts_kernel, log_it=False)
    weights = experts * _BYTES[host_dtype.dtype]
    if on_host_all:
        weights += (attention + embed_head + 2 * L * H) * _BYTES[spec.device.dtype]

    r = spec.lora.r
    lora = L * sum(r * (a + b) for n, (a, b) in attn_dims.items() if n in spec.lora.target_modules)
    trainable = 16 * lora + (12 * experts if spec.lora.train_experts else 0)

    moe_per_token = H + (k * 3 * I_moe if spec.moe.keep_graph else 0)
    attn_per_token = 6 * H if on_host_all else 0
    activations = 4 * tokens * L * (attn_per_token + moe_per_token)
    data = examples * t.seq_len * 24
    return MemoryEstimate(weights, trainable, activations, data, tokens, L)


def parse_bytes(text: str) -> int | None:
    """``"24Gi"`` → bytes; ``none``/``off``/``0`` → None (no check)."""
    s = text.strip()
    if s.lower() in ("", "none", "off", "0", "max"):
        return None
    for suf in ("Ti", "Gi", "Mi", "Ki", ""):
        if s.endswith(suf) and s[: len(s) - len(suf)].strip().isdigit():
            return int(s[: len(s) - len(suf)]) * _SUFFIX[suf]
    raise SpecError(f"NPU_LORA_MEMORY_LIMIT: expected bytes (e.g. 24Gi) or none, got {text!r}")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


#: ``memory_limit``'s source when no limit is set: memory still free, not a limit on the total.
MEMAVAILABLE = "MemAvailable in /proc/meminfo"


def memory_limit() -> tuple[int | None, str]:
    """(bytes, where it came from); None: no limit known or the check is turned off."""
    env = os.environ.get("NPU_LORA_MEMORY_LIMIT")
    if env is not None:
        return parse_bytes(env), "NPU_LORA_MEMORY_LIMIT"
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        v = _read(path)
        if v and v.isdigit() and int(v) < (1 << 60):
            return int(v), f"the cgroup memory limit ({path})"
    info = _read("/proc/meminfo") or ""
    for line in info.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024, MEMAVAILABLE
    return None, "unknown"


def check_memory(spec: Any, examples: int = 0) -> MemoryEstimate | None:
    """Raise SpecError (naming batchSize and seqLen) when the estimate exceeds the limit."""
    limit, source = memory_limit()
    cfg = model_widths(spec)
    est = estimate_memory(spec, cfg, examples) if cfg else None
    if est is None or limit is None or est.total <= limit:
        return est
    t = spec.training
    raise SpecError(
        f"spec.training.batchSize: {t.batch_size} × spec.training.seqLen: {t.seq_len} does not "
        f"fit: the run needs an estimated {est.describe()}, more than the memory limit "
        f"{limit / GiB:.1f} GiB ({source}). Lower spec.training.batchSize or seqLen (use "
        "spec.training.gradAccumulation for a larger effective batch), or fewer model layers; "
        "NPU_LORA_MEMORY_LIMIT=none skips this check."
    )
