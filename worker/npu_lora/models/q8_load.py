"""Load a local Hugging Face directory with 8-bit host experts (``moe.hostDtype: int8 |
float8_e4m3fn``), streaming the experts one at a time.

The model is built on the ``meta`` device, its experts' parameters replaced by 8-bit ones, then
materialised (``to_empty``): the experts are allocated only in 8 bits. The safetensors are read
tensor by tensor (``safe_open``): every non-expert weight in the model's dtype, and each expert's
``gate_proj`` / ``up_proj`` / ``down_proj`` (checkpoints on disk store them per expert:
``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``; a checkpoint written by
transformers 5.x may hold the fused ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj
[E, H, I]`` instead, also read) converted into the host format one expert at a time, so the peak
holds one expert in a wider dtype, never the experts.

Checkpoint layouts read (``config.json`` ``quantization_config``):

- none: bf16 / fp32 weights, each expert quantised at load (:mod:`npu_lora.models.quant`);
- fine-grained FP8 (``quant_method: fp8``, ``weight_block_size: [128, 128]``, as Qwen's
  ``*-FP8`` checkpoints and DeepSeek-V3): e4m3 ``weight`` + fp32 ``weight_scale_inv``
  ``[ceil(out/128), ceil(in/128)]``, the weight being ``weight * weight_scale_inv`` per block;
- compressed-tensors FP8 (``quant_method: compressed-tensors``, a config group with ``weights``
  ``num_bits: 8``, ``type: float``, ``strategy: channel`` or ``tensor``): e4m3 ``weight`` +
  ``weight_scale`` ``[out, 1]`` (or a scalar).

With ``hostDtype: float8_e4m3fn`` the experts' e4m3 bytes and scales are kept as they are (the
fused ``gate_up_proj`` stacks the gate and up blocks, which needs ``I`` to be a multiple of the
block rows; otherwise that expert is re-quantised); with ``int8`` each expert is dequantised and
re-quantised. Non-expert FP8 weights (attention projections) are dequantised to the model dtype.
Any other ``quantization_config`` is refused (:class:`~npu_lora.api.load.SpecError`, exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npu_lora.api.load import SpecError
from npu_lora.models import quant

FP8_BLOCK = "fine-grained FP8 checkpoint"
CT_FP8 = "compressed-tensors FP8 checkpoint"


def checkpoint_layout(path: Path) -> tuple[str | None, tuple[int, int] | None]:
    """``(layout, block)`` of the directory's ``quantization_config``: ``(None, None)`` for an
    unquantised checkpoint, :data:`FP8_BLOCK` with its ``weight_block_size``, :data:`CT_FP8` with
    ``(1, 0)`` (per channel) or ``(0, 0)`` (per tensor). Raises SpecError for anything else."""
    cfg_file = path / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not qc:
        return None, None

    def refuse(why: str) -> SpecError:
        return SpecError(
            f"{cfg_file}: quantization_config {json.dumps(qc, sort_keys=True)} cannot be read "
            f"({why}); readable: fine-grained FP8 (quant_method fp8 with weight_block_size) and "
            f"compressed-tensors FP8 (8-bit float weights, strategy channel or tensor)"
        )

    method = qc.get("quant_method")
    if method == "fp8":
        bs = qc.get("weight_block_size")
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise refuse(f"fmt {fmt}")
        if not (isinstance(bs, list) and len(bs) == 2 and all(isinstance(b, int) for b in bs)):
            raise refuse("no weight_block_size [rows, cols]")
        return FP8_BLOCK, (int(bs[0]), int(bs[1]))
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        strategies = set()
        for g in groups.values():
            w = (g or {}).get("weights") or {}
            if w.get("num_bits") != 8 or w.get("type") != "float":
                raise refuse(f"weights num_bits {w.get('num_bits')} type {w.get('type')}")
            strategies.add(w.get("strategy"))
        if not strategies or not strategies <= {"channel", "tensor"}:
            raise refuse(f"weight strategy {sorted(map(str, strategies))}")
        if strategies == {"tensor"}:
            return CT_FP8, (0, 0)
        return CT_FP8, (1, 0)
    raise refuse(f"quant_method {method}")


#: experts converted between two :meth:`_Reader.release` calls (16 bf16 experts at Qwen3-30B-A3B
#: widths: 151 MB of checkpoint pages mapped at most)
RELEASE_EXPERTS = 16


class _Reader:
    """Tensors by name across the directory's safetensors files (opened lazily, read one at a
    time)."""

    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        index = path / "model.safetensors.index.json"
        if index.is_file():
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(wm.values()))
        else:
            files = sorted(p.name for p in path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path}: no safetensors files")
        self._path, self._touched = path, set()
        self._handles = {f: safe_open(str(path / f), "pt") for f in files}
        self.where: dict[str, str] = {}
        for f, h in self._handles.items():
            for k in h.keys():  # noqa: SIM118 (a safe_open handle)
                self.where[k] = f

    def release(self) -> None:
        """Reopen the files read since the last call: a handle maps its whole file, and the
        pages read through it stay in this process's RSS (clean page cache, but counted) until
        the handle is dropped. Called every :data:`RELEASE_EXPERTS` experts and after each
        layer, so a load's RSS holds at most that many experts' checkpoint pages."""
        from safetensors import safe_open

        for f in self._touched:
            del self._handles[f]  # the old mapping goes first
            self._handles[f] = safe_open(str(self._path / f), "pt")
        self._touched.clear()

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def get(self, key: str) -> torch.Tensor:
        f = self.where[key]
        self._touched.add(f)
        return self._handles[f].get_tensor(key)


def _scale_key(reader: _Reader, weight_key: str) -> str | None:
    base = weight_key[: -len("weight")]
    for s in ("weight_scale_inv", "weight_scale"):
        if base + s in reader:
            return base + s
    return None


def _dequant_plain(w: torch.Tensor, s: torch.Tensor | None, block: tuple[int, int] | None):
    """A checkpoint tensor to fp32 (FP8: times its scales)."""
    if w.dtype != torch.float8_e4m3fn or s is None:
        return w.float()
    s = s.float()
    if s.numel() == 1:
        return w.float() * s.reshape(())
    R = w.shape[0]
    if s.dim() == 2 and s.shape[1] == 1 and s.shape[0] == R:  # per channel
        return w.float() * s
    return quant.dequantize(w, s, block or (128, 128))


def _expert_parts(reader: _Reader, pfx: str, e: int, block) -> dict[str, tuple[Any, Any]]:
    """Expert ``e``'s ``gate``/``up``/``down`` as ``(weight, scale or None)`` from the checkpoint
    (per-expert keys, or slices of fused ones)."""
    out = {}
    for part in ("gate", "up", "down"):
        k = f"{pfx}.{e}.{part}_proj.weight"
        if k in reader:
            sk = _scale_key(reader, k)
            out[part] = (reader.get(k), reader.get(sk) if sk else None)
    if len(out) == 3:
        return out
    gu_k, dn_k = f"{pfx}.gate_up_proj", f"{pfx}.down_proj"
    if gu_k in reader and dn_k in reader:  # fused (transformers 5.x save_pretrained)
        gu = reader.get(gu_k)[e]
        inter = gu.shape[0] // 2
        return {
            "gate": (gu[:inter], None),
            "up": (gu[inter:], None),
            "down": (reader.get(dn_k)[e], None),
        }
    raise SpecError(f"checkpoint has no weights for {pfx}.{e} (gate/up/down_proj)")


def _fill_experts(
    experts: nn.Module, reader: _Reader, pfx: str, fmt: quant.Format, ck_layout, ck_block
) -> bool:
    """Convert each expert into the module's 8-bit tensors; True when every expert kept its
    checkpoint bytes."""
    q_gu, q_dn = experts.gate_up_proj.data, experts.down_proj.data
    s_gu, s_dn = experts.gate_up_proj_scale, experts.down_proj_scale
    kept_all = True
    inter = q_dn.shape[2]
    keep = ck_layout is not None and fmt.dtype == torch.float8_e4m3fn
    for e in range(q_gu.shape[0]):
        parts = _expert_parts(reader, pfx, e, ck_block)
        (g, gs), (u, us), (d, ds) = parts["gate"], parts["up"], parts["down"]
        kept = False
        if keep and g.dtype == torch.float8_e4m3fn and gs is not None and ds is not None:
            block = quant.block_of(experts)
            gs, us, ds = (
                x.float().reshape(x.shape[0], -1) if x.dim() else x.float() for x in (gs, us, ds)
            )
            aligned = block[0] <= 1 or inter % block[0] == 0
            if aligned and gs.dim() == 2 and gs.shape[1] == s_gu.shape[2]:
                q_gu[e].copy_(torch.cat([g, u]))
                s_gu[e].copy_(torch.cat([gs, us]))
                q_dn[e].copy_(d)
                s_dn[e].copy_(ds)
                kept = True
        if not kept:
            gu_w = torch.cat([_dequant_plain(g, gs, ck_block), _dequant_plain(u, us, ck_block)])
            q_gu[e], s_gu[e] = quant.quantize_expert(gu_w, fmt)
            q_dn[e], s_dn[e] = quant.quantize_expert(_dequant_plain(d, ds, ck_block), fmt)
            kept_all = False
        if (e + 1) % RELEASE_EXPERTS == 0:
            del parts, g, u, d, gs, us, ds  # no view into the old mapping outlives it
            reader.release()
    return kept_all


def load_quantized(
    path: Path,
    cfg: Any,
    *,
    fmt_name: str,
    dtype: torch.dtype,
    experts_implementation: str,
) -> nn.Module:
    """The ``*ForCausalLM`` of ``path`` (config ``cfg``, possibly fewer layers) with 8-bit experts
    in ``fmt_name`` and every other weight in ``dtype``; see the module doc."""
    from transformers import AutoModelForCausalLM

    ck_layout, ck_block = checkpoint_layout(path)
    fmt = quant.FORMATS[fmt_name]
    block = fmt.block
    if ck_layout is not None and fmt.dtype == torch.float8_e4m3fn:
        # keep the checkpoint's own blocks (per channel for compressed-tensors)
        block = ck_block if ck_layout == FP8_BLOCK else (1, 0)
        fmt = quant.Format(fmt.name, fmt.dtype, block, fmt.qmax)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            cfg,
            dtype=dtype,
            attn_implementation="eager",
            experts_implementation=experts_implementation,
        )
    blocks = [layer.mlp for layer in model.model.layers]
    for b in blocks:
        for name in quant.EXPERT_PARAMS:
            p = getattr(b.experts, name)
            q = torch.empty(p.shape, dtype=fmt.dtype, device="meta")
            s = torch.empty(quant.scale_shape(tuple(p.shape), block), device="meta")
            quant.set_quantized(b.experts, name, q, s, block)
    model.to_empty(device="cpu")
    reader = _Reader(path)
    expert_ids = {id(getattr(b.experts, n)) for b in blocks for n in quant.EXPERT_PARAMS}
    missing = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in expert_ids:
                continue
            if name not in reader:
                missing.append(name)
                continue
            t = reader.get(name)
            sk = _scale_key(reader, name) if t.dtype == torch.float8_e4m3fn else None
            p.copy_(_dequant_plain(t, reader.get(sk) if sk else None, ck_block).to(p.dtype))
        kept = True
        for i, b in enumerate(blocks):
            kept &= _fill_experts(
                b.experts, reader, f"model.layers.{i}.mlp.experts", fmt, ck_layout, ck_block
            )
            if ck_layout is None:
                source = "quantised at load, expert by expert"
            elif kept:
                source = f"read from a {ck_layout} (bytes kept)"
            else:
                source = f"re-quantised at load from a {ck_layout}"
            b.experts.quant_source = source
            reader.release()
        # non-persistent buffers (rotary inv_freq): from a freshly built module
        for mod in model.modules():
            if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
                fresh = type(mod)(config=mod.config)
                for k, v in fresh.named_buffers(recurse=False):
                    mod._buffers[k] = v
    if cfg.tie_word_embeddings and "lm_head.weight" in missing:
        missing.remove("lm_head.weight")
        model.tie_weights()
    if missing:
        raise SpecError(f"{path}: checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
    return model


__all__ = ["CT_FP8", "FP8_BLOCK", "checkpoint_layout", "load_quantized"]
