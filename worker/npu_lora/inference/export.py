"""Merge a run's adapter into its base and write a Hugging Face model directory.

``export_merged(loaded, out)``: the engine's MoE blocks go back to the stock transformers blocks
(``HybridEngine.unwrap_moe``: they share the router and expert weights), peft ``merge_and_unload()``
folds each LoRA pair into its base weight (``W + scaling · B A``), the model is cast to one
dtype and saved with ``save_pretrained`` (safetensors; transformers 5.x writes the fused expert
parameters in the layout its loader reads back), with the tokenizer (its chat template, the
ChatML fallback for the byte-level tokenizer) and a generation config. Written to a temporary
directory next to ``out`` and renamed: ``out`` is either complete or untouched. A run with 8-bit
host experts (``moe.hostDtype: int8 | float8_e4m3fn``) is written dequantised (``q · scale``) in
the export dtype (``--dtype``; ``auto``: the model directory's dtype, float32 for a preset), so
any transformers stack loads it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from npu_lora.api.load import SpecError
from npu_lora.api.outpaths import check_replaceable, write_export_marker
from npu_lora.inference.load import RunDirError


def check_out(out: Path, force: bool, run_dir: Path | None = None) -> None:
    """Refuse ``out`` before anything is loaded: a file, ``/``, ``$HOME``, ``run_dir`` or an
    ancestor of it, a run directory, and a non-empty directory unless ``force`` and it is a
    previous export (its marker lists every file): :func:`npu_lora.api.outpaths.check_replaceable`."""
    try:
        check_replaceable(out, "--merged", force, run_dir)
    except SpecError as e:
        raise RunDirError(str(e)) from None


def export_dtype(loaded: Any, dtype: str) -> torch.dtype:
    """``auto``: the model directory's own dtype (config.json), float32 for a preset."""
    from npu_lora.models.build import to_dtype

    if dtype != "auto":
        return to_dtype(dtype)
    if loaded.spec.model.preset is not None:
        return torch.float32
    cfg = loaded.engine.config
    d = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if isinstance(d, torch.dtype):
        return d
    return to_dtype(str(d)) if str(d) in ("float32", "bfloat16", "float16") else torch.float32


def plain_model(loaded: Any, dtype: torch.dtype) -> Any:
    """The peft model (base + adapter, unmerged) with the stock MoE blocks back in place
    (weights shared, not copied), on the CPU, every weight in ``dtype`` (the engine keeps the
    MoE blocks in the host dtype and the rest in the device dtype)."""
    model = loaded.engine.unwrap_moe()
    from npu_lora.models.build import moe_blocks
    from npu_lora.models.quant import dequantize_experts

    for block in moe_blocks(model):  # 8-bit host experts: written dequantised, in ``dtype``
        dequantize_experts(block.experts, dtype)
    model.to("cpu", dtype)
    return model


def export_merged(loaded: Any, out: Path, *, dtype: str = "auto", force: bool = False) -> Path:
    """Write the merged model to ``out``; returns it. See the module doc."""
    check_out(out, force, loaded.run_dir)
    model = plain_model(loaded, export_dtype(loaded, dtype))
    merged = model.merge_and_unload()
    cfg = merged.config
    cfg.use_cache = True
    impl = getattr(cfg, "experts_implementation", None) or getattr(
        cfg, "_experts_implementation", None
    )
    if isinstance(impl, str) and impl.startswith("npu_lora_"):  # ours: not in plain transformers
        merged.set_experts_implementation("grouped_mm")
    tok = loaded.tokenizer
    for c in (cfg, merged.generation_config):  # serving stacks read either
        c.eos_token_id = tok.eos_token_id
        c.pad_token_id = tok.pad_token_id
        if getattr(tok, "bos_token_id", None) is not None:
            c.bos_token_id = tok.bos_token_id

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        merged.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        write_export_marker(tmp, run=str(loaded.run_dir))
        for p in tmp.iterdir():  # safetensors writes 0600; the directory is for serving
            p.chmod(0o644)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def logits(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float().cpu()


def max_logit_difference(
    reference: torch.Tensor, merged_dir: Path, input_ids: torch.Tensor
) -> float:
    """``max |reference - logits(AutoModelForCausalLM.from_pretrained(merged_dir))|``, loaded
    offline as a user would (its saved dtype)."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(merged_dir), local_files_only=True)
    m.eval()
    return float((reference - logits(m, input_ids)).abs().max())
