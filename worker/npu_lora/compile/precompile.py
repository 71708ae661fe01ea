"""Compile one graph of a plan into the graph cache (imports torch; furiosa-torch for RNGD).

``compile_entry(plan, entry, root)``: build the graph at the plan's shapes
(:func:`npu_lora.compile.graphs.plan_graphs`), compile it with the backend's compiler into a
temporary directory, publish it under its key (:func:`npu_lora.compile.cache.publish`). The
compiler is the registry entry's ``compiler`` (:data:`COMPILERS`), on its ``compile_device``:

- ``inductor`` (``cpu``, ``cuda``): ``torch.compile(module, backend="inductor", dynamic=False)``
  on the entry's ``compile_device`` (a backend without one is refused, not compiled for the
  CPU), called forward (and backward where the plan says so) on the example inputs, with
  inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, its FX graph cache) pointed into the
  entry's temporary directory: the published entry holds inductor's artefacts of that graph
  (``inductor/``).
- ``furiosa-torch`` (``furiosa``): ``furiosa.torch.CompileModule.from_module`` per direction
  (the whole graph, the way ``npu-lora rngd-check --tier compile`` compiles it), the compiler's
  own cache at ``$XDG_CACHE_HOME/<cache_folder>`` (the shared volume); the entry records it. Not
  run on this machine (no furiosa-torch here).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from npu_lora.api import backends as registry
from npu_lora.compile import cache
from npu_lora.compile.plan import Plan, PlanEntry


def _files(d: Path) -> int:
    return sum(1 for p in d.rglob("*") if p.is_file()) if d.is_dir() else 0


def _inductor(
    graph: Any, directions: list[str], workdir: Path, backend: registry.BackendEntry
) -> dict[str, Any]:
    import torch
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    device = backend.compile_device
    if not device:
        raise ValueError(
            f"backend {backend.name}: compiler inductor needs the registry entry's compile_device"
        )
    ind = workdir / "inductor"
    ind.mkdir(parents=True, exist_ok=True)
    torch._dynamo.reset()
    module = graph.module.to(device)
    inputs = []
    for i, t in enumerate(graph.example_inputs):
        t = t.detach().clone().to(device)
        if "backward" in directions and i in graph.grad_inputs and t.is_floating_point():
            t.requires_grad_(True)
        inputs.append(t)
    with temporary_cache_dir(str(ind)):
        compiled = torch.compile(module, backend="inductor", dynamic=False, fullgraph=False)
        t0 = time.perf_counter()
        out = compiled(*inputs)
        t_fwd = time.perf_counter() - t0
        t_bwd = None
        if "backward" in directions:
            outs = out if isinstance(out, tuple | list) else (out,)
            loss = sum(o.float().sum() for o in outs if o.requires_grad)
            if isinstance(loss, torch.Tensor):
                t1 = time.perf_counter()
                loss.backward()
                t_bwd = time.perf_counter() - t1
    torch._dynamo.reset()
    return {
        "compiler_call": f'torch.compile(backend="inductor", dynamic=False) on {device}',
        "forward_s": round(t_fwd, 3),
        "backward_s": None if t_bwd is None else round(t_bwd, 3),
        "artefacts": _files(ind),
    }


def _furiosa(  # pragma: no cover - RNGD venv
    graph: Any, directions: list[str], workdir: Path, backend: registry.BackendEntry
) -> dict[str, Any]:
    from npu_lora.rngd import check

    check.import_furiosa()
    out: dict[str, Any] = {"compiler_call": "furiosa.torch.CompileModule.from_module"}
    for d in directions:
        t0 = time.perf_counter()
        fn, inputs, _ = check.direction_call(graph, d)
        res = check.run_compile(fn, inputs)
        if not res.get("ok"):
            raise RuntimeError(f"{graph.name} {d}: {res.get('detail') or res}")
        out[f"{d}_s"] = round(time.perf_counter() - t0, 3)
    xdg = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    out["compiler_cache"] = os.path.join(xdg, backend.cache_dir)
    return out


#: the registry's ``compiler`` names -> how a graph is compiled with it
COMPILERS = {"inductor": _inductor, "furiosa-torch": _furiosa}


def compiler_of(backend: str) -> Any:
    """The compile function of ``backend``'s registry ``compiler`` (ValueError naming it when
    this step does not know that compiler)."""
    e = registry.entry(backend)
    try:
        return COMPILERS[e.compiler]
    except KeyError:
        raise ValueError(
            f"backend {backend}: compiler {e.compiler!r} is not one the precompile step knows "
            f"({', '.join(COMPILERS)})"
        ) from None


def compile_entry(plan: Plan, entry: PlanEntry, root: Path) -> dict[str, Any]:
    """Compile ``entry`` into the cache at ``root`` unless present. Returns ``{name, key, index,
    hit, outcome, compile_s}`` (``outcome``: hit / published / lost)."""
    from npu_lora.compile.graphs import plan_graphs

    t0 = time.perf_counter()
    if cache.present(root, entry.key):
        return {
            "index": entry.index,
            "name": entry.name,
            "key": entry.key,
            "hit": True,
            "outcome": "hit",
            "compile_s": 0.0,
        }

    compile_graph = compiler_of(plan.backend)  # an unknown compiler: refused before any work

    def build(tmp: Path) -> dict[str, Any]:
        graph = plan_graphs(plan, [entry.name])[0]
        t1 = time.perf_counter()
        how = compile_graph(graph, entry.directions, tmp, registry.entry(plan.backend))
        return {
            "key": entry.key,
            "entry": entry.to_dict(),
            "backend": plan.backend,
            "compiler": plan.compiler,
            "target": plan.target,
            "source_digest": plan.source_digest,
            "compile_s": round(time.perf_counter() - t1, 3),
            "how": how,
        }

    outcome, _doc = cache.publish(root, entry.key, build)
    return {
        "index": entry.index,
        "name": entry.name,
        "key": entry.key,
        "hit": outcome == "hit",
        "outcome": outcome,
        "compile_s": round(time.perf_counter() - t0, 3),
    }


def ensure_plan(plan: Plan, root: Path, *, compile_misses: bool = True) -> dict[str, Any]:
    """The worker's check before training: look every key of the plan up; compile the misses
    (``compile_misses``) one after another. Returns the summary.json ``compile`` record."""
    t0 = time.perf_counter()
    hits = cache.lookup(root, plan.keys)
    graphs = []
    for e in plan.entries:
        if hits[e.key] or not compile_misses:
            graphs.append(
                {
                    "index": e.index,
                    "name": e.name,
                    "key": e.key,
                    "hit": hits[e.key],
                    "outcome": "hit" if hits[e.key] else "missing",
                    "compile_s": 0.0,
                }
            )
        else:
            graphs.append(compile_entry(plan, e, root))
    n_hit = sum(1 for k in plan.keys if hits[k])
    return {
        "cache": str(root),
        "backend": plan.backend,
        "compiler": plan.compiler,
        "target": plan.target,
        "total": len(plan.entries),
        "hits": n_hit,
        "misses": len(plan.entries) - n_hit,
        "compiled": sum(1 for g in graphs if g["outcome"] in ("published", "lost")),
        "seconds": round(time.perf_counter() - t0, 3),
        "graphs": graphs,
    }
