"""HybridEngine: device embeddings/attention/head + host MoE blocks (HostMLP) + hot experts.

One micro-batch (``forward_backward``)::

    host: mask_B1SS (additive float), pos_BS (int32), label gather (sel_BNS, labels_BN, w_BN)
    dev : h = DeviceEmbed(ids int32)                               call "embed"
    for each layer i:
      dev : h, x = DeviceAttentionBlock_i(h, moe, pos, mask)       call "attention" (layer i)
      host: moe = layer.mlp(x)   (HostMLP: router + cold experts; hot experts: one device call
                                  "hot_experts" (layer i) with padded dense tensors)
    dev : loss = DeviceHead(h, moe, sel, labels, w)                call "head"
    backward of loss * loss_scale through all of it (HostMLP nodes run on the host).

The decomposition is exact: it computes what the stock ``PeftModel(input_ids, attention_mask,
labels).loss`` computes (tested), apart from GEMM reduction order in the hot bmm and the
summation order of the mean (``sum(w * ce)`` with ``w = 1/#labels``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npu_lora.api.v1alpha1 import MoEFinetuneSpec
from npu_lora.backends import Backend, get_backend
from npu_lora.device.graphs import (
    DeviceAttentionBlock,
    DeviceEmbed,
    DeviceHead,
    causal_mask,
    label_gather,
    positions,
)
from npu_lora.engine.profile import HostTimes, StepProfile
from npu_lora.models.build import (
    EXPERT_PARAM_NAMES,
    build_model,
    causal_lm,
    decoder_layers,
    to_dtype,
)
from npu_lora.moe.host_mlp import HostMLP, install_host_mlp
from npu_lora.moe.hot import (
    HotLayer,
    default_buckets,
    make_hot_layer,
    refresh_hot_layer,
    select_hot,
)
from npu_lora.moe.mode import EngineMode

EXPERTS_FILE = "experts.safetensors"


class HybridEngine:
    """See ``npu_lora.engine`` for the usage contract.

    Attributes: ``model`` (the peft model; its decoder layers' ``mlp`` are ``HostMLP``),
    ``config`` (HF config), ``backend`` (``npu_lora.backends.Backend``), ``mlps`` (the HostMLPs).
    """

    def __init__(
        self,
        model: nn.Module,
        config: Any,
        backend: Backend,
        *,
        placement: str = "hot",
        keep_graph: bool = True,
        overlap: bool = False,
        hot_fraction: float = 0.25,
        warmup_steps: int = 4,
        bucket_sizes: list[int] | tuple[int, ...] | None = None,
        tokens_per_batch: int | None = None,
        train_experts: bool = False,
    ) -> None:
        self.train_experts = train_experts
        self._mode = EngineMode(placement, keep_graph, overlap)  # type: ignore[arg-type]
        self._check_mode(self._mode)
        self._parked_hot: list[HotLayer | None] | None = None
        self.model = model
        self.config = config
        self.backend = backend
        self.hot_fraction = hot_fraction
        self.warmup_steps = warmup_steps
        self.lm = causal_lm(model)
        self.layers = decoder_layers(model)
        self.num_layers = len(self.layers)
        E = self.layers[0].mlp.experts.gate_up_proj.shape[0]
        self.num_experts = E
        self.top_k = int(config.num_experts_per_tok)
        self.times = HostTimes()
        self.counts_LE = torch.zeros(self.num_layers, E, dtype=torch.int64)
        self.mlps: list[HostMLP] = install_host_mlp(
            model,
            backend,
            mode=self,
            times=self.times,
            counts_LE=self.counts_LE,
        )
        self.hot_selected_at: int | None = None
        self._place_on_device()
        self.device_dtype = self.lm.model.embed_tokens.weight.dtype
        inner = self.lm.model
        self.embed = backend.compile(DeviceEmbed(inner.embed_tokens))
        self.attn = [
            backend.compile(
                DeviceAttentionBlock.from_layer(layer, inner.rotary_emb).to(backend.device)
            )
            for layer in self.layers
        ]
        self.head = backend.compile(
            DeviceHead(inner.norm, self.lm.lm_head, int(self.lm.lm_head.weight.shape[0])).to(
                backend.device
            )
        )
        self.bucket_sizes = tuple(sorted(bucket_sizes)) if bucket_sizes else None
        self.tokens_per_batch = tokens_per_batch
        self.model.train()

    # --- mode --------------------------------------------------------------------------------
    @property
    def mode(self) -> EngineMode:
        """The current mode (placement, keep_graph, overlap); change it with :meth:`set_mode`."""
        return self._mode

    @property
    def placement(self) -> str:
        return self._mode.placement

    @property
    def keep_graph(self) -> bool:
        return self._mode.keep_graph

    @property
    def overlap(self) -> bool:
        return self._mode.overlap

    def _check_mode(self, mode: EngineMode) -> None:
        if self.train_experts and mode.placement == "hot":
            raise ValueError("train_experts requires placement host-only")

    def set_mode(self, mode: EngineMode) -> None:
        """Switch the mode between steps (the bench's variants). Kept graphs are freed; leaving
        placement ``hot`` parks the hot set (the MoE blocks run all experts on the host) and
        coming back restores it."""
        self._check_mode(mode)
        for mlp in self.mlps:
            mlp.free_kept()
        if mode.placement != self._mode.placement:
            if mode.placement == "host-only":
                self._parked_hot = [mlp.hot for mlp in self.mlps]
                for mlp in self.mlps:
                    mlp.hot = None
            elif self._parked_hot is not None:
                for mlp, hot in zip(self.mlps, self._parked_hot, strict=True):
                    mlp.hot = hot
                self._parked_hot = None
        self._mode = mode

    # --- placement -----------------------------------------------------------------------------
    def _place_on_device(self) -> None:
        """Everything but the MoE blocks goes to the device; the MoE blocks stay on the host."""
        if self.backend.device.type == "cpu":
            return
        dev = self.backend.device
        host_ids = {id(t) for m in self.mlps for t in (*m.parameters(), *m.buffers())}
        for mod in self.model.modules():
            for p in mod._parameters.values():
                if p is not None and id(p) not in host_ids:
                    p.data = p.data.to(dev)
            for key, b in mod._buffers.items():
                if b is not None and id(b) not in host_ids:
                    mod._buffers[key] = b.to(dev)

    # --- parameters ----------------------------------------------------------------------------
    def trainable_parameters(self) -> list[nn.Parameter]:
        """LoRA parameters (+ expert weights when ``lora.trainExperts``), in a stable order."""
        return [p for _, p in self.model.named_parameters() if p.requires_grad]

    def named_trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    # --- one micro-batch -----------------------------------------------------------------------
    def forward_backward(
        self, batch: dict[str, torch.Tensor], loss_scale: float = 1.0
    ) -> StepProfile:
        """One micro-batch: forward, mean CE over label tokens, backward of ``loss * loss_scale``.

        ``batch``: CPU tensors ``input_ids [B,S] int64``, ``attention_mask [B,S]`` (1 = real
        token; optional), ``labels [B,S] int64`` in the Hugging Face convention (== input_ids
        at answer positions, -100 elsewhere; the logits at t predict ``labels[t+1]``).
        Gradients accumulate into ``.grad``. Returns the micro-batch's ``StepProfile``
        (``loss`` unscaled; 0.0 when the batch has no label token).
        """
        be = self.backend
        be.reset_counts()
        self.times.reset()
        ids = batch["input_ids"]
        am = batch.get("attention_mask")
        labels = batch["labels"]
        B, S = ids.shape
        dt = self.device_dtype

        # host-side inputs (static shapes), then to the device
        mask = be.to_device(causal_mask(am, B, S, dt))
        pos = be.to_device(positions(B, S))
        lg = label_gather(labels, dt)
        sel, lab, w = (be.to_device(t) for t in (lg.sel_BNS, lg.labels_BN, lg.w_BN))
        ids_d = be.to_device(ids.to(torch.int32))
        moe = be.to_device(torch.zeros(B, S, self.config.hidden_size, dtype=dt))

        dev_s = 0.0
        t0 = time.perf_counter()
        h = be.call("embed", self.embed, ids_d)
        dev_s += time.perf_counter() - t0
        for i, layer in enumerate(self.layers):
            t0 = time.perf_counter()
            h, x = be.call("attention", self.attn[i], h, moe, pos, mask, layer=i)
            dev_s += time.perf_counter() - t0
            moe = layer.mlp(x)
        t0 = time.perf_counter()
        loss = be.call("head", self.head, h, moe, sel, lab, w)
        dev_s += time.perf_counter() - t0

        t0 = time.perf_counter()
        if loss.requires_grad:
            (loss * loss_scale).backward()
        be.synchronize()
        bwd_s = time.perf_counter() - t0
        attn_bwd_s = max(bwd_s - self.times.host_bwd_s, 0.0)
        for mlp in self.mlps:  # a kept graph never outlives its step
            mlp.free_kept()

        return StepProfile(
            loss=float(loss.detach().float().cpu()),
            attn_head_s=dev_s + attn_bwd_s,
            host_fwd_s=self.times.host_fwd_s,
            host_bwd_s=self.times.host_bwd_s,
            recompute_s=self.times.recompute_s,
            device_calls_per_layer=be.calls_per_layer(self.num_layers),
            tokens=B * S,
            hot_experts=self.hot_experts_total,
            keep_graph=self.keep_graph,
            placement=self.placement,
            hot_s=self.times.hot_s,
            device_calls=dict(be.calls_by_name),
        )

    # --- hot experts ---------------------------------------------------------------------------
    @property
    def hot_experts_total(self) -> int:
        return sum(m.hot.num_hot for m in self.mlps if m.hot is not None)

    def routing_counts(self) -> torch.Tensor:
        """``[L, E] int64``: tokens routed to each expert, summed over all forwards so far
        (every position incl. padding; recomputes in backward are not counted)."""
        return self.counts_LE.clone()

    def load_routing_counts(self, counts_LE: torch.Tensor) -> None:
        """Restore routing counts (resuming before the hot set is chosen picks the same set)."""
        self.counts_LE.copy_(torch.as_tensor(counts_LE, dtype=torch.int64))

    def _buckets(self) -> tuple[int, ...]:
        if self.bucket_sizes:
            return self.bucket_sizes
        return default_buckets(self.tokens_per_batch or 128, self.top_k)

    def _install_hot(self, experts_per_layer: list[list[int]]) -> None:
        if len(experts_per_layer) != self.num_layers:
            raise ValueError(
                f"hot set has {len(experts_per_layer)} layers, model {self.num_layers}"
            )
        for mlp, ids in zip(self.mlps, experts_per_layer, strict=True):
            mlp.hot = make_hot_layer(
                mlp.experts,
                list(ids),
                self.backend,
                buckets=self._buckets(),
                device_dtype=self.device_dtype,
            )

    def select_hot_experts(self, step: int) -> dict:
        """Call with the number of completed optimizer steps (0 before training).

        With placement ``hot``, the first call with ``step >= warmupSteps`` picks the hot set
        (``moe.hot.select_hot`` on the routing counts so far) and returns its summary
        (``fraction, experts, selected_at_step, per_layer``); every other call (and any call
        with placement ``host-only``) returns ``{}``.
        """
        if self.placement != "hot" or self.hot_selected_at is not None or step < self.warmup_steps:
            return {}
        self._install_hot(select_hot(self.counts_LE, self.hot_fraction))
        self.hot_selected_at = step
        return self.hot_summary()

    def hot_summary(self) -> dict:
        if self.hot_selected_at is None:
            return {}
        return {
            "fraction": self.hot_fraction,
            "experts": self.hot_experts_total,
            "selected_at_step": self.hot_selected_at,
            "per_layer": [list(m.hot.experts) if m.hot else [] for m in self.mlps],
        }

    def hot_state(self) -> dict | None:
        """Serialisable hot set (JSON-able), or ``None`` when none is selected. Keys:
        ``fraction``, ``experts`` (total), ``selected_at_step``, ``per_layer`` (expert ids per
        layer), ``routing_counts`` (``[L][E]`` ints at the time of saving)."""
        if self.hot_selected_at is None:
            return None
        state = self.hot_summary()
        state["routing_counts"] = self.counts_LE.tolist()
        return state

    def load_hot_state(self, state: dict | None) -> None:
        """Restore a hot set saved by ``hot_state`` (copies those experts to the device);
        ``None`` removes the hot set (host-only until the next selection)."""
        if state is None:
            for m in self.mlps:
                m.hot = None
            self.hot_selected_at = None
            return
        if "routing_counts" in state:
            self.counts_LE.copy_(torch.tensor(state["routing_counts"], dtype=torch.int64))
        self._install_hot(state["per_layer"])
        self.hot_selected_at = int(state["selected_at_step"])

    def after_optimizer_step(self) -> None:
        """Keep device copies (hot experts) in sync with host weights after ``opt.step()``.
        A no-op unless hot experts exist and expert weights are trainable."""
        for m in self.mlps:
            if m.hot is not None and any(p.requires_grad for p in m.experts.parameters()):
                refresh_hot_layer(m.hot, m.experts, self.backend)

    # --- saving --------------------------------------------------------------------------------
    def _expert_state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, m in enumerate(self.mlps):
            for name in EXPERT_PARAM_NAMES:
                p = getattr(m.experts, name)
                if p.requires_grad:
                    out[f"model.layers.{i}.mlp.experts.{name}"] = p.detach().cpu().contiguous()
        return out

    def save_adapter(self, path: str | Path) -> None:
        """peft ``save_pretrained`` (+ ``experts.safetensors`` when experts are trained, keys
        ``model.layers.<i>.mlp.experts.{gate_up_proj,down_proj}``)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path))
        experts = self._expert_state_dict()
        if experts:
            from safetensors.torch import save_file

            save_file(experts, str(path / EXPERTS_FILE))

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """Trainable weights by (peft) parameter name, CPU copies: LoRA (+ experts when trained)."""
        return {n: p.detach().cpu().clone() for n, p in self.named_trainable_parameters()}

    def load_adapter_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Inverse of ``adapter_state_dict`` (for resuming); refreshes hot copies."""
        params = dict(self.named_trainable_parameters())
        missing = set(params) - set(state)
        if missing:
            raise KeyError(f"adapter state lacks {sorted(missing)[:3]}...")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(state[n].to(p.device, p.dtype))
        self.after_optimizer_step()


def build_engine(
    spec: MoEFinetuneSpec,
    *,
    vocab_size: int | None = None,
    backend: Backend | str | None = None,
    experts_implementation: str | None = None,
    model_root: str | Path | None = None,
    device_dtype: torch.dtype | None = None,
) -> HybridEngine:
    """Build model (``spec.model``, ``spec.lora``), backend (``spec.device.backend`` unless
    ``backend`` is given) and engine. ``vocab_size``: the tokenizer's size (the embedding grows
    to it). ``experts_implementation``: the host experts kernel (a key of transformers'
    ``ALL_EXPERTS_FUNCTIONS``; default ``spec.moe.expertsKernel``). ``device_dtype``: dtype of
    everything but the MoE blocks (embeddings, attention, norms, head, LoRA; default
    ``spec.device.dtype``). ``moe.hostThreads`` sets ``torch.set_num_threads`` (process-wide)."""
    experts_implementation = experts_implementation or spec.moe.experts_kernel
    if experts_implementation.startswith("npu_lora_"):
        from npu_lora.moe import experts as sorted_experts

        sorted_experts.register()
    from npu_lora.moe.host_dtype import resolve_host_dtype

    host_choice = resolve_host_dtype(spec.moe.host_dtype, experts_implementation)
    if device_dtype is None:
        device_dtype = to_dtype(spec.device.dtype)
    if spec.moe.host_threads:
        torch.set_num_threads(spec.moe.host_threads)
    be = backend if isinstance(backend, Backend) else get_backend(backend or spec.device.backend)
    model, config = build_model(
        spec.model,
        spec.lora,
        seed=spec.training.seed,
        vocab_size=vocab_size,
        host_dtype=to_dtype(host_choice.dtype),
        experts_implementation=experts_implementation,
        model_root=model_root,
        device_dtype=device_dtype,
    )
    engine = HybridEngine(
        model,
        config,
        be,
        placement=spec.moe.placement,
        keep_graph=spec.moe.keep_graph,
        overlap=spec.moe.overlap,
        hot_fraction=spec.moe.hot_fraction,
        warmup_steps=spec.moe.warmup_steps,
        bucket_sizes=spec.moe.bucket_sizes,
        tokens_per_batch=spec.training.batch_size * spec.training.seq_len,
        train_experts=spec.lora.train_experts,
    )
    engine.host_choice = host_choice  # summary.json machine.host, status.host
    return engine
