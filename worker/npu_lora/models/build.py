"""Build the base model (preset or local HF directory) and inject LoRA (peft).

Device-independent: everything is built on the CPU in the model dtype (fp32 for presets); the
engine moves the non-MoE parts to the device. The MoE blocks (router + experts) are cast to
``host_dtype``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from npu_lora.api.v1alpha1 import LoraSpec, ModelSpec
from npu_lora.models.presets import preset_config

#: Names of the expert weights made trainable by ``lora.trainExperts``.
EXPERT_PARAM_NAMES = ("gate_up_proj", "down_proj")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_dtype(d: str | torch.dtype) -> torch.dtype:
    return d if isinstance(d, torch.dtype) else _DTYPES[d]


def causal_lm(model: nn.Module) -> nn.Module:
    """The ``*ForCausalLM`` inside a peft model (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers (``model.layers``) of a (peft-wrapped) causal LM."""
    return causal_lm(model).model.layers


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder layers' MoE blocks (``layers[i].mlp`` having ``gate`` and ``experts``)."""
    return [layer.mlp for layer in decoder_layers(model)]


def _config_from_dir(path: Path, layers: int | None, vocab_size: int | None) -> PretrainedConfig:
    cfg = AutoConfig.from_pretrained(str(path))
    if layers is not None:
        if layers > cfg.num_hidden_layers:
            raise ValueError(f"model.layers={layers} > the model's {cfg.num_hidden_layers} layers")
        cfg.num_hidden_layers = layers
        if hasattr(cfg, "max_window_layers"):
            cfg.max_window_layers = min(cfg.max_window_layers, layers)
    cfg.output_router_logits = False
    return cfg


def load_base_model(
    model_spec: ModelSpec,
    *,
    seed: int,
    vocab_size: int | None = None,
    dtype: torch.dtype = torch.float32,
    experts_implementation: str = "grouped_mm",
    model_root: str | Path | None = None,
    quantize: str | None = None,
) -> nn.Module:
    """The base ``*ForCausalLM`` (no LoRA), eager attention, on the CPU.

    - presets: ``from_config`` after ``torch.manual_seed(seed)`` (random init, reproducible);
    - ``path``: a local HF directory (``config.json`` + ``model.safetensors`` or sharded
      ``model.safetensors.index.json``); with ``layers`` only the first N layers are built and
      read (transformers reads the safetensors lazily; keys of the dropped layers are skipped).

    The embedding and LM head grow to ``vocab_size`` when it is larger than the config's.
    """
    kw = dict(attn_implementation="eager", experts_implementation=experts_implementation)
    if model_spec.preset is not None:
        cfg = preset_config(model_spec.preset, layers=model_spec.layers, vocab_size=vocab_size)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kw)
    else:
        path = Path(model_spec.path or "")
        if model_root is not None and not path.is_absolute():
            path = Path(model_root) / path
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path {path}: no config.json")
        cfg = _config_from_dir(path, model_spec.layers, vocab_size)
        torch.manual_seed(seed)
        from npu_lora.models.q8_load import checkpoint_layout, load_quantized

        layout, _ = checkpoint_layout(path)  # refuses quantization_configs it cannot read
        if quantize is not None:  # 8-bit experts, streamed expert by expert (models/q8_load.py)
            model = load_quantized(
                path,
                cfg,
                fmt_name=quantize,
                dtype=dtype,
                experts_implementation=experts_implementation,
            )
        elif layout is not None:
            from npu_lora.api.load import SpecError

            raise SpecError(
                f"model.path {path}: a {layout}; set moe.hostDtype: float8_e4m3fn (keeps its "
                f"bytes) or int8 to train on it"
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(
                str(path), config=cfg, dtype=dtype, use_safetensors=True, **kw
            )
        if vocab_size is not None and vocab_size > model.config.vocab_size:
            model.resize_token_embeddings(vocab_size)
    model.config.use_cache = False
    return model


def inject_lora(model: nn.Module, lora_spec: LoraSpec) -> nn.Module:
    """peft LoRA on ``target_modules``; with ``train_experts`` the experts train in full too."""
    cfg = LoraConfig(
        r=lora_spec.r,
        lora_alpha=lora_spec.alpha,
        lora_dropout=lora_spec.dropout,
        target_modules=list(lora_spec.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, cfg)
    if lora_spec.train_experts:
        for block in moe_blocks(peft_model):
            for name in EXPERT_PARAM_NAMES:
                getattr(block.experts, name).requires_grad_(True)
    return peft_model


def cast_split(model: nn.Module, *, host_dtype: torch.dtype, device_dtype: torch.dtype) -> None:
    """MoE blocks (router + experts) to ``host_dtype``, everything else to ``device_dtype``,
    parameter by parameter (no full-model copy in either dtype)."""
    host = {id(t) for b in moe_blocks(model) for t in (*b.parameters(), *b.buffers())}
    with torch.no_grad():
        for mod in model.modules():
            for p in mod._parameters.values():
                if p is None or not p.is_floating_point() or p.dtype == torch.float8_e4m3fn:
                    continue  # (8-bit experts stay as they are)
                want = host_dtype if id(p) in host else device_dtype
                if p.dtype != want:
                    p.data = p.data.to(want)
            for key, b in mod._buffers.items():
                if (
                    b is not None
                    and b.is_floating_point()
                    and id(b) in host
                    and b.dtype != host_dtype
                ):
                    mod._buffers[key] = b.to(host_dtype)


def build_model(
    model_spec: ModelSpec,
    lora_spec: LoraSpec,
    *,
    seed: int,
    vocab_size: int | None = None,
    host_dtype: str | torch.dtype = "float32",
    experts_implementation: str = "grouped_mm",
    model_root: str | Path | None = None,
    device_dtype: torch.dtype = torch.float32,
    quantize: str | None = None,
) -> tuple[nn.Module, PretrainedConfig]:
    """``(peft_model, hf_config)``: base model + LoRA (peft, on ``lora_spec.target_modules``).

    dtypes: the MoE blocks (router + experts) in ``host_dtype`` (the host computes in it), the
    rest (embeddings, attention, norms, head, LoRA) in ``device_dtype`` (fp32).
    Presets are initialised in fp32 and then cast, so fp32 and bf16 runs start from the same
    weights (up to rounding); local directories are read directly in ``host_dtype`` (e.g. a
    bf16 checkpoint is never materialised in fp32 as a whole) and the non-MoE part upcast.
    With ``lora_spec.train_experts`` the experts' ``gate_up_proj``/``down_proj`` train too.
    ``quantize`` (``int8`` / ``float8_e4m3fn``, :mod:`npu_lora.models.quant`): the frozen experts
    are then held in 8 bits + scales, quantised layer by layer right after the load (the router
    stays in ``host_dtype``).
    """
    hd = to_dtype(host_dtype)
    model = load_base_model(
        model_spec,
        seed=seed,
        vocab_size=vocab_size,
        dtype=torch.float32 if model_spec.preset is not None else hd,
        experts_implementation=experts_implementation,
        model_root=model_root,
        quantize=quantize,
    )
    cast_split(model, host_dtype=hd, device_dtype=device_dtype)
    if quantize is not None and model_spec.preset is not None:
        from npu_lora.models.quant import quantize_experts

        for block in moe_blocks(model):
            quantize_experts(block.experts, quantize)
    peft_model = inject_lora(model, lora_spec)
    return peft_model, peft_model.config
