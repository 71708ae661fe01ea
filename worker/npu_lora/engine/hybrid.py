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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npu_lora.api.v1alpha1 import MoEFinetuneSpec
from npu_lora.backends import Backend, get_backend
from npu_lora.backends.base import Traffic
from npu_lora.device.graphs import (
    DeviceAttentionBlock,
    DeviceEmbed,
    DeviceHead,
    DeviceHeadNLL,
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
    device_expert_bytes,
    make_hot_layer,
    move_hot_layer,
    refresh_hot_layer,
    select_hot,
    select_hot_memory,
)
from npu_lora.moe.mode import EngineMode
from npu_lora.moe.node_pass import LocalPass, arm, disarm, install_pass
from npu_lora.moe.stream_linear import head_linear

EXPERTS_FILE = "experts.safetensors"
#: ``moe.placement: auto``: trial rounds after the hot set is chosen; round r runs one
#: host-only and one hot step, host-only first in even rounds (the bench's alternation).
AUTO_ROUNDS = 3
#: Decay of the routing histogram per hot-set refresh (``moe.hotRefreshSteps``): the counts of
#: the last period weigh 1, the one before 0.5, ... (half-life: one refresh period).
HOT_DECAY = 0.5


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
        hot_refresh_steps: int | None = None,
        hot_memory: int | None = None,
        auto_rounds: int = AUTO_ROUNDS,
        host_compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.train_experts = train_experts
        if placement == "auto" and train_experts:
            placement = "host-only"  # trained experts cannot live on the device: auto = host-only
        #: ``moe.placement`` as asked: ``hot``, ``host-only`` or ``auto`` (measure, keep faster)
        self.policy = placement
        self._mode = EngineMode(
            "hot" if placement == "auto" else placement,  # type: ignore[arg-type]
            keep_graph,
            overlap,
        )
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
            compute_dtype=host_compute_dtype,
        )
        install_pass(self.mlps, LocalPass())  # counts streamed bytes; launch: the node's pass
        self.hot_selected_at: int | None = None
        self.hot_refresh_steps = hot_refresh_steps
        self.hot_memory = hot_memory
        self.auto_rounds = auto_rounds
        self.auto: dict[str, Any] | None = None  # placement auto: trials and the choice
        #: data parallel: ``agree(choice) -> rank 0's choice`` (a collective every rank reaches
        #: at the same step), so that every rank keeps the same placement; None alone
        self.auto_agree: Callable[[str], str] | None = None
        self.hot_history: list[dict[str, Any]] = []  # hot-set choices (selection, refreshes)
        self.hist_LE: torch.Tensor | None = None  # decayed routing histogram (refresh)
        self._counts_at_refresh: torch.Tensor | None = None
        self._pending = Traffic()  # copies between steps (moves), reported with the next step
        self._fb_s = 0.0  # forward_backward wall seconds since the last select_hot_experts
        self.legacy_traffic = False  # bench A/B (variant +legacy): the copies before issue 13
        #: hot rows gathered on the device when that sends fewer rows (HotExpertsGathered);
        #: off for furiosa until `npu-lora rngd-check` covers that graph
        self.device_gather = backend.name != "furiosa"
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
        head = DeviceHead(
            inner.norm,
            self.lm.lm_head,
            int(self.lm.lm_head.weight.shape[0]),
            linear=head_linear(backend),
        ).to(backend.device)
        self.head = backend.compile(head)
        self._head_module = head
        self._head_nll: Any = None  # DeviceHeadNLL, compiled on the first token_nll
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
        token; optional), ``position_ids [B,S]`` (optional; packed rows: restart at 0 per
        example, attention stays inside each example), ``labels [B,S] int64`` in the Hugging Face convention (== input_ids
        at answer positions, -100 elsewhere; the logits at t predict ``labels[t+1]``).
        Gradients accumulate into ``.grad``. Returns the micro-batch's ``StepProfile``
        (``loss`` unscaled; 0.0 when the batch has no label token).
        """
        be = self.backend
        t_fb = time.perf_counter()
        be.reset_counts()
        move_bytes = int(sum(self._pending.to_device_bytes.values()))
        be.traffic.merge(self._pending)  # moves since the last step count in this one
        self._pending.clear()
        self.times.reset()
        streamed0 = arm(self.mlps)  # the node expert pass serves this micro-batch
        ids = batch["input_ids"]
        am = batch.get("attention_mask")
        labels = batch["labels"]
        B, S = ids.shape
        dt = self.device_dtype

        # host-side inputs (static shapes), then to the device
        pid = batch.get("position_ids")  # packed rows (data.packing): block-diagonal attention
        mask = be.to_device(causal_mask(am, B, S, dt, pid))
        pos = be.to_device(positions(B, S, pid))
        lg = label_gather(labels, dt)
        sel, lab, w = (be.to_device(t) for t in (lg.sel_BNS, lg.labels_BN, lg.w_BN))
        ids_d = be.to_device(ids.to(torch.int32))
        # the first layer's "MoE output" is zeros: made on the device, nothing is copied
        # (``legacy_traffic``: copied from the host, as before issue 13; bench A/B only)
        if self.legacy_traffic:
            moe = be.to_device(torch.zeros(B, S, self.config.hidden_size, dtype=dt))
        else:
            moe = torch.zeros(B, S, self.config.hidden_size, dtype=dt, device=be.device)

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
            hot_experts=self.hot_experts_total,
            keep_graph=self.keep_graph,
            placement=self.placement,
            hot_s=self.times.hot_s,
            device_calls=dict(be.calls_by_name),
            to_device_bytes=int(tr["to_device_bytes"]),
            to_host_bytes=int(tr["to_host_bytes"]),
            to_device_s=tr["to_device_s"],
            to_host_s=tr["to_host_s"],
            copy_mb=(tr["to_device_bytes"] + tr["to_host_bytes"]) / 1e6,
            move_bytes=move_bytes,
            traffic_layers=be.traffic.by_layer(self.num_layers),
            node_expert_bytes=streamed,
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
                mask = be.to_device(causal_mask(batch.get("attention_mask"), B, S, dt))
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

    def _expert_device_bytes(self) -> int:
        return device_expert_bytes(self.mlps[0].experts, self.device_dtype)

    def _choose(self, counts_LE: torch.Tensor) -> list[list[int]]:
        """The hot set for these counts: ``moe.hotMemory`` (across layers) or ``hotFraction``."""
        if self.hot_memory is not None:
            return select_hot_memory(counts_LE, self.hot_memory, self._expert_device_bytes())
        return select_hot(counts_LE, self.hot_fraction)

    def _between_steps(self) -> Traffic:
        """Copies made now (between steps) are reported with the next step's traffic."""
        saved, self.backend.traffic = self.backend.traffic, Traffic()
        return saved

    def _end_between_steps(self, saved: Traffic) -> int:
        moved = int(sum(self.backend.traffic.to_device_bytes.values()))
        self._pending.merge(self.backend.traffic)
        self.backend.traffic = saved
        return moved

    def _install_hot(self, experts_per_layer: list[list[int]]) -> int:
        """Make the layers' hot sets (copies every listed expert); returns the bytes moved."""
        if len(experts_per_layer) != self.num_layers:
            raise ValueError(
                f"hot set has {len(experts_per_layer)} layers, model {self.num_layers}"
            )
        saved = self._between_steps()
        for i, (mlp, ids) in enumerate(zip(self.mlps, experts_per_layer, strict=True)):
            mlp.hot = (
                make_hot_layer(
                    mlp.experts,
                    list(ids),
                    self.backend,
                    buckets=self._buckets(),
                    device_dtype=self.device_dtype,
                    layer=i,
                    device_gather=self.device_gather,
                )
                if ids
                else None  # hotMemory gave this layer nothing: all its experts on the host
            )
        return self._end_between_steps(saved)

    def _live_hot(self) -> list[HotLayer | None]:
        """The hot layers, also while parked (placement host-only during auto trials)."""
        if self._parked_hot is not None:
            return list(self._parked_hot)
        return [m.hot for m in self.mlps]

    def select_hot_experts(self, step: int) -> dict:
        """Call after every optimizer step with the number of completed steps (0 before
        training).

        With placement ``hot`` or ``auto``, the first call with ``step >= warmupSteps`` picks
        the hot set (``moe.hotMemory``: ``select_hot_memory`` across layers; else
        ``select_hot`` per layer, on the routing counts so far) and returns its summary
        (``fraction, experts, selected_at_step, per_layer`` and ``memory`` with a budget). With
        ``hotRefreshSteps`` later calls may re-choose it (``refresh_hot``; the summary again,
        with ``refreshed_at_step``). Placement ``auto`` then alternates host-only and hot steps
        (``auto_step``). Every other call returns ``{}``.
        """
        fb_s, self._fb_s = self._fb_s, 0.0
        if self.policy == "host-only":
            return {}
        if self.hot_selected_at is None:
            if step < self.warmup_steps:
                return {}
            moved = self._install_hot(self._choose(self.counts_LE))
            self.hot_selected_at = step
            self.hist_LE = self.counts_LE.to(torch.float64)
            self._counts_at_refresh = self.counts_LE.clone()
            self._record_history(step, moved, experts_moved=self.hot_experts_total)
            if self.policy == "auto":
                self.auto = {"trials": [], "chosen": None, "decided_at_step": None}
                self._apply_auto_mode()
            return self.hot_summary()
        if self.policy == "auto" and self.auto is not None and self.auto["chosen"] is None:
            self.auto_step(step, fb_s)
            return {}
        return self.refresh_hot(step)

    # --- placement auto -------------------------------------------------------------------------
    def _trial_placement(self, k: int) -> str:
        first, second = ("host-only", "hot") if (k // 2) % 2 == 0 else ("hot", "host-only")
        return first if k % 2 == 0 else second

    def _apply_auto_mode(self) -> None:
        assert self.auto is not None
        chosen = self.auto["chosen"]
        want = chosen or self._trial_placement(len(self.auto["trials"]))
        if want != self.placement:
            self.set_mode(EngineMode(want, self.keep_graph, self.overlap))  # type: ignore[arg-type]

    def auto_step(self, step: int, seconds: float) -> None:
        """Record the trial step ``step`` (its placement and forward+backward seconds) and set
        the next step's placement; after ``auto_rounds`` rounds keep the faster (median)."""
        import statistics

        assert self.auto is not None
        self.auto["trials"].append([self.placement, step, seconds])
        if len(self.auto["trials"]) >= 2 * self.auto_rounds:
            med = {
                p: statistics.median(s for q, _, s in self.auto["trials"] if q == p)
                for p in ("host-only", "hot")
            }
            self.auto["median_s"] = med
            chosen = "hot" if med["hot"] < med["host-only"] else "host-only"
            self.auto["chosen"] = self.auto_agree(chosen) if self.auto_agree else chosen
            self.auto["decided_at_step"] = step
        self._apply_auto_mode()

    def placement_choice(self) -> dict[str, Any] | None:
        """Placement ``auto``: ``{chosen, decided_at_step, host_only_median_s, hot_median_s,
        trials}`` (``chosen`` None while measuring); ``None`` for the other placements."""
        if self.auto is None:
            return None
        med = self.auto.get("median_s") or {}
        return {
            "policy": "auto",
            "chosen": self.auto["chosen"],
            "decided_at_step": self.auto["decided_at_step"],
            "host_only_median_s": med.get("host-only"),
            "hot_median_s": med.get("hot"),
            "trials": [list(t) for t in self.auto["trials"]],
        }

    # --- refresh ----------------------------------------------------------------------------
    def refresh_hot(self, step: int) -> dict:
        """Every ``hotRefreshSteps`` steps after the selection (placement hot): decay the
        histogram (``hist = HOT_DECAY·hist + counts since the last refresh``), choose again
        and move only the experts that change (their bytes count as the next step's traffic,
        ``move_bytes``). Returns the summary when the set changed, else ``{}``."""
        n = self.hot_refresh_steps
        if (
            not n
            or self.hot_selected_at is None
            or self.placement != "hot"
            or step <= self.hot_selected_at
            or (step - self.hot_selected_at) % n
        ):
            return {}
        assert self.hist_LE is not None and self._counts_at_refresh is not None
        recent = (self.counts_LE - self._counts_at_refresh).to(torch.float64)
        self.hist_LE = HOT_DECAY * self.hist_LE + recent
        self._counts_at_refresh = self.counts_LE.clone()
        want = self._choose(self.hist_LE)
        saved = self._between_steps()
        entered = 0
        for i, (mlp, ids) in enumerate(zip(self.mlps, want, strict=True)):
            if mlp.hot is None and ids:
                mlp.hot = make_hot_layer(
                    mlp.experts,
                    list(ids),
                    self.backend,
                    buckets=self._buckets(),
                    device_dtype=self.device_dtype,
                    layer=i,
                    device_gather=self.device_gather,
                )
                entered += len(ids)
            elif mlp.hot is not None and not ids:
                mlp.hot = None
            elif mlp.hot is not None:
                mlp.hot, k = move_hot_layer(mlp.hot, mlp.experts, list(ids), self.backend)
                entered += k
        moved = self._end_between_steps(saved)
        if not entered and len(self.hot_history) and self._same_as_last(want):
            return {}
        self._record_history(step, moved, experts_moved=entered)
        out = self.hot_summary()
        out["refreshed_at_step"] = step
        return out

    def _same_as_last(self, want: list[list[int]]) -> bool:
        last = self.hot_history[-1]["per_layer"]
        return [sorted(a) for a in last] == [sorted(b) for b in want]

    def _record_history(self, step: int, moved: int, *, experts_moved: int) -> None:
        self.hot_history.append(
            {
                "step": step,
                "experts": sum(h.num_hot for h in self._live_hot() if h is not None),
                "experts_moved": experts_moved,
                "move_bytes": moved,
                "per_layer": [list(h.experts) if h else [] for h in self._live_hot()],
            }
        )

    def hot_summary(self) -> dict:
        if self.hot_selected_at is None:
            return {}
        live = self._live_hot()
        out = {
            "fraction": self.hot_fraction,
            "experts": sum(h.num_hot for h in live if h is not None),
            "selected_at_step": self.hot_selected_at,
            "per_layer": [list(h.experts) if h else [] for h in self._live_hot()],
        }
        if self.hot_memory is not None:
            out["memory"] = self.memory_report()
        return out

    def memory_report(self, counts_LE: torch.Tensor | None = None) -> dict[str, Any]:
        """``moe.hotMemory``: budget, bytes used, and the routed-token coverage of the hot set
        vs the per-layer rule with the same budget (the same number of experts per layer,
        ``budget // expert_bytes // L``), both on the same counts (default: the histogram the
        set was chosen from)."""
        from npu_lora.moe.hot import coverage

        counts = counts_LE if counts_LE is not None else self.hist_LE
        if counts is None:
            counts = self.counts_LE
        eb = self._expert_device_bytes()
        per_layer = [list(h.experts) if h else [] for h in self._live_hot()]
        n = sum(len(x) for x in per_layer)
        k = min(self.num_experts, (self.hot_memory or 0) // eb // max(self.num_layers, 1))
        flat = select_hot(counts, k / self.num_experts) if k else [[] for _ in per_layer]
        return {
            "budget_bytes": self.hot_memory,
            "expert_bytes": eb,
            "used_bytes": n * eb,
            "experts": n,
            "coverage": coverage(counts, per_layer),
            "per_layer_fraction_experts": k * self.num_layers,
            "per_layer_fraction_coverage": coverage(counts, flat),
        }

    def hot_state(self) -> dict | None:
        """Serialisable hot set (JSON-able), or ``None`` when none is selected. Keys:
        ``fraction``, ``experts`` (total), ``selected_at_step``, ``per_layer`` (expert ids per
        layer, in slot order), ``routing_counts`` (``[L][E]`` ints at the time of saving), and
        for refresh and auto: ``hist``, ``counts_at_refresh``, ``history``, ``auto``."""
        if self.hot_selected_at is None:
            return None
        state = self.hot_summary()
        state["routing_counts"] = self.counts_LE.tolist()
        if self.hist_LE is not None:
            state["hist"] = self.hist_LE.tolist()
        if self._counts_at_refresh is not None:
            state["counts_at_refresh"] = self._counts_at_refresh.tolist()
        state["history"] = [dict(h) for h in self.hot_history]
        if self.auto is not None:
            state["auto"] = {
                "trials": [list(t) for t in self.auto["trials"]],
                "chosen": self.auto["chosen"],
                "decided_at_step": self.auto["decided_at_step"],
                "median_s": self.auto.get("median_s"),
            }
        return state

    def load_hot_state(self, state: dict | None) -> None:
        """Restore a hot set saved by ``hot_state`` (copies those experts to the device);
        ``None`` removes the hot set (host-only until the next selection)."""
        if state is None:
            self._parked_hot = None
            for m in self.mlps:
                m.hot = None
            self.hot_selected_at = None
            return
        if "routing_counts" in state:
            self.counts_LE.copy_(torch.tensor(state["routing_counts"], dtype=torch.int64))
        if self._parked_hot is not None:  # back to the hot mode before re-installing
            self.set_mode(EngineMode("hot", self.keep_graph, self.overlap))
        self._install_hot(state["per_layer"])
        self._pending.clear()  # restoring is not a move of the run's
        self.hot_selected_at = int(state["selected_at_step"])
        self.hist_LE = (
            torch.tensor(state["hist"], dtype=torch.float64)
            if "hist" in state
            else self.counts_LE.to(torch.float64)
        )
        self._counts_at_refresh = (
            torch.tensor(state["counts_at_refresh"], dtype=torch.int64)
            if "counts_at_refresh" in state
            else self.counts_LE.clone()
        )
        self.hot_history = [dict(h) for h in state.get("history", [])]
        auto = state.get("auto")
        if auto is not None and self.policy == "auto":
            self.auto = {
                "trials": [list(t) for t in auto["trials"]],
                "chosen": auto["chosen"],
                "decided_at_step": auto["decided_at_step"],
            }
            if auto.get("median_s"):
                self.auto["median_s"] = dict(auto["median_s"])
            self._apply_auto_mode()

    def after_optimizer_step(self) -> None:
        """Keep device copies (hot experts) in sync with host weights after ``opt.step()``.
        A no-op unless hot experts exist and expert weights are trainable."""
        saved = self._between_steps()
        for m in self.mlps:
            if m.hot is not None and any(p.requires_grad for p in m.experts.parameters()):
                refresh_hot_layer(m.hot, m.experts, self.backend)
        self._end_between_steps(saved)

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
        fingerprint = getattr(self, "base_fingerprint", None)
        if fingerprint:  # which base this adapter belongs to (npu_lora.models.fingerprint)
            import json

            from npu_lora.models.fingerprint import FILE

            (path / FILE).write_text(json.dumps(fingerprint, indent=2) + "\n", encoding="utf-8")

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
    from npu_lora.models.build import moe_blocks
    from npu_lora.models.fingerprint import base_fingerprint
    from npu_lora.moe.pages import place_experts

    fingerprint = base_fingerprint(model)  # the base as built, before any adapter is loaded

    experts_pages = place_experts(moe_blocks(model))  # before anything reads or copies them
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
        hot_refresh_steps=spec.moe.hot_refresh_steps,
        hot_memory=spec.moe.hot_memory_bytes,
        host_compute_dtype=to_dtype(host_choice.compute_dtype),
    )
    engine.host_choice = host_choice  # summary.json machine.host, status.host
    engine.experts_pages = experts_pages  # summary.json machine.experts_pages
    engine.base_fingerprint = fingerprint  # adapter/npu_lora_base.json, summary.json
    return engine
