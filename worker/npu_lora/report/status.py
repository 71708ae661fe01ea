"""The worker's status reporter: merge-patches its own MoEFinetune's ``/status`` while training.

Added by ``npu-lora run`` when ``NPU_LORA_RESOURCE_NAME`` is set (the operator sets it, with
``NPU_LORA_RESOURCE_NAMESPACE``). The worker owns these keys of ``status`` and writes nothing
else: ``progress``, ``trainerStatus``, ``lastStep``, ``stepSecondsMedian``, ``hot``,
``placement``, ``host``, ``lastCheckpoint``, ``distributed``, ``eval``. (``trainerStatus``: the
same progress under Kubeflow Trainer's names, KEP-2779: ``progressPercentage``,
``estimatedRemainingSeconds``, ``metrics[]`` of {name, value as a string} from
:data:`npu_lora.api.record.TRAINER_METRICS`, ``lastUpdatedTime``; rewritten whole with every
report.) (``placement``: the trial medians and the choice of
``moe.placement: auto``; ``host``: the resolved host dtype and experts kernel, with ``warning``
for a choice known to be slow on the CPU; both are fields of the worker's, not conditions,
because ``conditions`` belong to the operator and a merge patch replaces the whole list.
``distributed``: world size, per-rank compute seconds, the slowest rank's skew; rank 0 reports.
``eval``: spec.eval's last evaluation (step, loss, perplexity, accuracy, examples, seconds) and
``best`` {step, loss}, reported at once after each evaluation.)

- API access: the in-cluster service account (the operator's per-run Role allows exactly
  ``get``/``patch`` on this run's ``moefinetunes/status``), or ``$KUBECONFIG`` outside a pod.
- Throttling by ``spec.reporting``: a step is reported when ``step % everySteps == 0`` and at
  least ``minIntervalSeconds`` passed since the last report; the last step always is. The hot-set
  selection is reported at once. Held-back state goes out with the next report or at the end.
- Non-blocking: patches are sent by a background thread; ``on_step`` only records the state.
  Each patch carries the whole worker subtree, so only the latest state matters: a failed patch
  (network error, 409, 5xx, ...) is logged and retried after a back-off unless a newer state
  replaced it. Reporting never raises into the training loop.
- Deletion: a 404, or a 403 or 401 after earlier patches succeeded (the per-run Role, or the
  ServiceAccount, whose deletion revokes its tokens, is deleted with the run, often before the
  pod), means the run is gone: reporting stops and, when the trainer's
  SIGTERM handler is installed, the reporter sends SIGTERM to its own process, so the step in
  flight is finished and checkpointed and the worker exits 143 (``ctx.extra["stop_reason"]``
  names the cause for the termination message). A 403 before any success (a misconfigured
  ``podTemplate.serviceAccountName``) is logged and retried like any failure.
- ``on_end``/``on_error`` flush: they wait (bounded, ``flush_timeout``) for the last state to be
  written.

Imports only the ``kubernetes`` package (lazily), the API model's constants
(:mod:`npu_lora.api.v1alpha1`) and the standard library: no torch.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from npu_lora.api import record as step_record
from npu_lora.api.timefmt import rfc3339
from npu_lora.api.v1alpha1 import ENV_NAME, ENV_NAMESPACE, GROUP, MERGE_PATCH, PLURAL, VERSION
from npu_lora.train.callbacks import TrainCallback  # torch-free

log = logging.getLogger(__name__)

WORKER_KEYS = (
    "progress",
    "trainerStatus",
    "lastStep",
    "stepSecondsMedian",
    "hot",
    "placement",
    "host",
    "lastCheckpoint",
    "distributed",
    "eval",
)


def now_iso() -> str:
    return rfc3339()


def _sig(x: Any, digits: int = 4) -> float | None:
    """Round to ``digits`` significant digits (readable ``kubectl get`` columns); None if not
    a finite number."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    if v == 0:
        return 0.0
    return float(f"{v:.{digits}g}")


def _status_value(col: step_record.Column, v: Any) -> Any:
    """A record value as its status field: ints as ints, numbers rounded to ``col.digits``
    significant digits, lists elementwise; ``None`` when not a (finite) value."""
    if v is None:
        return None
    if col.kind == "int":
        try:
            return int(v)
        except (TypeError, ValueError):
            return None
    if col.kind == "floats":
        return [_sig(x, col.digits) for x in v] if isinstance(v, list) and v else None
    return _sig(v, col.digits)


def status_values(
    record: dict[str, Any], columns: tuple[step_record.Column, ...]
) -> dict[str, Any]:
    """``columns`` of a metrics record as status fields (camelCase keys, record order)."""
    out: dict[str, Any] = {}
    for col in columns:
        v = _status_value(col, record.get(col.name))
        if v is not None:
            out[col.status_key] = v
    return out


def last_step_status(record: dict[str, Any]) -> dict[str, Any]:
    """The ``status.lastStep`` object of a metrics record (camelCase, rounded, finite only)."""
    return status_values(record, step_record.STATUS_FIELDS)


def distributed_status(record: dict[str, Any], info: Any) -> dict[str, Any]:
    """``status.distributed`` of a data-parallel step record: the pods and ranks (``info``: the
    rank's ``RankInfo``), the step, and the record's data-parallel columns
    (:data:`npu_lora.api.record.DISTRIBUTED_STATUS_FIELDS`)."""
    world = int(record["world_size"])
    per = int(getattr(info, "ranks_per_worker", 0) or 0) or world
    out: dict[str, Any] = {
        "workers": int(getattr(info, "workers", 0) or 0) or max(1, world // per),
        "ranksPerWorker": per,
        "step": int(record["step"]),
    }
    out.update(status_values(record, step_record.DISTRIBUTED_STATUS_FIELDS))
    return out


def _metric_text(v: Any, digits: int) -> str | None:
    """A metric's value as Kubeflow writes it: a string (``"0.2347"``); None when not finite."""
    x = _sig(v, digits)
    if x is None:
        return None
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def trainer_status(
    progress: dict[str, Any],
    record: dict[str, Any] | None,
    evaluation: dict[str, Any] | None,
    median_step_s: float | None,
) -> dict[str, Any]:
    """``status.trainerStatus`` (Kubeflow Trainer KEP-2779) from the worker's ``progress``
    object, the last step record, the last evaluation record and the median s/step:
    ``progressPercentage`` (0-100, floored, from ``progress.percent``),
    ``estimatedRemainingSeconds`` (``progress.etaSeconds`` as an integer), ``metrics``
    (:data:`npu_lora.api.record.TRAINER_METRICS` that have a value) and ``lastUpdatedTime``."""
    out: dict[str, Any] = {}
    total = int(progress.get("totalSteps") or 0)
    step = int(progress.get("step") or 0)
    if total:
        out["progressPercentage"] = max(0, min(100, (100 * step) // total))
    eta = progress.get("etaSeconds")
    if isinstance(eta, int | float) and math.isfinite(eta):
        out["estimatedRemainingSeconds"] = max(0, round(eta))
    metrics = []
    for m in step_record.TRAINER_METRICS:
        if m.source == "step":
            v = (record or {}).get(m.key)
        elif m.source == "eval":
            v = (evaluation or {}).get(m.key)
        elif m.source == "median":
            v = median_step_s
        else:  # rate: per second of the last step
            num, secs = (record or {}).get(m.key), (record or {}).get("step_s")
            ok = isinstance(num, int | float) and isinstance(secs, int | float) and secs > 0
            v = num / secs if ok else None
        text = _metric_text(v, m.digits)
        if text is not None:
            metrics.append({"name": m.name, "value": text})
    if metrics:
        out["metrics"] = metrics
    out["lastUpdatedTime"] = progress.get("lastUpdateTime") or now_iso()
    return out


def default_api_patch(name: str, namespace: str) -> Callable[[dict[str, Any]], Any]:
    """A function that merge-patches ``/status`` of the run (in-cluster config or kubeconfig)."""
    from kubernetes import client, config

    kubeconfig = os.environ.get("KUBECONFIG")
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        api_client = client.ApiClient(cfg)
    else:
        api_client = config.new_client_from_config(config_file=kubeconfig)
    api = client.CustomObjectsApi(api_client)

    def patch(body: dict[str, Any]) -> Any:
        return api.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            body,
            _content_type=MERGE_PATCH,
            _request_timeout=(5, 15),
        )

    return patch


class StatusReporter(TrainCallback):
    """Report training progress to ``status`` of MoEFinetune ``namespace/name``."""

    def __init__(
        self,
        name: str,
        namespace: str = "default",
        *,
        total_steps: int = 0,
        every_steps: int = 1,
        min_interval_seconds: float = 5.0,
        warmup_steps: int = 0,
        patch: Callable[[dict[str, Any]], Any] | None = None,
        retry_seconds: float = 2.0,
        max_retry_seconds: float = 30.0,
        flush_timeout: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.total_steps = int(total_steps)
        self.every_steps = max(1, int(every_steps))
        self.min_interval = max(0.0, float(min_interval_seconds))
        self.warmup_steps = max(0, int(warmup_steps))
        self.retry_seconds = retry_seconds
        self.max_retry_seconds = max_retry_seconds
        self.flush_timeout = flush_timeout
        self.clock = clock
        self._patch_fn = patch
        self._state: dict[str, Any] = {}
        self._record: dict[str, Any] | None = None  # the last step record (trainerStatus)
        self._eval: dict[str, Any] | None = None  # the last evaluation record (trainerStatus)
        self._step_times: list[tuple[int, float]] = []
        self._last_sent_at: float | None = None
        self._dirty = False
        # sender thread
        self._cv = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._version = 0  # bumps with each submitted state
        self._written = 0  # last version written successfully
        self._stop = False
        self._thread: threading.Thread | None = None
        self._gone = False  # the resource was deleted (404): stop reporting
        self._retry_wait = False  # the sender is backing off after a failure
        self._last_error = ""
        self.sent: int = 0
        self.failures: int = 0

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_env(cls, ctx: Any = None, **kwargs: Any) -> StatusReporter:
        """From ``NPU_LORA_RESOURCE_NAME``/``_NAMESPACE`` and the run's ``spec.reporting``."""
        name = os.environ.get(ENV_NAME) or getattr(ctx, "name", None)
        if not name:
            raise ValueError(f"{ENV_NAME} is not set")
        namespace = os.environ.get(ENV_NAMESPACE) or getattr(ctx, "namespace", None) or "default"
        opts: dict[str, Any] = {}
        spec = getattr(ctx, "spec", None)
        if spec is not None:
            opts["total_steps"] = getattr(ctx, "total_steps", spec.training.steps)
            opts["every_steps"] = spec.reporting.every_steps
            opts["min_interval_seconds"] = spec.reporting.min_interval_seconds
            if spec.moe.placement != "host-only":
                opts["warmup_steps"] = spec.moe.warmup_steps
        opts.update(kwargs)
        return cls(name, namespace, **opts)

    # -- the sender --------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"status-reporter-{self.name}", daemon=True
            )
            self._thread.start()

    def _submit(self) -> None:
        self._last_sent_at = self.clock()
        self._dirty = False
        if self._gone:
            return
        progress = self._state.get("progress")
        if isinstance(progress, dict):
            self._state["trainerStatus"] = trainer_status(
                progress, self._record, self._eval, self._median()
            )
        body = {"status": {k: v for k, v in self._state.items() if v is not None}}
        with self._cv:
            self._version += 1
            self._pending = body
            self._cv.notify_all()
        self._ensure_thread()

    def _do_patch(self, body: dict[str, Any]) -> None:
        if self._patch_fn is None:
            self._patch_fn = default_api_patch(self.name, self.namespace)
        self._patch_fn(body)

    def _log_failure(self, e: BaseException) -> None:
        text = _brief(e)
        # the first failure of a kind is a warning; repeats only every 20th time
        if text != self._last_error or self.failures % 20 == 0:
            log.warning(
                "status report for %s/%s failed (%d so far; retrying with back-off): %s",
                self.namespace,
                self.name,
                self.failures,
                text,
            )
        else:
            log.debug("status report for %s/%s failed again: %s", self.namespace, self.name, text)
        self._last_error = text

    def _run(self) -> None:
        delay = self.retry_seconds
        while True:
            with self._cv:
                while self._pending is None and not self._stop:
                    self._cv.wait()
                if self._pending is None:  # stopped, nothing left
                    return
                body, version = self._pending, self._version
                self._pending = None
            try:
                self._do_patch(body)  # type: ignore[arg-type]
            except Exception as e:  # network, 409, 5xx, auth: never fatal
                self.failures += 1
                code = getattr(e, "status", None)
                if code == 404 or (code in (401, 403) and self.sent > 0):
                    # the MoEFinetune is gone (404), or its Role (403) or ServiceAccount (401)
                    # went first during the deletion cascade (after earlier patches succeeded):
                    # stop reporting, and stop the
                    # run cleanly (the step in flight is finished and checkpointed)
                    self._run_deleted(int(code))
                    return
                self._log_failure(e)
                with self._cv:
                    if self._pending is None:  # no newer state: retry this one (latest wins)
                        self._pending = body
                    if self._stop:
                        return
                    # a newer state, a flush or a stop wakes us early
                    self._retry_wait = True
                    self._cv.wait(delay)
                    self._retry_wait = False
                delay = min(delay * 2, self.max_retry_seconds)
                continue
            delay = self.retry_seconds
            with self._cv:
                self.sent += 1
                self._written = max(self._written, version)
                self._cv.notify_all()

    def _run_deleted(self, code: int) -> None:
        reason = (
            f"the MoEFinetune {self.namespace}/{self.name} was deleted (its status patch "
            f"answered {code})"
        )
        log.warning("%s: reporting stopped; stopping the run", reason)
        with self._cv:
            self._gone = True
            self._pending = None
            self._cv.notify_all()
        ctx = getattr(self, "_ctx", None)
        if ctx is not None and isinstance(getattr(ctx, "extra", None), dict):
            ctx.extra["stop_reason"] = reason
        # the trainer's SIGTERM handler finishes the step, checkpoints and exits 143; without
        # one installed (not the worker's main loop) nothing is stopped
        if callable(signal.getsignal(signal.SIGTERM)):
            os.kill(os.getpid(), signal.SIGTERM)

    def flush(self, timeout: float | None = None) -> bool:
        """Send the latest state and wait until it is written (True) or ``timeout`` passes."""
        if self._gone:
            return False
        if self._dirty or self._version == 0:
            self._submit()
        timeout = self.flush_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cv:
            target = self._version
            if self._retry_wait:
                self._cv.notify_all()  # retry once now instead of after the back-off
            while self._written < target and not self._gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning(
                        "status report for %s/%s: gave up flushing after %.0fs",
                        self.namespace,
                        self.name,
                        timeout,
                    )
                    return False
                self._cv.wait(left)
        return not self._gone

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then stop the sender thread (a retry still pending is dropped)."""
        ok = self.flush(timeout)
        with self._cv:
            self._stop = True
            self._pending = None
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(2)
        return ok

    # -- state -------------------------------------------------------------------------------

    def _median(self) -> float | None:
        times = [s for step, s in self._step_times if step > self.warmup_steps]
        if not times:
            # no step after the warm-up yet: all but the first (compile/first-touch) step
            times = [s for _, s in self._step_times[1:]] or [s for _, s in self._step_times]
        if not times:
            return None
        return statistics.median(times)

    def _progress(self, step: int) -> dict[str, Any]:
        total = self.total_steps or step
        out: dict[str, Any] = {
            "step": int(step),
            "totalSteps": int(total),
            "percent": round(100.0 * step / total, 1) if total else 0.0,
            "lastUpdateTime": now_iso(),
        }
        median = self._median()
        if median is not None and total:
            out["etaSeconds"] = _sig(max(0, total - step) * median, 3)
        return out

    # -- TrainCallback -----------------------------------------------------------------------

    def on_start(self, ctx: Any) -> None:
        self._ctx = ctx
        if getattr(ctx, "total_steps", None):
            self.total_steps = int(ctx.total_steps)
        start = int(getattr(ctx, "start_step", 1) or 1)
        self._state["progress"] = self._progress(start - 1)
        checkpoint_step = getattr(ctx, "checkpoint_step", None)
        if checkpoint_step:
            self._state["lastCheckpoint"] = {
                "step": int(checkpoint_step),
                "path": str(getattr(ctx, "run_dir", "")) + "/checkpoint",
                "time": now_iso(),
            }
        if getattr(ctx, "hot", None):
            self._set_hot(ctx.hot)
        placement = (getattr(ctx, "extra", None) or {}).get("placement")
        if placement:
            self._set_placement(placement)
        host = (getattr(ctx, "extra", None) or {}).get("host")
        if host:
            self._state["host"] = host
        ev = (getattr(ctx, "extra", None) or {}).get("eval")
        if ev:  # resumed: the evaluation of the checkpoint's state
            self._set_eval(ev, ev.get("best"))
        self._submit()

    def on_step(self, record: dict[str, Any], ctx: Any) -> None:
        step = int(record.get("step", 0))
        step_s = record.get("step_s")
        if isinstance(step_s, int | float) and math.isfinite(step_s):
            self._step_times.append((step, float(step_s)))
        self._state["lastStep"] = last_step_status(record)
        self._record = record
        self._state["progress"] = self._progress(step)
        if any(k in record for k in step_record.DATA_PARALLEL):  # rank 0 reports for all
            info = getattr(ctx, "extra", {}).get("rank_info")
            self._state["distributed"] = distributed_status(record, info)
        median = self._median()
        if median is not None:
            self._state["stepSecondsMedian"] = _sig(median)
        self._dirty = True
        last = self.total_steps and step >= self.total_steps
        due = step % self.every_steps == 0 and (
            self._last_sent_at is None or self.clock() - self._last_sent_at >= self.min_interval
        )
        if last or due:
            self._submit()

    def _set_hot(self, info: dict[str, Any]) -> None:
        hot: dict[str, Any] = {}
        if info.get("fraction") is not None:
            hot["fraction"] = float(info["fraction"])
        if info.get("experts") is not None:
            hot["experts"] = int(info["experts"])
        if info.get("selected_at_step") is not None:
            hot["selectedAtStep"] = int(info["selected_at_step"])
        if len(hot) == 3:
            self._state["hot"] = hot

    def on_hot_selected(self, info: dict[str, Any], ctx: Any) -> None:
        self._set_hot(info)
        self._submit()

    def on_placement(self, info: dict[str, Any], ctx: Any) -> None:
        self._set_placement(info)
        self._submit()

    def _set_placement(self, info: dict[str, Any]) -> None:
        out: dict[str, Any] = {"policy": str(info.get("policy", "auto"))}
        if info.get("chosen"):
            out["chosen"] = str(info["chosen"])
        if info.get("decided_at_step") is not None:
            out["decidedAtStep"] = int(info["decided_at_step"])
        for src, dst in (("host_only_median_s", "hostOnlyMedianS"), ("hot_median_s", "hotMedianS")):
            v = _sig(info.get(src))
            if v is not None:
                out[dst] = v
        self._state["placement"] = out
        hot = self._state.get("hot")
        if out.get("chosen") == "host-only" and isinstance(hot, dict):
            hot["experts"] = 0  # auto kept host-only: no expert runs on the device (HOT 0)

    def on_eval(self, record: dict[str, Any], ctx: Any) -> None:
        """``status.eval`` (spec.eval): the last evaluation and the best eval loss so far."""
        self._set_eval(record, getattr(ctx, "extra", {}).get("eval", {}).get("best"))
        self._submit()

    def _set_eval(self, record: dict[str, Any], best: dict[str, Any] | None) -> None:
        out: dict[str, Any] = {"step": int(record["step"])}
        self._eval = record
        for key, dst in (
            ("loss", "loss"),
            ("perplexity", "perplexity"),
            ("accuracy", "accuracy"),
            ("accuracy_total", "accuracyTotal"),
            ("seconds", "seconds"),
        ):
            v = _sig(record.get(key), 5)
            if v is not None and (key != "accuracy_total" or record.get("calibrated")):
                out[dst] = v
        if record.get("examples") is not None:
            out["examples"] = int(record["examples"])
        if record.get("overlap"):
            out["overlap"] = int(record["overlap"])
        if isinstance(best, dict) and _sig(best.get("loss"), 5) is not None:
            out["best"] = {"step": int(best["step"]), "loss": _sig(best["loss"], 5)}
        self._state["eval"] = out
        self._dirty = True

    def on_checkpoint(self, step: int, path: str, ctx: Any) -> None:
        self._state["lastCheckpoint"] = {"step": int(step), "path": str(path), "time": now_iso()}
        self._dirty = True

    def on_end(self, summary: dict[str, Any], ctx: Any) -> None:
        median = summary.get("median") if isinstance(summary, dict) else None
        if isinstance(median, dict) and _sig(median.get("step_s")) is not None:
            self._state["stepSecondsMedian"] = _sig(median.get("step_s"))
        self._dirty = True
        self.close()

    def on_error(self, message: str, exit_code: int, ctx: Any) -> None:
        # the operator reports the failure (phase, reason, message); make sure the last
        # progress is there
        self._dirty = True
        self.close(min(self.flush_timeout, 10.0))


def _brief(e: BaseException) -> str:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None)
    if status:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(e).__name__}: {e}"
