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
labels).loss`` computes (tested), apart from GEMM reduction order in the hot bmm and, on the
``cpu`` backend, in the LM head's streaming kernel (``moe.stream_linear.head_linear``), and the summation
order of the mean (``sum(w * ce)`` with ``w = 1/#labels``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from npu_lora.backends import Backend
from npu_lora.device.graphs import (
    DeviceAttentionBlock,
    DeviceEmbed,
    DeviceHead,
    DeviceHeadNLL,
    attention_mask_input,
    label_gather,
    positions,
)
from npu_lora.engine.hooks import (
    DefaultHooks,
    EngineHooks,
    ExpertWeights,
    experts_tensors,
    set_experts_tensors,
)
from npu_lora.engine.hotset import HOT_DECAY, HotSet
from npu_lora.engine.mode import ModeControl
from npu_lora.engine.placement import AUTO_ROUNDS, AutoPlacement
from npu_lora.engine.profile import HostTimes, StepProfile
from npu_lora.engine.state import EXPERTS_FILE, AdapterState
from npu_lora.models.build import causal_lm, decoder_layers
from npu_lora.moe.host_mlp import HostMLP
from npu_lora.moe.mode import EngineMode
from npu_lora.moe.node_pass import LocalPass, arm, disarm, install_pass

__all__ = ["AUTO_ROUNDS", "EXPERTS_FILE", "HOT_DECAY", "HybridEngine"]


class HybridEngine:
    """See ``npu_lora.engine`` for the usage contract. The engine over its parts:

    - ``modes`` (:class:`~npu_lora.engine.mode.ModeControl`): the policy and the current mode;
    - ``hotset`` (:class:`~npu_lora.engine.hotset.HotSet`): the hot experts' lifecycle;
    - ``auto`` (:class:`~npu_lora.engine.placement.AutoPlacement`, placement ``auto`` after
      the selection, else None): the trials and the choice;
    - ``adapter`` (:class:`~npu_lora.engine.state.AdapterState`): trainable state and its I/O;
    - ``hooks`` (:class:`~npu_lora.engine.hooks.EngineHooks`): the bench's strategies.

    Attributes: ``model`` (the peft model; its decoder layers' ``mlp`` are ``HostMLP``),
    ``config`` (HF config), ``backend`` (``npu_lora.backends.Backend``), ``mlps`` (the HostMLPs),
    ``stock_blocks`` (the stock MoE blocks they wrap; they share the weights), and the build's
    facts (``host_choice``, ``experts_pages``; None when not given). No method only passes a
    call on: callers talk to the part that owns the thing (``engine.hotset.summary()``).
    """

    def __init__(
        self,
        model: nn.Module,
        backend: Backend,
        modes: ModeControl,
        hotset: HotSet,
        adapter: AdapterState,
        hooks: EngineHooks | None = None,
        *,
        host_choice: Any = None,
        experts_pages: dict[str, Any] | None = None,
    ) -> None:
        """The parts, each built from its own spec section (:func:`~npu_lora.engine.build_engine`):
        ``model`` (the peft model, its MoE blocks already ``HostMLP``: ``install_host_mlp``),
        ``backend`` (``device.backend``), ``modes`` (``ModeControl.from_spec``: ``moe.placement``,
        ``keepGraph``, ``overlap``), ``hotset`` (``HotSet.from_spec``: the rest of ``moe``),
        ``adapter`` (``AdapterState``: ``lora``), ``hooks`` (the bench's; default: the engine's
        own way). ``host_choice``, ``experts_pages``: the build's facts (summary.json ``machine``,
        ``status.host``)."""
        self.model = model
        self.config = model.config
        self.backend = backend
        self.modes = modes
        modes.on_change = self._mode_changed
        self.hotset = hotset
        self.adapter = adapter
        #: what ``build_engine`` resolved (``summary.json`` ``machine``, ``status.host``)
        self.host_choice = host_choice
        self.experts_pages = experts_pages
        self.lm = causal_lm(model)
        self.layers = decoder_layers(model)
        self.num_layers = len(self.layers)
        self.mlps: list[HostMLP] = hotset.mlps
        self.num_experts = hotset.num_experts
        self.top_k = int(self.config.num_experts_per_tok)
        self.times: HostTimes = self.mlps[0].times  # shared by every HostMLP
        self.counts_LE = hotset.counts_LE  # written by every HostMLP
        self.stock_blocks: list[nn.Module] = [mlp._block for mlp in self.mlps]  # same weights
        self.auto: AutoPlacement | None = None  # placement auto: trials and the choice
        self._auto_agree: Callable[[str], str] | None = None
        self._fb_s = 0.0  # forward_backward wall seconds since the last select_hot_experts
        self.device_dtype = hotset.device_dtype
        self.hooks: EngineHooks = hooks if hooks is not None else DefaultHooks()
        self._own_weights = self.expert_weights()
        inner = self.lm.model
        self.embed = backend.compile(DeviceEmbed(inner.embed_tokens))
        self.attn = [
            backend.compile(
                DeviceAttentionBlock.from_layer(layer, inner.rotary_emb, backend.name).to(
                    backend.device
                )
            )
            for layer in self.layers
        ]
        head = DeviceHead(
            inner.norm,
            self.lm.lm_head,
            int(self.lm.lm_head.weight.shape[0]),
            linear=self.hooks.head_linear(backend),
            backend=backend.name,
        ).to(backend.device)
        self.head = backend.compile(head)
        self._head_module = head
        self._head_nll: Any = None  # DeviceHeadNLL, compiled on the first token_nll
        self.model.train()

    # --- mode (engine.mode.ModeControl; it calls this before every switch) --------------------
    def _mode_changed(self, old: EngineMode, new: EngineMode) -> None:
        for mlp in self.mlps:
            mlp.free_kept()
        if new.placement != old.placement:
            if new.placement == "host-only":
                self.hotset.park()
            else:
                self.hotset.unpark()

    # --- strategies (engine.hooks) --------------------------------------------------------------
    def use_hooks(self, hooks: EngineHooks) -> None:
        """Run with ``hooks`` from the next micro-batch on (the bench's variants); the expert
        weights as they are now are the engine's own (``hooks.expert_weights(own)``)."""
        self.hooks = hooks
        self._own_weights = self.expert_weights()

    def use_expert_pass(self, npass: LocalPass) -> None:
        """Route every layer's host expert compute through ``npass`` (the launcher's
        ``NodePass``: one pass over the worker's ranks; ``moe/node_pass.py``)."""
        install_pass(self.mlps, npass)

    def apply_hooks(self) -> None:
        """Apply what ``hooks`` asks for now (also done by every ``forward_backward``)."""
        want = self.hooks.head_linear(self.backend)
        if self._head_module.linear is not want:
            self._head_module.linear = want
        self.hotset.use_path(self.hooks.hot_path())
        weights = self.hooks.expert_weights(self._own_weights)
        for m, pair in zip(self.mlps, weights or (), strict=bool(weights)):
            if m.experts.gate_up_proj.data_ptr() != pair[0].data_ptr():
                set_experts_tensors(m.experts, pair)  # 8-bit: with the scales and block

    def expert_weights(self) -> ExpertWeights:
        """Per layer the tensors the experts compute with now (``gate_up_proj``, ``down_proj``;
        8-bit experts as :class:`~npu_lora.engine.hooks.Q8Weight`, with their scales)."""
        return [experts_tensors(m.experts) for m in self.mlps]

    def share_expert_weights(self, weights: ExpertWeights) -> None:
        """Compute with ``weights`` (per layer ``gate_up_proj``, ``down_proj``; same shapes and
        dtypes) from now on, as the engine's own: the data-parallel ranks of one pod share one
        copy in shared memory (``npu_lora.distributed.launch``)."""
        if len(weights) != len(self.mlps):
            raise ValueError(f"{len(weights)} layers of expert weights, model {len(self.mlps)}")
        for m, pair in zip(self.mlps, weights, strict=True):
            for p, t in zip((m.experts.gate_up_proj, m.experts.down_proj), pair, strict=True):
                if p.shape != t.shape or p.dtype != t.dtype:
                    raise ValueError("shared expert weights differ in shape/dtype")
                p.data = t
        self._own_weights = self.expert_weights()

    def unwrap_moe(self) -> nn.Module:
        """The peft model with the stock MoE blocks back in its decoder layers (weights shared,
        not copied), for export; the engine does not run afterwards."""
        for layer, block in zip(self.layers, self.stock_blocks, strict=True):
            if isinstance(layer.mlp, HostMLP):
                layer.mlp = block
        return self.model

    def set_experts_implementation(self, impl: str) -> None:
        """The host experts kernel (a key of transformers' ``ALL_EXPERTS_FUNCTIONS``)."""
        if self.lm.config._experts_implementation != impl:
            self.lm.set_experts_implementation(impl)
        # the experts modules hold a reference to the (same) config; make sure
        for m in self.mlps:
            cfg = getattr(m.experts, "config", None)
            if cfg is not None and cfg._experts_implementation != impl:
                cfg._experts_implementation_internal = impl

    @contextmanager
    def stock_model(
        self, blocks: list[tuple[nn.Module, torch.dtype]], attention: str | None = None
    ) -> Iterator[nn.Module]:
        """The peft model with ``blocks`` (module, dtype the input is cast to) as its decoder
        layers' ``mlp`` and (``attention``) another attention implementation, for the duration
        of the ``with``: the stock transformers + peft peer on the same weights."""
        saved = [layer.mlp for layer in self.layers]
        # transformers picks the attention function per call from each module's config
        configs = (
            {id(c): c for m in self.model.modules() if (c := getattr(m, "config", None))}
            if attention
            else {}
        )
        attn_saved = {k: c._attn_implementation for k, c in configs.items()}
        try:
            for c in configs.values():
                c._attn_implementation = attention
            for layer, (block, dtype) in zip(self.layers, blocks, strict=True):
                layer.mlp = _CastBlock(block, dtype)
            yield self.model
        finally:
            for layer, m in zip(self.layers, saved, strict=True):
                layer.mlp = m
            for k, c in configs.items():
                c._attn_implementation = attn_saved[k]

    def keep_graph_layers(self, n: int) -> list[int]:
        """``moe.keepGraph`` omitted (auto): the last ``n`` decoder layers keep their MoE graph, the
        others recompute theirs in backward (every kept graph is alive when the backward starts,
        so which ones does not change the peak; the last layers' are freed first). Returns the
        layers that keep it."""
        L = len(self.mlps)
        n = max(0, min(int(n), L))
        for i, mlp in enumerate(self.mlps):
            mlp.keep_graph_fits = i >= L - n
        return list(range(L - n, L))

    # --- one micro-batch -----------------------------------------------------------------------
    def forward_backward(
        self, batch: dict[str, torch.Tensor], loss_scale: float = 1.0
    ) -> StepProfile:
        """One micro-batch: forward, mean CE over label tokens, backward of ``loss * loss_scale``.

        ``batch``: CPU tensors ``input_ids [B,S] int64``, ``attention_mask [B,S]`` (1 = real
        token; optional), ``position_ids [B,S]`` (optional; packed rows: restart at 0 per
        example, attention stays inside each example), ``labels [B,S] int64`` in the Hugging Face convention (== input_ids
        at answer positions, -100 elsewhere; the logits at t predict ``labels[t+1]``).
        Gradients accumulate into ``.grad``. Returns the micro-batch's ``StepProfile``
        (``loss`` unscaled; 0.0 when the batch has no label token).
        """
        be = self.backend
        self.apply_hooks()
        t_fb = time.perf_counter()
        be.reset_counts()
        pending = self.hotset.take_pending()
        move_bytes = int(sum(pending.to_device_bytes.values()))
        be.traffic.merge(pending)  # moves since the last step count in this one
        self.times.reset()
        streamed0 = arm(self.mlps)  # the node expert pass serves this micro-batch
        ids = batch["input_ids"]
        am = batch.get("attention_mask")
        labels = batch["labels"]
        B, S = ids.shape
        dt = self.device_dtype

        # host-side inputs (static shapes), then to the device
        pid = batch.get("position_ids")  # packed rows (data.packing): block-diagonal attention
        mask = attention_mask_input(am, B, S, dt, pid, be.name)  # None: plain causal on sdpa
        mask = None if mask is None else be.to_device(mask)
        pos = be.to_device(positions(B, S, pid))
        lg = label_gather(labels, dt)
        sel, lab, w = (be.to_device(t) for t in (lg.sel_BNS, lg.labels_BN, lg.w_BN))
        ids_d = be.to_device(ids.to(torch.int32))
        # the first layer's "MoE output": zeros (DefaultHooks: made on the device)
        moe = self.hooks.first_moe_input(be, (B, S, int(self.config.hidden_size)), dt)

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
        streamed = disarm(self.mlps) - streamed0
        tr = be.traffic.totals()
        self._fb_s += time.perf_counter() - t_fb

        return StepProfile(
            loss=float(loss.detach().float().cpu()),
            attn_head_s=dev_s + attn_bwd_s,
            host_fwd_s=self.times.host_fwd_s,
            host_bwd_s=self.times.host_bwd_s,
            recompute_s=self.times.recompute_s,
            device_calls_per_layer=be.calls_per_layer(self.num_layers),
            tokens=B * S,
            hot_experts=self.hotset.total,
            keep_graph=self.modes.keep_graph,
            placement=self.modes.placement,
            hot_s=self.times.hot_s,
            device_calls=dict(be.calls_by_name),
            to_device_bytes=int(tr["to_device_bytes"]),
            to_host_bytes=int(tr["to_host_bytes"]),
            to_device_s=tr["to_device_s"],
            to_host_s=tr["to_host_s"],
            copy_mb=(tr["to_device_bytes"] + tr["to_host_bytes"]) / 1e6,
            move_bytes=move_bytes,
            traffic_layers=be.traffic.by_layer(self.num_layers),
            expert_bytes=streamed,
        )

    # --- evaluation (no backward) ---------------------------------------------------------------
    def token_nll(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Evaluation forward of one batch through the same placement (device attention, host
        experts, hot experts on the device): ``[B, S] float32`` on the host, ``nll[b, t] =
        -log p(labels[b, t] | tokens < t)`` where ``labels[b, t] != -100`` (t >= 1), 0 elsewhere.

        Leaves training untouched: no graph and no gradient (``no_grad``), the model in eval mode
        for the call (LoRA dropout off; restored after), the routing counts (hot-set choice) and
        the torch RNG state restored, no kept HostMLP graph, and its device calls, copies and
        host times are discarded by the next ``forward_backward`` (which resets them); the
        ``placement: auto`` trial timer is not advanced."""
        be = self.backend
        counts = self.counts_LE.clone()
        rng = torch.get_rng_state()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if self._head_nll is None:
                    self._head_nll = be.compile(DeviceHeadNLL(self._head_module))
                ids = batch["input_ids"]
                labels = batch["labels"]
                B, S = ids.shape
                dt = self.device_dtype
                mask = attention_mask_input(batch.get("attention_mask"), B, S, dt, None, be.name)
                mask = None if mask is None else be.to_device(mask)
                pos = be.to_device(positions(B, S))
                lg = label_gather(labels, dt)
                sel, lab = be.to_device(lg.sel_BNS), be.to_device(lg.labels_BN)
                moe = torch.zeros(B, S, self.config.hidden_size, dtype=dt, device=be.device)
                h = be.call("embed", self.embed, be.to_device(ids.to(torch.int32)))
                for i, layer in enumerate(self.layers):
                    h, x = be.call("attention", self.attn[i], h, moe, pos, mask, layer=i)
                    moe = layer.mlp(x)
                ce_BN = be.call("head", self._head_nll, h, moe, sel, lab)
                ce_BN = be.to_host(ce_BN).float() * (lg.w_BN > 0)
                # back to sequence positions: the logit at t scores labels[t + 1]
                at_BS = torch.bmm(ce_BN[:, None, :], lg.sel_BNS.float())[:, 0, :]
                nll_BS = torch.zeros(B, S, dtype=torch.float32)
                nll_BS[:, 1:] = at_BS[:, :-1]
        finally:
            for mlp in self.mlps:
                mlp.free_kept()
            self.counts_LE.copy_(counts)
            torch.set_rng_state(rng)
            if was_training:
                self.model.train()
        return nll_BS

    # --- the hot set's choice (engine.hotset.HotSet) -------------------------------------------
    def select_hot_experts(self, step: int) -> dict:
        """Call after every optimizer step with the number of completed steps (0 before
        training).

        With placement ``hot`` or ``auto``, the first call with ``step >= warmupSteps`` picks
        the hot set (``moe.hotMemory``: ``select_hot_memory`` across layers; else
        ``select_hot`` per layer, on the routing counts so far) and returns its summary
        (``fraction, experts, selected_at_step, per_layer`` and ``memory`` with a budget). With
        ``hotRefreshSteps`` later calls may re-choose it (``HotSet.refresh``; the summary again,
        with ``refreshed_at_step``). Placement ``auto`` then alternates host-only and hot steps
        (``auto_step``). Every other call returns ``{}``.
        """
        fb_s, self._fb_s = self._fb_s, 0.0
        if self.modes.policy == "host-only":
            return {}
        if self.hotset.selected_at is None:
            if step < self.hotset.warmup_steps:
                return {}
            info = self.hotset.select(step)
            if self.modes.policy == "auto":
                self._start_auto()
                self._apply_auto_mode()
            return info
        if self.auto is not None and self.auto.deciding:
            self.auto_step(step, fb_s)
            return {}
        return self.hotset.refresh(step, self.modes.placement)

    # --- placement auto (engine.placement.AutoPlacement) ----------------------------------------
    def agree_placement_with(self, agree: Callable[[str], str] | None) -> None:
        """Data parallel: ``agree(choice) -> rank 0's choice`` (a collective every rank reaches
        at the same step), so that every rank keeps the same placement; None alone."""
        self._auto_agree = agree
        if self.auto is not None:
            self.auto.agree_with(agree)

    def _start_auto(self) -> AutoPlacement:
        self.auto = AutoPlacement(self.modes.auto_rounds)
        self.auto.agree_with(self._auto_agree)
        return self.auto

    def _apply_auto_mode(self) -> None:
        assert self.auto is not None
        want = self.auto.placement()
        if want != self.modes.placement:
            self.modes.set(self.modes.with_placement(want))

    def auto_step(self, step: int, seconds: float) -> None:
        """Record the trial step ``step`` (its placement and forward+backward seconds) and set
        the next step's placement; after ``auto_rounds`` rounds keep the faster (median)."""
        assert self.auto is not None
        self.auto.record(self.modes.placement, step, seconds)
        self._apply_auto_mode()

    def placement_choice(self) -> dict[str, Any] | None:
        """Placement ``auto``: ``{chosen, decided_at_step, host_only_median_s, hot_median_s,
        trials}`` (``chosen`` None while measuring); ``None`` for the other placements."""
        return None if self.auto is None else self.auto.report()

    # --- checkpoint state -------------------------------------------------------------------------
    def hot_state(self) -> dict | None:
        """Serialisable hot set (JSON-able), or ``None`` when none is selected. Keys:
        ``fraction``, ``experts`` (total), ``selected_at_step``, ``per_layer`` (expert ids per
        layer, in slot order), ``routing_counts`` (``[L][E]`` ints at the time of saving), and
        for refresh and auto: ``hist``, ``counts_at_refresh``, ``history``, ``auto``."""
        state = self.hotset.state()
        if state is not None and self.auto is not None:
            state["auto"] = self.auto.state()
        return state

    def load_hot_state(self, state: dict | None) -> None:
        """Restore a hot set saved by ``hot_state`` (copies those experts to the device);
        ``None`` removes the hot set (host-only until the next selection)."""
        if state is None:
            self.hotset.clear()
            return
        self.hotset.load_counts(state)
        if self.hotset.parked:  # back to the hot mode before re-installing
            self.modes.set(self.modes.with_placement("hot"))
        self.hotset.load(state)
        auto = state.get("auto")
        if auto is not None and self.modes.policy == "auto":
            self._start_auto().load(auto)
            self._apply_auto_mode()

    def load_adapter_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Inverse of ``adapter.state_dict()`` (for resuming); refreshes the hot copies."""
        self.adapter.load_state_dict(state)
        self.hotset.sync_weights()


class _CastBlock(nn.Module):
    """A stock MoE block with the host-dtype cast HostMLP also does (fp32 model, bf16 experts)."""

    def __init__(self, block: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.block = block
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x.to(self.dtype)).to(x.dtype)
