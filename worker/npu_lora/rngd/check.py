"""``npu-lora rngd-check``: compile every device graph with furiosa-torch's compiler on the CPU.

For each device graph (``npu_lora.rngd.catalogue.device_graphs``) and each direction (forward;
backward = AOTAutograd's partitioned backward graph, see ``inventory.capture``), up to three
tiers:

* ``inventory``: the aten op list with dtypes, against RNGD's rules (no int64 tensor op, no
  denylisted op). Uses the pure-torch tracer always, plus ``furiosa.torch.dryrun.dryrun(...,
  trace_only=True)`` (the compiler's own pre-dispatch trace) when furiosa-torch is installed.
* ``probe``: ``furiosa.torch.dryrun.dryrun``: every op compiled in isolation.
* ``compile``: ``furiosa.torch.CompileModule.from_module``: the whole graph compiled (calling
  the result would need a device; compiling does not). Per-op success does not imply this.

Probe and compile jobs run one per subprocess (isolates compiler crashes and gives a per-job
peak RSS, taken from ``wait4``) with a timeout. The compiler's cache (``XDG_CACHE_HOME``) and
temp files (``TMPDIR``: every compile leaks an empty ``.tmpXXXX``) go to a scratch directory this
command owns and removes; ``--cache-dir`` keeps a persistent compile cache between runs (warm
compiles take seconds instead of minutes).

Exit status: 0 when every requested check passed, 1 when any failed, 2 when it could not run
(no furiosa-torch for the probe/compile tiers, no device graphs, bad arguments).

Run in the RNGD venv (``scripts/rngd-env.sh``)::

    ~/.cache/npu-lora/rngd-venv/bin/npu-lora rngd-check --tier all --json out.json

The arguments are parsed in :mod:`npu_lora.commands.rngd_check`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from npu_lora.api.timefmt import rfc3339
from npu_lora.machine import machine_facts

DEFAULT_SOURCE = "npu_lora.rngd.catalogue:device_graphs"
TIERS = ("inventory", "probe", "compile")
DIRECTIONS = ("forward", "backward")
DEFAULT_VENV = "${NPU_LORA_RNGD_VENV:-$HOME/.cache/npu-lora/rngd-venv}"


@dataclass
class Row:
    """One line of the table: a graph, a direction, a tier."""

    graph: str
    direction: str
    tier: str
    ok: bool
    ops: int = 0  # ops traced (inventory) / ops probed (probe) / graph nodes (compile)
    failed_ops: list[str] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss_mb: float | None = None
    detail: str = ""
    skipped: bool = False  # could not run here (no furiosa-torch): not a pass
    na: bool = False  # nothing to check (a graph with nothing trainable has no backward)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# Environment: scratch dir for the compiler's cache and temp files
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def compiler_scratch(cache_dir: Path | None) -> Iterator[Path]:
    """Point ``XDG_CACHE_HOME`` and ``TMPDIR`` at a scratch dir we own; restore and remove it."""
    scratch = Path(tempfile.mkdtemp(prefix="npu-lora-rngd-"))
    tmp = scratch / "tmp"
    tmp.mkdir()
    cache = cache_dir.resolve() if cache_dir is not None else scratch / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "TMPDIR")}
    saved_tempdir = tempfile.tempdir
    os.environ["XDG_CACHE_HOME"] = str(cache)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None  # re-read TMPDIR
    try:
        yield scratch
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = saved_tempdir
        shutil.rmtree(scratch, ignore_errors=True)


def furiosa_available() -> bool:
    """furiosa-torch installed (does not import it, nor torch)."""
    try:
        return importlib.util.find_spec("furiosa.torch") is not None
    except (ImportError, ValueError):
        return False


def import_furiosa() -> Any:
    import furiosa.torch as ft

    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        # Without torch's backend autoload the device is not registered and every probe fails.
        importlib.import_module("furiosa.torch._register")
    return ft


# ----------------------------------------------------------------------------------------------
# Graphs
# ----------------------------------------------------------------------------------------------


def load_factory(source: str) -> Callable[..., Any]:
    """``MODULE:FUNC`` or ``path/to/file.py:FUNC`` -> the graph factory."""
    target, _, func = source.rpartition(":")
    if not target or not func:
        raise ValueError(f"--source must be MODULE:FUNC or FILE.py:FUNC, not {source!r}")
    if target.endswith(".py"):
        path = Path(target).resolve()
        spec = importlib.util.spec_from_file_location(f"_rngd_source_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(target)
    return getattr(mod, func)


def _absolute_source(source: str) -> str:
    target, _, func = source.rpartition(":")
    if target.endswith(".py"):
        return f"{Path(target).resolve()}:{func}"
    return source


def plan_of(args: argparse.Namespace) -> Any:
    """``--plan FILE``: the compile plan of that manifest for the ``furiosa`` backend (``--set``
    overrides applied), made by ``args.load_plan`` (:func:`npu_lora.commands.rngd_check.load_plan`,
    the parser's default: ``rngd`` sits below ``compile``); None without ``--plan``."""
    if not getattr(args, "plan", None):
        return None
    return args.load_plan(args)


def build_graphs(args: argparse.Namespace) -> list[Any]:
    plan = plan_of(args)
    if plan is not None:  # the run's own list of device graphs (the same one precompile uses)
        names = [e.name for e in plan.entries]
        unknown = [n for n in (args.graphs or []) if n not in names]
        if unknown:
            raise ValueError(f"unknown graphs {unknown}; have {names}")
        # npu_lora.compile.graphs.plan_graphs, handed down by the command (rngd sits below compile)
        return args.plan_graphs(plan, args.graphs or None)
    factory = load_factory(args.source)
    kwargs: dict[str, Any] = {"widths": args.widths, "seq_len": args.seq_len}
    if args.buckets:
        kwargs["buckets"] = tuple(args.buckets)
    if args.dtype:
        import torch

        kwargs["dtype"] = getattr(torch, args.dtype)
    graphs = list(factory(**kwargs))
    if args.graphs:
        names = [g.name for g in graphs]
        unknown = [n for n in args.graphs if n not in names]
        if unknown:
            raise ValueError(f"unknown graphs {unknown}; have {names}")
        graphs = [g for g in graphs if g.name in args.graphs]
    return graphs


def has_backward(graph: Any) -> bool:
    """Whether the graph has anything to differentiate (trainable inputs or parameters)."""
    from .inventory import _graph_parts, _resolve_trainable

    _, module, inputs, trainable = _graph_parts(graph)
    return bool(_resolve_trainable(module, inputs, trainable)[0])


def _na_row(graph: Any, tier: str) -> Row:
    return Row(graph.name, "backward", tier, ok=True, na=True,
               detail="n/a: nothing trainable, no backward graph")  # fmt: skip


def direction_call(graph: Any, direction: str) -> tuple[Any, tuple[Any, ...], list[str]]:
    """The callable and real CPU inputs the compiler gets for one direction.

    forward: the graph's module and example inputs. backward: AOTAutograd's partitioned
    backward graph (saved activations + output cotangents -> gradients) and its inputs.
    """
    from .inventory import capture

    if direction == "forward":
        return graph.module, tuple(graph.example_inputs), []
    cap = capture(graph)
    if cap.bw is None:
        raise RuntimeError(f"no backward graph for {graph.name}: {cap.notes}")
    return cap.bw, cap.bw_args, cap.notes


# ----------------------------------------------------------------------------------------------
# Tiers
# ----------------------------------------------------------------------------------------------


def _peak_rss_self_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _gm_inventory(gm: Any, inv: Any) -> None:
    """Add a traced fx graph's nodes (dtypes from ``meta['val']``) to an ``Inventory``."""
    from torch.utils._pytree import tree_leaves

    from .inventory import _tensor_dtypes

    def val(a: Any) -> Any:
        return a.meta.get("val") if hasattr(a, "meta") else None

    for node in gm.graph.nodes:
        if node.op != "call_function" or not str(node.target).startswith("aten."):
            continue
        ins = [val(a) for a in tree_leaves((node.args, node.kwargs))]
        inv.add(
            str(node.target),
            _tensor_dtypes(ins),
            _tensor_dtypes(node.meta.get("val")),
            node.args,
            node.kwargs,
        )


def run_inventory(graph: Any, directions: Sequence[str], with_furiosa: bool) -> list[Row]:
    from .inventory import Inventory, capture, inventory

    t0 = time.perf_counter()
    invs = inventory(graph)
    rows = []
    cap = None
    for d in directions:
        inv = invs[d]
        tracer = inv.tracer
        extra: dict[str, Any] = {"aten": inv.to_dict()}
        seconds = inv.seconds
        if with_furiosa:
            from furiosa.torch.dryrun import dryrun

            t1 = time.perf_counter()
            try:
                if d == "forward":
                    fn, ins = graph.module, tuple(graph.example_inputs)
                else:
                    cap = cap or capture(graph)
                    fn, ins = cap.bw, cap.bw_args
                res = dryrun(fn, *ins, verbose=False, trace_only=True)
                finv = Inventory(inv.graph, d, "furiosa-trace")
                _gm_inventory(res.gm, finv)
                extra["furiosa"] = finv.to_dict()
                known = {(v.op, v.rule) for v in inv.violations}
                inv.violations += [v for v in finv.violations if (v.op, v.rule) not in known]
                tracer += "+furiosa"
            except Exception as exc:  # reported as a failed row
                inv.notes.append(f"furiosa trace failed: {type(exc).__name__}: {exc}")
                inv.violations.append(
                    _violation("<furiosa trace>", "trace", f"{type(exc).__name__}: {exc}")
                )
            seconds += time.perf_counter() - t1
        rows.append(
            Row(
                graph=inv.graph,
                direction=d,
                tier="inventory",
                ok=inv.ok,
                ops=inv.n_ops,
                failed_ops=inv.failed_ops(),
                seconds=seconds,
                peak_rss_mb=None,
                detail="; ".join([f"{v.op}: {v.detail}" for v in inv.violations] + inv.notes),
                extra={"tracer": tracer, **extra},
            )
        )
    if rows and not any(r.seconds for r in rows):
        rows[0].seconds = time.perf_counter() - t0
    return rows


def _violation(op: str, rule: str, detail: str) -> Any:
    from .inventory import Violation

    return Violation(op, rule, detail)


def _root_cause(exc: BaseException) -> str:
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [ln.strip() for ln in str(root).splitlines() if ln.strip()]
    return f"{type(root).__name__}: {lines[0] if lines else ''}"[:300]


def run_probe(fn: Any, inputs: Sequence[Any]) -> dict[str, Any]:
    """Per-op compile probes: ok unless an op FAILs or the probe ERRORs."""
    import_furiosa()
    from furiosa.torch.dryrun import dryrun

    res = dryrun(fn, *inputs, verbose=False)
    st = res.statistics
    failed: list[str] = []
    reasons: list[str] = []
    per_op: list[dict[str, Any]] = []
    for rep in res.reports:
        r = rep.report
        status = r.status.name
        per_op.append(
            {
                "node": rep.node_name,
                "op": rep.target,
                "status": status,
                "compile_s": r.native_compile_sec,
                "cache_hit": r.memory_cache_hit,
            }
        )
        if status in ("FAIL", "ERROR"):
            if rep.target not in failed:
                failed.append(rep.target)
            reasons.append(
                f"{rep.target} {status}: {_root_cause(r.exception) if r.exception else ''}"
            )
    return {
        "ok": st.compile_fail == 0 and st.probe_error == 0,
        "ops": st.attempted + st.probe_error,
        "failed_ops": failed,
        "detail": "; ".join(reasons[:10]) or str(st),
        "extra": {"statistics": str(st), "per_op": per_op},
    }


def run_compile(fn: Any, inputs: Sequence[Any]) -> dict[str, Any]:
    """Whole-graph AOT compile with ``CompileModule.from_module``."""
    ft = import_furiosa()
    n_nodes = 0
    if hasattr(fn, "graph"):
        n_nodes = sum(1 for n in fn.graph.nodes if n.op == "call_function")
    try:
        ft.CompileModule.from_module(fn, tuple(inputs))
    except Exception as exc:  # a compile failure is the result
        text = str(exc)
        # The compiler's own diagnosis (which fused kernel failed, and why) follows "Caused by";
        # the text before it is mostly the whole fx graph.
        at = text.find("Caused by")
        cause = text[at : at + 6000] if at >= 0 else ""
        short = " ".join(cause.split())[:400]
        return {
            "ok": False,
            "ops": n_nodes,
            "failed_ops": ["<whole graph>"],
            "detail": _root_cause(exc) + (f" | {short}" if short else ""),
            "extra": {"exception": f"{type(exc).__name__}: {text[:2000]}", "cause": cause},
        }
    return {"ok": True, "ops": n_nodes, "failed_ops": [], "detail": "", "extra": {}}


def run_job(args: argparse.Namespace, graph_name: str, direction: str, tier: str) -> Row:
    """One probe/compile job in this process."""
    t0 = time.perf_counter()
    try:
        graph = next(g for g in build_graphs(args) if g.name == graph_name)
        fn, inputs, notes = direction_call(graph, direction)
        out = run_probe(fn, inputs) if tier == "probe" else run_compile(fn, inputs)
        if notes:
            out["detail"] = "; ".join([out["detail"], *notes]).strip("; ")
    except Exception as exc:  # reported as a failed row
        out = {"ok": False, "ops": 0, "failed_ops": ["<job>"], "detail": _root_cause(exc)}
    return Row(
        graph=graph_name,
        direction=direction,
        tier=tier,
        ok=out["ok"],
        ops=out["ops"],
        failed_ops=out["failed_ops"],
        seconds=time.perf_counter() - t0,
        peak_rss_mb=_peak_rss_self_mb(),
        detail=out["detail"],
        extra=out.get("extra", {}),
    )


def _job_argv(args: argparse.Namespace) -> list[str]:
    argv = [
        "--widths", args.widths,
        "--seq-len", str(args.seq_len),
        "--source", _absolute_source(args.source),
    ]  # fmt: skip
    if args.buckets:
        argv += ["--buckets", ",".join(str(b) for b in args.buckets)]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    if getattr(args, "plan", None):
        argv += ["--plan", str(Path(args.plan).resolve())]
        for o in getattr(args, "overrides", None) or []:
            argv += ["--set", o]
    return argv


def run_job_subprocess(args: argparse.Namespace, graph_name: str, direction: str, tier: str) -> Row:
    """One probe/compile job in a child process; peak RSS from ``wait4`` (child + its waited
    descendants); killed (whole process group) after ``--timeout`` seconds."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out_path = Path(f.name)
    cmd = [
        sys.executable, "-m", "npu_lora.commands.rngd_check", *_job_argv(args),
        "--_job", json.dumps([graph_name, direction, tier]), "--_job-out", str(out_path),
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True)
    status, rusage, timed_out = 0, None, False
    try:
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > args.timeout:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                _, status, rusage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    peak = rusage.ru_maxrss / 1024.0 if rusage is not None else None
    try:
        data = json.loads(out_path.read_text()) if out_path.stat().st_size else None
    except (OSError, json.JSONDecodeError):
        data = None
    finally:
        out_path.unlink(missing_ok=True)
    if data is None:
        why = f"timed out after {args.timeout:.0f} s" if timed_out else f"exit {proc.returncode}"
        return Row(graph_name, direction, tier, ok=False, failed_ops=["<job>"], seconds=seconds,
                   peak_rss_mb=peak, detail=f"job died: {why}")  # fmt: skip
    row = Row(**data)
    row.seconds = seconds  # includes the child's start-up (torch + furiosa import, graph build)
    row.extra["job_seconds"] = data["seconds"]
    row.peak_rss_mb = peak
    return row


# ----------------------------------------------------------------------------------------------
# Table, JSON, main
# ----------------------------------------------------------------------------------------------


def format_table(rows: Sequence[Row]) -> str:
    head = ("graph", "dir", "tier", "ops", "ok", "failed ops", "seconds", "peak RSS MB")
    body = []
    for r in rows:
        ok = "skip" if r.skipped else "n/a" if r.na else ("ok" if r.ok else "FAIL")
        failed = ",".join(op.removeprefix("aten.").removeprefix("aten::") for op in r.failed_ops)
        body.append(
            (
                r.graph,
                r.direction,
                r.tier,
                str(r.ops),
                ok,
                (failed[:60] + "...") if len(failed) > 63 else failed or "-",
                f"{r.seconds:.1f}",
                f"{r.peak_rss_mb:.0f}" if r.peak_rss_mb is not None else "-",
            )
        )
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _log(msg: str) -> None:
    print(f"[rngd-check] {msg}", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds: kills the running job, removes the scratch dir


def run_check(args: argparse.Namespace) -> int:
    """Run the check for parsed ``npu-lora rngd-check`` options."""
    import threading

    bad_dirs = [d for d in args.directions if d not in DIRECTIONS]
    if bad_dirs:
        _log(f"unknown directions {bad_dirs}; use {','.join(DIRECTIONS)}")
        return 2

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with compiler_scratch(args.cache_dir) as scratch:
        return _run_check(args, scratch)


def _run_check(args: argparse.Namespace, scratch: Path) -> int:
    tiers = list(TIERS) if args.tier == "all" else [args.tier]
    have_furiosa = furiosa_available()
    started = rfc3339()
    try:
        if have_furiosa:
            import_furiosa()  # before graphs are built: it sets dynamo config globally
        graphs = build_graphs(args)
    except (ImportError, AttributeError, ValueError) as exc:
        _log(f"no device graphs from {args.source}: {type(exc).__name__}: {exc}")
        return 2
    args._plan_keys = {g.name: getattr(g, "plan_key", None) for g in graphs}
    args._plan_keys = {k: v for k, v in args._plan_keys.items() if v}
    if args.list:
        for g in graphs:
            shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in g.example_inputs)
            key = args._plan_keys.get(g.name)
            key = f"  key {key[:16]}" if key else ""
            print(f"{g.name}: {shapes}{key}")
        return 0
    machine_start = machine_facts()
    _log(
        f"{len(graphs)} graphs "
        f"({f'plan of {args.plan}' if getattr(args, 'plan', None) else args.widths}, "
        f"seq {args.seq_len if not getattr(args, 'plan', None) else 'of the plan'}), tiers {tiers}, "
        f"furiosa-torch {'yes' if have_furiosa else 'NO'}, cache "
        f"{args.cache_dir or scratch / 'cache'}"
    )

    rows: list[Row] = []
    status = 0
    if "inventory" in tiers:
        for g in graphs:
            dirs = [d for d in args.directions if d == "forward" or has_backward(g)]
            new = run_inventory(g, dirs, have_furiosa)
            if "backward" in args.directions and "backward" not in dirs:
                new.append(_na_row(g, "inventory"))
            for r in new:
                _log(f"inventory {r.graph} {r.direction}: {'ok' if r.ok else 'FAIL ' + r.detail}")
            rows += new
    for tier in (t for t in tiers if t != "inventory"):
        for g in graphs:
            for d in args.directions:
                if d == "backward" and not has_backward(g):
                    rows.append(_na_row(g, tier))
                    continue
                if not have_furiosa:
                    rows.append(Row(g.name, d, tier, ok=False, skipped=True,
                                    detail="furiosa-torch not installed"))  # fmt: skip
                    continue
                _log(f"{tier} {g.name} {d} ...")
                if args.in_process:
                    row = run_job(args, g.name, d, tier)
                else:
                    row = run_job_subprocess(args, g.name, d, tier)
                row.extra["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                _log(
                    f"{tier} {g.name} {d}: {'ok' if row.ok else 'FAIL'} {row.seconds:.1f} s "
                    f"{row.detail[:200]}"
                )
                rows.append(row)
                if args.json_out:  # partial results survive an interrupted long run
                    _write_json(args, rows, started, machine_start, partial=True)

    print(format_table(rows))
    if any(not r.ok and not r.skipped for r in rows):
        status = 1
    if any(r.skipped for r in rows):
        _log(
            "probe/compile tiers need furiosa-torch: build its venv with scripts/rngd-env.sh "
            f"and run with {DEFAULT_VENV}/bin/python"
        )
        status = status or 2
    if args.json_out:
        _write_json(args, rows, started, machine_start, partial=False)
    return status


def _write_json(
    args: argparse.Namespace,
    rows: Sequence[Row],
    started: str,
    machine_start: dict[str, Any],
    *,
    partial: bool,
) -> None:
    doc = {
        "started": started,
        "finished": None if partial else rfc3339(),
        "argv": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if not k.startswith("_") and k != "job_out"
        },
        "machine": machine_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "ok": all(r.ok for r in rows),
        "rows": [r.to_dict() for r in rows],
    }
    keys = getattr(args, "_plan_keys", None)
    if keys:  # --plan: each graph's content key (the graph cache's, npu-lora compile-plan's)
        doc["plan_keys"] = keys
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json_out.with_suffix(args.json_out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(args.json_out)
