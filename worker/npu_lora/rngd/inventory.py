"""Pure-torch op inventory of a device graph, forward and backward.

What RNGD's compiler (furiosa-torch 2026.4) accepts was measured on the CPU (see NOTES.md): it
rejects every int64 tensor op and a list of ops (sorting, histograms, scatter-adds, grouped mm,
sdpa, ...). This module finds those ops *without* furiosa-torch, on any torch >= 2.10 (the CPU
2.13 build of the main venv and furiosa's pinned 2.10), so the normal test suite can keep every
device graph compile-friendly.

How a graph is traced:

* ``aot`` (default): the graph is run once through AOTAutograd (``functorch.compile.aot_function``)
  with capturing compilers, exactly as ``torch.compile(backend=...)`` would hand it to a backend:
  a functionalised forward graph (its outputs plus the activations saved for backward) and the
  partitioned backward graph (saved activations + output cotangents -> gradients). Both graphs are
  then run with real CPU tensors under a ``TorchDispatchMode`` that records every aten op with
  the dtypes of its tensor inputs and outputs. The captured backward graph (with real inputs) is
  also what the probe and compile tiers of ``rngd-check`` feed to furiosa's compiler.
* ``eager`` (fallback when AOT capture fails): the module's forward and then
  ``torch.autograd.grad`` run eagerly under the same recording mode.

The backward is the gradient w.r.t. the graph's trainable parameters and inputs for random (fixed
seed) output cotangents: the device graph receives the upstream gradient, it never computes the
loss itself unless the loss is part of the graph.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves

__all__ = [
    "DENYLIST",
    "Captured",
    "Inventory",
    "OpStat",
    "Violation",
    "capture",
    "check_op",
    "inventory",
    "inventory_callable",
    "record_ops",
]

# ----------------------------------------------------------------------------------------------
# The denylist (NOTES.md, "What fails"): op packet name -> why. Matched on the aten packet name
# (``aten.max.dim`` -> packet ``max``, overload ``dim``) after the Python dispatcher, i.e. after
# CompositeImplicit decompositions (``argsort`` arrives as ``sort``, ``linear`` as ``addmm``).
# ----------------------------------------------------------------------------------------------

_SDPA_REASON = (
    "scaled_dot_product_attention: passes per-op probes but fails as a whole graph on RNGD; "
    "use eager attention (matmul, softmax, matmul)"
)

#: (packet, overload or None for all overloads) -> reason. Special cases live in ``check_op``.
DENYLIST: dict[tuple[str, str | None], str] = {
    ("max", "dim"): "max.dim (values+indices) does not compile; use amax (values only)",
    ("min", "dim"): "min.dim (values+indices) does not compile; use amin (values only)",
    ("argmax", None): "argmax does not compile (and yields int64)",
    ("argmin", None): "argmin does not compile (and yields int64)",
    ("argsort", None): "argsort does not compile; sort on the host",
    ("sort", None): "sort does not compile; sort on the host",
    ("topk", None): "topk compiles only for some shapes; route on the host",
    ("histc", None): "histc does not compile; count on the host",
    ("bincount", None): "bincount does not compile; count on the host",
    ("nonzero", None): "nonzero is data-dependent and does not compile",
    ("nonzero_static", None): "nonzero does not compile",
    ("index_add", None): "index_add (scatter-add) does not compile",
    ("index_add_", None): "index_add (scatter-add) does not compile",
    ("scatter_add", None): "scatter_add does not compile",
    ("scatter_add_", None): "scatter_add does not compile",
    ("_grouped_mm", None): "_grouped_mm does not compile; use a padded bmm",
    ("grouped_mm", None): "grouped_mm does not compile; use a padded bmm",
    ("cumsum", None): "cumsum does not compile",
    ("cumsum_", None): "cumsum does not compile",
    ("floor_divide", None): "floor_divide does not compile",
    ("floor_divide_", None): "floor_divide does not compile",
    ("logsumexp", None): (
        "logsumexp does not compile, per op or whole graph ('failed to import dfg: Not importable "
        "for all cases, logsumexp'); write it as m + log(sum(exp(z - m))), m = amax(z) detached"
    ),
    ("_local_scalar_dense", None): ".item(): a host sync / data-dependent value in a device graph",
    ("scaled_dot_product_attention", None): _SDPA_REASON,
}
_DENY_PREFIXES: dict[str, str] = {"_scaled_dot_product_": _SDPA_REASON}
_INDEX_PUT = {"index_put", "index_put_", "_index_put_impl", "_index_put_impl_"}
_COMPLEX = {torch.complex32, torch.complex64, torch.complex128}


def _tensor_dtypes(obj: Any) -> list[torch.dtype]:
    return [t.dtype for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _index_put_accumulates(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    if "accumulate" in kwargs:
        return bool(kwargs["accumulate"])
    return len(args) > 3 and bool(args[3])


def check_op(
    op: str,
    in_dtypes: Iterable[torch.dtype],
    out_dtypes: Iterable[torch.dtype],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
) -> list[tuple[str, str]]:
    """Rules broken by one aten op call: a list of ``(rule, detail)``; empty when fine.

    ``op`` is ``"aten.<packet>.<overload>"`` (``str(OpOverload)``); ``args``/``kwargs`` are only
    looked at for ``index_put``'s ``accumulate`` flag.
    """
    kwargs = kwargs or {}
    parts = op.split(".")
    packet = parts[1] if len(parts) > 1 else parts[0]
    overload = parts[2] if len(parts) > 2 else "default"
    ins, outs = list(in_dtypes), list(out_dtypes)
    found: list[tuple[str, str]] = []

    reason = DENYLIST.get((packet, overload)) or DENYLIST.get((packet, None))
    if reason is None:
        reason = next((r for p, r in _DENY_PREFIXES.items() if packet.startswith(p)), None)
    if reason is not None:
        found.append(("denylist", reason))
    if packet in _INDEX_PUT and _index_put_accumulates(args, kwargs):
        found.append(("denylist", "index_put with accumulate=True (scatter-add) does not compile"))
    if packet == "_softmax_backward_data" and torch.float32 in outs:
        found.append(
            (
                "denylist",
                "_softmax_backward_data in float32 does not compile (bf16 does); run the "
                "attention softmax in bf16 or write its backward as y * (g - sum(g * y))",
            )
        )
    if torch.int64 in ins or torch.int64 in outs:
        where = "output" if torch.int64 in outs else "input"
        found.append(("int64", f"int64 tensor {where}: RNGD rejects int64 ops; use int32"))
    if any(d in _COMPLEX for d in (*ins, *outs)):
        found.append(("complex", "complex dtype: not supported on RNGD; use real cos/sin rotary"))
    return found


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


@dataclass
class OpStat:
    """One aten op overload seen in a graph."""

    op: str
    count: int = 0
    in_dtypes: set[str] = field(default_factory=set)
    out_dtypes: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "count": self.count,
            "in_dtypes": sorted(self.in_dtypes),
            "out_dtypes": sorted(self.out_dtypes),
        }


@dataclass
class Violation:
    """A rule broken by an op (or a graph input)."""

    op: str
    rule: str  # "int64" | "denylist" | "complex" | "input"
    detail: str
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Inventory:
    """The op inventory of one graph in one direction."""

    graph: str
    direction: str  # "forward" | "backward"
    tracer: str  # "aot" | "eager" | "furiosa-trace"
    ops: dict[str, OpStat] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def n_ops(self) -> int:
        """Distinct op overloads."""
        return len(self.ops)

    @property
    def n_calls(self) -> int:
        return sum(s.count for s in self.ops.values())

    def failed_ops(self) -> list[str]:
        return sorted({v.op for v in self.violations})

    def add(
        self,
        op: str,
        in_dtypes: Sequence[torch.dtype],
        out_dtypes: Sequence[torch.dtype],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        stat = self.ops.setdefault(op, OpStat(op))
        stat.count += 1
        stat.in_dtypes.update(_dtype_name(d) for d in in_dtypes)
        stat.out_dtypes.update(_dtype_name(d) for d in out_dtypes)
        for rule, detail in check_op(op, in_dtypes, out_dtypes, args, kwargs):
            self._violate(op, rule, detail)

    def _violate(self, op: str, rule: str, detail: str) -> None:
        for v in self.violations:
            if v.op == op and v.rule == rule and v.detail == detail:
                v.count += 1
                return
        self.violations.append(Violation(op, rule, detail))

    def summary(self) -> str:
        head = (
            f"{self.graph} {self.direction}: {self.n_ops} ops / {self.n_calls} calls "
            f"({self.tracer}) {'ok' if self.ok else 'FAIL'}"
        )
        lines = [head] + [f"  {v.rule:8} {v.op} x{v.count}: {v.detail}" for v in self.violations]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "direction": self.direction,
            "tracer": self.tracer,
            "ok": self.ok,
            "n_ops": self.n_ops,
            "n_calls": self.n_calls,
            "seconds": round(self.seconds, 3),
            "ops": [self.ops[k].to_dict() for k in sorted(self.ops)],
            "violations": [v.to_dict() for v in self.violations],
            "notes": self.notes,
        }


# ----------------------------------------------------------------------------------------------
# Recording
# ----------------------------------------------------------------------------------------------

# Bookkeeping ops that never reach a device kernel; recorded but never flagged.
_IGNORED = {"aten.detach.default", "aten.lift_fresh.default", "aten.alias.default"}


class _Recorder(TorchDispatchMode):
    """Records every aten op that reaches the Python dispatcher (below autograd)."""

    def __init__(self, inv: Inventory) -> None:
        super().__init__()
        self.inv = inv

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if name in _IGNORED:
            stat = self.inv.ops.setdefault(name, OpStat(name))
            stat.count += 1
        else:
            self.inv.add(name, _tensor_dtypes((args, kwargs)), _tensor_dtypes(out), args, kwargs)
        return out


class _FunctionRecorder(TorchFunctionMode):
    """Sees torch-level calls before any decomposition: CPU autograd decomposes sdpa into
    matmul/softmax above the dispatcher, so only this level sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = getattr(func, "__name__", "")
        if (name, None) in DENYLIST or any(name.startswith(p) for p in _DENY_PREFIXES):
            self.hits[name] = self.hits.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _function_level(inv: Inventory, fn: Callable[..., Any], *args: Any) -> None:
    """Flag denylisted torch functions (the caller drops those the aten trace also shows)."""
    rec = _FunctionRecorder()
    with torch.no_grad(), rec:
        fn(*args)
    for name, count in rec.hits.items():
        reason = DENYLIST.get((name, None)) or next(
            r for p, r in _DENY_PREFIXES.items() if name.startswith(p)
        )
        inv.violations.append(Violation(f"torch.{name}", "denylist", reason, count))


def record_ops(inv: Inventory, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` recording its aten ops into ``inv``; returns ``fn``'s result."""
    with _Recorder(inv):
        return fn(*args, **kwargs)


def _check_inputs(inv: Inventory, inputs: Sequence[Any], label: str = "input") -> None:
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.dtype == torch.int64:
            inv._violate(
                f"<{label} {i}>",
                "input",
                f"{label} {i} {tuple(t.shape)} is int64: device index inputs must be int32",
            )
        if isinstance(t, torch.Tensor) and t.dtype in _COMPLEX:
            inv._violate(f"<{label} {i}>", "complex", f"{label} {i} has complex dtype {t.dtype}")


# ----------------------------------------------------------------------------------------------
# Capture: forward + backward graphs as AOTAutograd produces them
# ----------------------------------------------------------------------------------------------


@dataclass
class Captured:
    """A device graph's forward and backward, with real CPU inputs for each."""

    name: str
    fw: Callable[..., Any]  # fx.GraphModule (aot) or the module (eager)
    fw_args: tuple[Any, ...]
    bw: Callable[..., Any] | None  # fx.GraphModule without None outputs (aot) or None
    bw_args: tuple[Any, ...]
    outputs: list[torch.Tensor]  # the forward's flat outputs
    grads: dict[str, torch.Tensor | None]  # "input 0" / "param q_proj.lora_A..." -> grad
    wrt: list[str]
    tracer: str
    notes: list[str] = field(default_factory=list)


def _graph_parts(graph: Any) -> tuple[str, Any, tuple[Any, ...], list[Any] | None]:
    """``(name, module, example_inputs, trainable)`` of a graph object.

    ``trainable``: the graph's ``trainable`` attribute (params, param names, input indices)
    when it has one; otherwise its ``grad_inputs`` (input indices, ``npu_lora.device.graphs``)
    plus the module's LoRA parameters (``lora_`` in the name: the engine trains only the
    adapters, base weights are frozen); ``None`` (= default) when it has neither.
    """
    name = getattr(graph, "name", None) or type(graph).__name__
    module = getattr(graph, "module", graph)
    inputs = tuple(getattr(graph, "example_inputs", ()))
    trainable = getattr(graph, "trainable", None)
    if trainable is not None:
        return name, module, inputs, list(trainable)
    grad_inputs = getattr(graph, "grad_inputs", None)
    if grad_inputs is None:
        return name, module, inputs, None
    lora: list[Any] = []
    if isinstance(module, torch.nn.Module):
        lora = [n for n, _ in module.named_parameters() if "lora_" in n]
    return name, module, inputs, [*grad_inputs, *lora]


def _resolve_trainable(
    module: Any, inputs: Sequence[Any], trainable: Sequence[Any] | None
) -> tuple[list[str], list[tuple[str, torch.Tensor]], set[str], set[int]]:
    """Split ``trainable`` (params, param names, input indices) into parameter names and input
    indices that need grad. ``trainable=None``: every param with ``requires_grad`` and every
    floating-point input."""
    named: list[tuple[str, torch.Tensor]] = []
    if isinstance(module, torch.nn.Module):
        named = list(module.named_parameters()) + list(module.named_buffers())
    by_id = {id(t): n for n, t in named}
    p_names: set[str] = set()
    in_idx: set[int] = set()
    for t in trainable or ():
        if isinstance(t, bool):
            raise TypeError(f"trainable entries are params, names or input indices, not {t!r}")
        if isinstance(t, int):
            in_idx.add(t if t >= 0 else len(inputs) + t)
        elif isinstance(t, str):
            p_names.add(t)
        elif isinstance(t, torch.Tensor) and id(t) in by_id:
            p_names.add(by_id[id(t)])
        else:
            raise ValueError(f"trainable entry {type(t).__name__} is not a parameter of the module")
    if trainable is None:
        if isinstance(module, torch.nn.Module):
            p_names = {n for n, p in module.named_parameters() if p.requires_grad}
        in_idx = {
            i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()
        }
    names = [n for n, _ in named]
    unknown = p_names - set(names)
    if unknown:
        raise ValueError(f"trainable names not in the module: {sorted(unknown)}")
    wrt = [f"input {i}" for i in sorted(in_idx)] + [f"param {n}" for n in names if n in p_names]
    return wrt, named, p_names, in_idx


def _cotangents(outs: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype) for o in outs]


def _drop_none_outputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """AOT backward graphs return None for inputs without grad; compilers want tensors only."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    (outs,) = out_node.args
    if isinstance(outs, list | tuple):
        kept = tuple(o for o in outs if o is not None)
        out_node.args = (kept,)
        gm.graph.lint()
        gm.recompile()
    return gm


def capture(graph: Any, *, mode: str = "aot", seed: int = 0) -> Captured:
    """Run ``graph`` forward and backward once on CPU, capturing both directions.

    ``graph`` is a ``DeviceGraph`` (``name``, ``module``, ``example_inputs``, ``trainable``) or
    anything with those attributes. ``mode="aot"`` captures AOTAutograd's forward/backward
    graphs (falls back to ``eager`` with a note when that fails).
    """
    if mode == "aot":
        try:
            return _capture_aot(graph, seed)
        except Exception as exc:  # any capture failure means "trace eagerly"
            cap = _capture_eager(graph, seed)
            cap.notes.append(f"AOT capture failed ({type(exc).__name__}: {exc}); traced eagerly")
            return cap
    if mode == "eager":
        return _capture_eager(graph, seed)
    raise ValueError(f"unknown capture mode {mode!r}")


def _flat_call(module: Any, names: list[str], n_params: int) -> Callable[..., Any]:
    def call(*flat: Any) -> Any:
        if not names:
            return module(*flat)
        ps = dict(zip(names, flat[:n_params], strict=True))
        return torch.func.functional_call(module, ps, tuple(flat[n_params:]))

    return call


def _prepare(graph: Any) -> tuple[str, Any, list[str], list[torch.Tensor], list[Any], list[str]]:
    name, module, inputs, trainable = _graph_parts(graph)
    wrt, named, p_names, in_idx = _resolve_trainable(module, inputs, trainable)
    names = [n for n, _ in named]
    params = [t.detach().requires_grad_(n in p_names) for n, t in named]
    ins = [
        t.detach().requires_grad_(i in in_idx) if isinstance(t, torch.Tensor) else t
        for i, t in enumerate(inputs)
    ]
    return name, module, names, params, ins, wrt


def _grads_for(
    outs: Sequence[torch.Tensor], cots: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor]
) -> tuple[torch.Tensor | None, ...]:
    if not leaves or not outs:
        return tuple(None for _ in leaves)
    return torch.autograd.grad(list(outs), list(leaves), list(cots), allow_unused=True)


def _leaves(
    names: list[str], params: list[torch.Tensor], ins: list[Any], wrt: list[str]
) -> list[torch.Tensor]:
    by_label = {f"param {n}": p for n, p in zip(names, params, strict=True)}
    by_label.update({f"input {i}": t for i, t in enumerate(ins)})
    return [by_label[w] for w in wrt]


def _capture_aot(graph: Any, seed: int) -> Captured:
    from functorch.compile import aot_function, make_boxed_func

    name, module, names, params, ins, wrt = _prepare(graph)
    cap: dict[str, Any] = {}

    def fw_compiler(gm: torch.fx.GraphModule, _example: Any) -> Any:
        cap["fw"] = gm

        def run(*args: Any) -> Any:
            cap["fw_args"] = tuple(args)
            return gm(*args)

        return make_boxed_func(run)

    def bw_compiler(gm: torch.fx.GraphModule, _example: Any) -> Any:
        cap["bw"] = gm

        def run(*args: Any) -> Any:
            cap["bw_args"] = tuple(args)
            return gm(*args)

        return make_boxed_func(run)

    compiled = aot_function(
        _flat_call(module, names, len(params)), fw_compiler=fw_compiler, bw_compiler=bw_compiler
    )
    with torch.enable_grad():
        out = compiled(*params, *ins)
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        diff = [o for o in flat_out if o.requires_grad]
        leaves = _leaves(names, params, ins, wrt)
        grads = _grads_for(diff, _cotangents(diff, seed), leaves)
    notes: list[str] = []
    bw = cap.get("bw")
    bw_args: tuple[Any, ...] = cap.get("bw_args", ())
    if bw is not None and "bw_args" in cap:
        # The backward graph mutates nothing, but it may consume (steal) its input list: copy.
        bw_args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in bw_args)
        bw = _drop_none_outputs(bw)
    elif wrt:
        notes.append("no backward graph captured (no output requires grad)")
        bw = None
    return Captured(
        name=name,
        fw=cap["fw"],
        fw_args=tuple(cap["fw_args"]),
        bw=bw,
        bw_args=bw_args,
        outputs=[o.detach() for o in flat_out],
        grads={w: (g.detach() if g is not None else None) for w, g in zip(wrt, grads, strict=True)},
        wrt=wrt,
        tracer="aot",
        notes=notes,
    )


def _capture_eager(graph: Any, seed: int) -> Captured:
    name, module, names, params, ins, wrt = _prepare(graph)
    call = _flat_call(module, names, len(params))
    with torch.enable_grad():
        out = call(*params, *ins)
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        diff = [o for o in flat_out if o.requires_grad]
        grads = _grads_for(diff, _cotangents(diff, seed), _leaves(names, params, ins, wrt))
    return Captured(
        name=name,
        fw=call,
        fw_args=(*params, *ins),
        bw=None,
        bw_args=(),
        outputs=[o.detach() for o in flat_out],
        grads={w: (g.detach() if g is not None else None) for w, g in zip(wrt, grads, strict=True)},
        wrt=wrt,
        tracer="eager",
    )


# ----------------------------------------------------------------------------------------------
# Inventory
# ----------------------------------------------------------------------------------------------


def inventory(graph: Any, *, mode: str = "aot", seed: int = 0) -> dict[str, Inventory]:
    """Forward and backward op inventories of ``graph``: ``{"forward": .., "backward": ..}``."""
    t0 = time.perf_counter()
    name, module, inputs, _ = _graph_parts(graph)
    cap = capture(graph, mode=mode, seed=seed)
    t_cap = time.perf_counter() - t0

    fwd = Inventory(name, "forward", cap.tracer, notes=list(cap.notes))
    bwd = Inventory(name, "backward", cap.tracer, notes=list(cap.notes))
    _check_inputs(fwd, inputs)
    fn_level = Inventory(name, "forward", "torch-function")

    if cap.tracer == "aot":
        t1 = time.perf_counter()
        with torch.no_grad():
            record_ops(fwd, cap.fw, *cap.fw_args)
        fwd.seconds = t_cap + time.perf_counter() - t1
        t1 = time.perf_counter()
        if cap.bw is not None:
            with torch.no_grad():
                record_ops(bwd, cap.bw, *cap.bw_args)
        else:
            bwd.notes.append("no backward graph")
        bwd.seconds = time.perf_counter() - t1
    else:
        _eager_inventory(graph, fwd, bwd, seed)
    # Torch-function level (forward only: backward formulas are aten ops).
    t1 = time.perf_counter()
    _, _, names, params, ins, _ = _prepare(graph)
    _function_level(fn_level, _flat_call(module, names, len(params)), *params, *ins)
    seen = {op.split(".")[1] for op in fwd.failed_ops() if op.startswith("aten.")}
    fwd.violations += [v for v in fn_level.violations if v.op.removeprefix("torch.") not in seen]
    fwd.seconds += time.perf_counter() - t1
    return {"forward": fwd, "backward": bwd}


def _eager_inventory(graph: Any, fwd: Inventory, bwd: Inventory, seed: int) -> None:
    _, module, names, params, ins, wrt = _prepare(graph)
    call = _flat_call(module, names, len(params))
    t0 = time.perf_counter()
    with torch.enable_grad():
        out = record_ops(fwd, call, *params, *ins)
        fwd.seconds = time.perf_counter() - t0
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        diff = [o for o in flat_out if o.requires_grad]
        cots = _cotangents(diff, seed)
        leaves = _leaves(names, params, ins, wrt)
        t0 = time.perf_counter()
        if diff and leaves:
            record_ops(bwd, _grads_for, diff, cots, leaves)
        bwd.seconds = time.perf_counter() - t0


def inventory_callable(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    name: str = "fn",
    direction: str = "forward",
) -> Inventory:
    """Inventory of one plain call ``fn(*inputs)`` (e.g. a captured backward graph)."""
    inv = Inventory(name, direction, "eager")
    _check_inputs(inv, inputs)
    t0 = time.perf_counter()
    with torch.no_grad():
        record_ops(inv, fn, *inputs)
    inv.seconds = time.perf_counter() - t0
    return inv
