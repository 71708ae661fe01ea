"""Prometheus metrics of the operator (``prometheus_client``; ``npu-lora operator --metrics-port``).

Operator metrics (names and units follow the Prometheus conventions):

==========================================  =========  ===========================================
metric                                      type       labels / meaning
==========================================  =========  ===========================================
``npu_lora_runs``                           gauge      ``kind``, ``phase``: runs the operator sees
                                                       by phase (every phase listed, 0 included)
``npu_lora_reconcile_duration_seconds``     histogram  ``handler``: wall seconds of a handler call
``npu_lora_reconcile_errors_total``         counter    ``handler``, ``error`` (exception class)
``npu_lora_jobs_created_total``             counter    ``kind``: Jobs the operator created
``npu_lora_jobs_adopted_total``             counter    ``kind``: existing Jobs adopted (restart)
==========================================  =========  ===========================================

The worker's latest step, exported from each run's ``status.lastStep`` (labels ``namespace``,
``name``; a run's series disappear with the run). One gauge per numeric column of the step record
(:mod:`npu_lora.api.record`) in ``status.lastStep``: a column measured in seconds ``x_s`` is
``npu_lora_run_x_seconds`` (``npu_lora_run_step_seconds``, ``npu_lora_run_attn_head_seconds``,
``npu_lora_run_host_fwd_seconds``, ``npu_lora_run_host_bwd_seconds``,
``npu_lora_run_recompute_seconds``), the others keep their name (``npu_lora_run_step``: the last
reported step, ``npu_lora_run_loss``, ``npu_lora_run_device_calls_per_layer``,
``npu_lora_run_tokens``). Also ``npu_lora_run_step_seconds_median`` (status.stepSecondsMedian),
``npu_lora_run_progress_ratio`` (0–1), ``npu_lora_run_eta_seconds`` and
``npu_lora_run_hot_experts``.

Imports no torch (only ``prometheus_client`` and the step record's standard-library module).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from npu_lora.api import record as step_record
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "PHASES",
    "RUNS",
    "RunCache",
    "instrumented",
    "job_adopted",
    "job_created",
    "last_step_metric",
    "serve",
]

PREFIX = "npu_lora"
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Suspended")

RECONCILE_SECONDS = Histogram(
    f"{PREFIX}_reconcile_duration_seconds",
    "Wall seconds of one operator handler call.",
    ["handler"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RECONCILE_ERRORS = Counter(
    f"{PREFIX}_reconcile_errors",
    "Operator handler calls that raised (kopf retries temporary errors).",
    ["handler", "error"],
)
JOBS_CREATED = Counter(f"{PREFIX}_jobs_created", "Jobs created by the operator.", ["kind"])
JOBS_ADOPTED = Counter(
    f"{PREFIX}_jobs_adopted",
    "Existing Jobs adopted by the operator (e.g. after an operator restart).",
    ["kind"],
)

F = TypeVar("F", bound=Callable[..., Any])


def instrumented(handler: str) -> Callable[[F], F]:
    """Time a (sync) kopf handler and count its exceptions under ``handler``."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                RECONCILE_ERRORS.labels(handler, type(e).__name__).inc()
                raise
            finally:
                RECONCILE_SECONDS.labels(handler).observe(time.perf_counter() - t0)

        return inner  # type: ignore[return-value]

    return wrap


def job_created(kind: str) -> None:
    JOBS_CREATED.labels(kind).inc()


def job_adopted(kind: str) -> None:
    JOBS_ADOPTED.labels(kind).inc()


def last_step_metric(column: step_record.Column) -> str:
    """The gauge name of a ``status.lastStep`` column (``attn_head_s`` →
    ``npu_lora_run_attn_head_seconds``)."""
    name = column.name
    if column.unit == "s" and name.endswith("_s"):
        name = name[:-2] + "_seconds"
    return f"{PREFIX}_run_{name}"


_LAST_STEP = tuple(
    (c, last_step_metric(c)) for c in step_record.STATUS_FIELDS if c.kind in ("int", "float")
)
_DOC = {c.name: c.doc for c in step_record.RECORD}


class RunCache(Collector):
    """The latest status of every run the operator has seen (kept by a kopf event handler),
    exported at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str, str], dict[str, Any]] = {}

    def observe(self, kind: str, namespace: str, name: str, status: dict[str, Any] | None) -> None:
        with self._lock:
            self._runs[(kind, namespace, name)] = dict(status or {})

    def forget(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._runs.pop((kind, namespace, name), None)

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()

    def snapshot(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        with self._lock:
            return dict(self._runs)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = self.snapshot()
        by_phase = GaugeMetricFamily(
            f"{PREFIX}_runs",
            "Runs seen by the operator, by kind and phase.",
            labels=["kind", "phase"],
        )
        kinds = sorted({k for k, _, _ in runs} | {"MoEFinetune"})
        for kind in kinds:
            for phase in PHASES:
                n = sum(
                    1
                    for (k, _, _), s in runs.items()
                    if k == kind and (s.get("phase") or "Pending") == phase
                )
                by_phase.add_metric([kind, phase], n)
        yield by_phase

        labels = ["namespace", "name"]
        families = {
            metric: GaugeMetricFamily(
                metric, f"status.lastStep.{c.status_key}: {_DOC[c.name]}", labels=labels
            )
            for c, metric in _LAST_STEP
        }
        median = GaugeMetricFamily(
            f"{PREFIX}_run_step_seconds_median",
            "Median seconds per step after warm-up (status.stepSecondsMedian).",
            labels=labels,
        )
        ratio = GaugeMetricFamily(
            f"{PREFIX}_run_progress_ratio", "Completed steps / total steps (0-1).", labels=labels
        )
        eta = GaugeMetricFamily(
            f"{PREFIX}_run_eta_seconds", "Estimated seconds to the end of the run.", labels=labels
        )
        hot = GaugeMetricFamily(
            f"{PREFIX}_run_hot_experts", "Hot experts over all layers (status.hot).", labels=labels
        )
        for (_, ns, name), s in sorted(runs.items()):
            lv = [ns, name]
            last = s.get("lastStep") or {}
            for c, metric in _LAST_STEP:
                v = last.get(c.status_key)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    families[metric].add_metric(lv, float(v))
            if isinstance(s.get("stepSecondsMedian"), int | float):
                median.add_metric(lv, float(s["stepSecondsMedian"]))
            progress = s.get("progress") or {}
            if isinstance(progress.get("percent"), int | float):
                ratio.add_metric(lv, float(progress["percent"]) / 100.0)
            if isinstance(progress.get("etaSeconds"), int | float):
                eta.add_metric(lv, float(progress["etaSeconds"]))
            if isinstance((s.get("hot") or {}).get("experts"), int):
                hot.add_metric(lv, float(s["hot"]["experts"]))
        yield from families.values()
        yield from (median, ratio, eta, hot)


#: The process-wide cache (registered in the default registry once).
RUNS = RunCache()
REGISTRY.register(RUNS)


def serve(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> Any:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread; returns the server."""
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
