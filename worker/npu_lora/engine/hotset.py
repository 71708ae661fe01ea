"""The hot set's owner (:class:`HotSet`): which experts live on the device, and when that changes.

Built from the ``moe`` section (:meth:`HotSet.from_spec`; the buckets by ``api.sizing``'s rule,
the one the compile plan lists). It owns the routing counts too (:meth:`HotSet.routing_counts`,
:meth:`HotSet.load_routing_counts`; a checkpoint's ``routing``).

Lifecycle: routing counts accumulate (``counts_LE``, written by every ``HostMLP``); at
``moe.warmupSteps`` the set is chosen (:meth:`HotSet.select`: ``moe.hotMemory`` across layers,
else ``hotFraction`` per layer) and its experts copied to the device; every
``moe.hotRefreshSteps`` it is chosen again on a decayed histogram and only the experts that
change move (:meth:`HotSet.refresh`); placement ``host-only`` parks it (:meth:`park`, the
``auto`` trials) and ``hot`` restores it. Copies made between steps (selection, refresh,
weight sync) are reported with the next step's traffic (:meth:`take_pending`). Its state is
JSON-able (:meth:`state` / :meth:`load`) for checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch

from npu_lora.api.sizing import hot_buckets
from npu_lora.backends import Backend
from npu_lora.backends.base import Traffic
from npu_lora.engine.hooks import HotPath
from npu_lora.moe.host_mlp import HostMLP
from npu_lora.moe.hot import (
    HotLayer,
    coverage,
    device_expert_bytes,
    make_hot_layer,
    move_hot_layer,
    refresh_hot_layer,
    select_hot,
    select_hot_memory,
)

__all__ = ["HOT_DECAY", "HotSet"]

#: Decay of the routing histogram per hot-set refresh (``moe.hotRefreshSteps``): the counts of
#: the last period weigh 1, the one before 0.5, ... (half-life: one refresh period).
HOT_DECAY = 0.5


class HotSet:
    """The hot experts of every layer (``HostMLP.hot``), their choice and their history."""

    def __init__(
        self,
        mlps: list[HostMLP],
        backend: Backend,
        *,
        device_dtype: torch.dtype,
        buckets: tuple[int, ...],
        fraction: float = 0.25,
        warmup_steps: int = 4,
        refresh_steps: int | None = None,
        memory: int | None = None,
    ) -> None:
        """``mlps``: the model's HostMLPs (their shared routing counts ``counts_LE`` are the
        set's input); ``buckets``: the padded rows a hot expert may get (``api.sizing``); the
        rest: ``moe`` (:meth:`from_spec`)."""
        self.mlps = mlps
        self.backend = backend
        counts_LE = mlps[0].counts_LE
        if counts_LE is None:
            raise ValueError("the HostMLPs count no routing (install_host_mlp gives them counts)")
        self.counts_LE: torch.Tensor = counts_LE  # [L, E] int64, shared with the HostMLPs
        self.num_layers, self.num_experts = counts_LE.shape
        self.device_dtype = device_dtype
        self.buckets = tuple(buckets)
        self.fraction = fraction
        self.warmup_steps = warmup_steps
        self.refresh_steps = refresh_steps
        self.memory = memory
        #: hot rows gathered on the device when that sends fewer rows (HotExpertsGathered)
        self.device_gather = backend.device_gather
        self.selected_at: int | None = None
        self.history: list[dict[str, Any]] = []  # choices (selection, refreshes)
        self.hist_LE: torch.Tensor | None = None  # decayed routing histogram (refresh)
        self.counts_at_refresh: torch.Tensor | None = None
        self._parked: list[HotLayer | None] | None = None
        self._pending = Traffic()  # copies between steps (moves), reported with the next step
        self._path = HotPath()

    @classmethod
    def from_spec(
        cls,
        moe: Any,
        mlps: list[HostMLP],
        backend: Backend,
        *,
        tokens: int,
        top_k: int,
        device_dtype: torch.dtype,
    ) -> HotSet:
        """From the ``moe`` section: ``hotFraction``, ``hotMemory``, ``warmupSteps``,
        ``hotRefreshSteps``, ``bucketSizes`` (else :func:`~npu_lora.api.sizing.hot_buckets`
        for ``tokens`` per pass and the model's ``top_k``, the rule the compile plan lists)."""
        return cls(
            mlps,
            backend,
            device_dtype=device_dtype,
            buckets=hot_buckets(moe.bucket_sizes, tokens, top_k),
            fraction=moe.hot_fraction,
            warmup_steps=moe.warmup_steps,
            refresh_steps=moe.hot_refresh_steps,
            memory=moe.hot_memory_bytes,
        )

    # --- what is on the device ------------------------------------------------------------------
    @property
    def total(self) -> int:
        """Hot experts in use now (0 while parked)."""
        return sum(m.hot.num_hot for m in self.mlps if m.hot is not None)

    @property
    def parked(self) -> bool:
        return self._parked is not None

    def live(self) -> list[HotLayer | None]:
        """The hot layers, also while parked (placement host-only during auto trials)."""
        if self._parked is not None:
            return list(self._parked)
        return [m.hot for m in self.mlps]

    def park(self) -> None:
        """Placement host-only: the MoE blocks run all experts on the host; the set is kept."""
        self._parked = [mlp.hot for mlp in self.mlps]
        for mlp in self.mlps:
            mlp.hot = None

    def unpark(self) -> None:
        if self._parked is not None:
            for mlp, hot in zip(self.mlps, self._parked, strict=True):
                mlp.hot = hot
            self._parked = None

    def clear(self) -> None:
        """No hot set (host-only until the next selection)."""
        self._parked = None
        for m in self.mlps:
            m.hot = None
        self.selected_at = None

    def use_path(self, path: HotPath) -> None:
        """Run the hot layers (now and later made) the ``path`` way."""
        if path == self._path:
            return
        self._path = path
        for hot in self.live():
            if hot is not None:
                hot.capacity = path.capacity

    # --- traffic between steps ------------------------------------------------------------------
    def take_pending(self) -> Traffic:
        """The copies made since the last step (they count in the next one), and forget them."""
        out = Traffic()
        out.merge(self._pending)
        self._pending.clear()
        return out

    def _between_steps(self) -> Traffic:
        saved, self.backend.traffic = self.backend.traffic, Traffic()
        return saved

    def _end_between_steps(self, saved: Traffic) -> int:
        moved = int(sum(self.backend.traffic.to_device_bytes.values()))
        self._pending.merge(self.backend.traffic)
        self.backend.traffic = saved
        return moved

    # --- choice -----------------------------------------------------------------------------------
    def expert_device_bytes(self) -> int:
        return device_expert_bytes(self.mlps[0].experts, self.device_dtype)

    def choose(self, counts_LE: torch.Tensor) -> list[list[int]]:
        """The hot set for these counts: ``moe.hotMemory`` (across layers) or ``hotFraction``."""
        if self.memory is not None:
            return select_hot_memory(counts_LE, self.memory, self.expert_device_bytes())
        return select_hot(counts_LE, self.fraction)

    def _make(self, mlp: HostMLP, ids: list[int], layer: int) -> HotLayer:
        hot = make_hot_layer(
            mlp.experts,
            list(ids),
            self.backend,
            buckets=self.buckets,
            device_dtype=self.device_dtype,
            layer=layer,
            device_gather=self.device_gather,
        )
        if self._path != HotPath():
            hot.capacity = self._path.capacity
        return hot

    def install(self, experts_per_layer: list[list[int]]) -> int:
        """Make the layers' hot sets (copies every listed expert); returns the bytes moved."""
        if len(experts_per_layer) != self.num_layers:
            raise ValueError(
                f"hot set has {len(experts_per_layer)} layers, model {self.num_layers}"
            )
        saved = self._between_steps()
        for i, (mlp, ids) in enumerate(zip(self.mlps, experts_per_layer, strict=True)):
            # hotMemory may give a layer nothing: all its experts on the host
            mlp.hot = self._make(mlp, ids, i) if ids else None
        return self._end_between_steps(saved)

    def select(self, step: int) -> dict:
        """Choose the set on the routing counts so far and copy it; returns :meth:`summary`."""
        moved = self.install(self.choose(self.counts_LE))
        self.selected_at = step
        self.hist_LE = self.counts_LE.to(torch.float64)
        self.counts_at_refresh = self.counts_LE.clone()
        self._record_history(step, moved, experts_moved=self.total)
        return self.summary()

    def refresh(self, step: int, placement: str) -> dict:
        """Every ``hotRefreshSteps`` steps after the selection (placement hot): decay the
        histogram (``hist = HOT_DECAY·hist + counts since the last refresh``), choose again
        and move only the experts that change (their bytes count as the next step's traffic,
        ``move_bytes``). Returns the summary when the set changed, else ``{}``."""
        n = self.refresh_steps
        if (
            not n
            or self.selected_at is None
            or placement != "hot"
            or step <= self.selected_at
            or (step - self.selected_at) % n
        ):
            return {}
        assert self.hist_LE is not None and self.counts_at_refresh is not None
        recent = (self.counts_LE - self.counts_at_refresh).to(torch.float64)
        self.hist_LE = HOT_DECAY * self.hist_LE + recent
        self.counts_at_refresh = self.counts_LE.clone()
        want = self.choose(self.hist_LE)
        saved = self._between_steps()
        entered = 0
        for i, (mlp, ids) in enumerate(zip(self.mlps, want, strict=True)):
            if mlp.hot is None and ids:
                mlp.hot = self._make(mlp, ids, i)
                entered += len(ids)
            elif mlp.hot is not None and not ids:
                mlp.hot = None
            elif mlp.hot is not None:
                mlp.hot, k = move_hot_layer(mlp.hot, mlp.experts, list(ids), self.backend)
                entered += k
        moved = self._end_between_steps(saved)
        if not entered and len(self.history) and self._same_as_last(want):
            return {}
        self._record_history(step, moved, experts_moved=entered)
        out = self.summary()
        out["refreshed_at_step"] = step
        return out

    def sync_weights(self) -> None:
        """Device copies (hot experts) follow the host weights after ``opt.step()`` (a no-op
        unless hot experts exist and expert weights are trainable)."""
        saved = self._between_steps()
        for m in self.mlps:
            if m.hot is not None and any(p.requires_grad for p in m.experts.parameters()):
                refresh_hot_layer(m.hot, m.experts, self.backend)
        self._end_between_steps(saved)

    def _same_as_last(self, want: list[list[int]]) -> bool:
        last = self.history[-1]["per_layer"]
        return [sorted(a) for a in last] == [sorted(b) for b in want]

    def _per_layer(self) -> list[list[int]]:
        return [list(h.experts) if h else [] for h in self.live()]

    def _record_history(self, step: int, moved: int, *, experts_moved: int) -> None:
        self.history.append(
            {
                "step": step,
                "experts": sum(h.num_hot for h in self.live() if h is not None),
                "experts_moved": experts_moved,
                "move_bytes": moved,
                "per_layer": self._per_layer(),
            }
        )

    # --- reports and state --------------------------------------------------------------------------
    def summary(self) -> dict:
        if self.selected_at is None:
            return {}
        out = {
            "fraction": self.fraction,
            "experts": sum(h.num_hot for h in self.live() if h is not None),
            "selected_at_step": self.selected_at,
            "per_layer": self._per_layer(),
        }
        if self.memory is not None:
            out["memory"] = self.memory_report()
        return out

    def memory_report(self, counts_LE: torch.Tensor | None = None) -> dict[str, Any]:
        """``moe.hotMemory``: budget, bytes used, and the routed-token coverage of the hot set
        vs the per-layer rule with the same budget (the same number of experts per layer,
        ``budget // expert_bytes // L``), both on the same counts (default: the histogram the
        set was chosen from)."""
        counts = counts_LE if counts_LE is not None else self.hist_LE
        if counts is None:
            counts = self.counts_LE
        eb = self.expert_device_bytes()
        per_layer = self._per_layer()
        n = sum(len(x) for x in per_layer)
        k = min(self.num_experts, (self.memory or 0) // eb // max(self.num_layers, 1))
        flat = select_hot(counts, k / self.num_experts) if k else [[] for _ in per_layer]
        return {
            "budget_bytes": self.memory,
            "expert_bytes": eb,
            "used_bytes": n * eb,
            "experts": n,
            "coverage": coverage(counts, per_layer),
            "per_layer_fraction_experts": k * self.num_layers,
            "per_layer_fraction_coverage": coverage(counts, flat),
        }

    def state(self) -> dict | None:
        """:meth:`summary` + ``routing_counts``, ``hist``, ``counts_at_refresh``, ``history``
        (JSON-able); ``None`` before the selection."""
        if self.selected_at is None:
            return None
        state = self.summary()
        state["routing_counts"] = self.counts_LE.tolist()
        if self.hist_LE is not None:
            state["hist"] = self.hist_LE.tolist()
        if self.counts_at_refresh is not None:
            state["counts_at_refresh"] = self.counts_at_refresh.tolist()
        state["history"] = [dict(h) for h in self.history]
        return state

    def routing_counts(self) -> torch.Tensor:
        """``[L, E] int64``: tokens routed to each expert, summed over all forwards so far
        (every position incl. padding; recomputes in backward are not counted)."""
        return self.counts_LE.clone()

    def load_routing_counts(self, counts_LE: torch.Tensor) -> None:
        """Restore routing counts (resuming before the hot set is chosen picks the same set)."""
        self.counts_LE.copy_(torch.as_tensor(counts_LE, dtype=torch.int64))

    def load_counts(self, state: dict) -> None:
        if "routing_counts" in state:
            self.counts_LE.copy_(torch.tensor(state["routing_counts"], dtype=torch.int64))

    def load(self, state: dict) -> None:
        """Install the set of a :meth:`state` (copies its experts; not a move of the run's:
        nothing is reported with the next step) and its histogram and history. The set must
        not be parked (the engine switches to placement hot first)."""
        self.install(state["per_layer"])
        self._pending.clear()
        self.selected_at = int(state["selected_at_step"])
        self.hist_LE = (
            torch.tensor(state["hist"], dtype=torch.float64)
            if "hist" in state
            else self.counts_LE.to(torch.float64)
        )
        self.counts_at_refresh = (
            torch.tensor(state["counts_at_refresh"], dtype=torch.int64)
            if "counts_at_refresh" in state
            else self.counts_LE.clone()
        )
        self.history = [dict(h) for h in state.get("history", [])]
