"""Pure mapping: (MoEFinetune, its Job, the Job's pods) → the operator's subtree of ``status``.

The operator owns ``phase``, ``conditions``, ``jobName``, ``podName``, ``nodeName``,
``attempts``, ``startTime``, ``completionTime``, ``observedGeneration`` and ``message``
(:data:`OPERATOR_KEYS`); the worker owns the rest (progress, lastStep, ...). The operator writes
only its keys, with a JSON merge patch on the status subresource, so the two never fight.

Phases and the condition that explains them (all five condition types are always present, each
``True`` or ``False``; ``kubectl wait --for=condition=Succeeded mft/NAME`` works):

=========  ==================  ===============================================================
phase      condition           reason
=========  ==================  ===============================================================
Pending    Queued=True         JobCreated, PodPending, WaitingForQueue (Kueue), Unschedulable,
                               ImagePullBackOff, Compiled (precompile done, the Job comes next)
Compiling  Queued=True         Compiling (``spec.device.precompile``: the precompile Job runs;
                               ``status.compile`` {done, total, etaSeconds, jobName})
Running    Running=True        PodRunning, Retrying (a pod failed, the Job retries)
Succeeded  Succeeded=True      Completed
Failed     Failed=True         WorkerError (exit code, pod, the worker's termination message),
                               BackoffLimitExceeded, DeadlineExceeded, JobFailed, InvalidSpec
                               (the server rejected the Job the operator built),
                               RendezvousTimeout (a data-parallel rank never joined),
                               CompileFailed (a device graph did not compile: the graph and the
                               compiler's message; no training Job was created)
Suspended  Suspended=True      Suspended (``spec.suspend``)
=========  ==================  ===============================================================
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from npu_lora.api.timefmt import rfc3339
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR, EXIT_NONFINITE_LOSS, EXIT_RENDEZVOUS_TIMEOUT

from npu_lora_operator.messages import MAX_MESSAGE, bounded
from npu_lora_operator.precompile import compile_status

Body = dict[str, Any]

OPERATOR_KEYS = (
    "phase",
    "conditions",
    "jobName",
    "podName",
    "nodeName",
    "attempts",
    "startTime",
    "completionTime",
    "observedGeneration",
    "message",
    "compile",
)
CONDITION_TYPES = ("Queued", "Running", "Succeeded", "Failed", "Suspended")
TERMINAL_PHASES = ("Succeeded", "Failed")
IMAGE_PULL_REASONS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
EXIT_MEANING = {
    EXIT_CONFIG_ERROR: "invalid configuration or input",
    EXIT_NONFINITE_LOSS: "the loss became non-finite",
    EXIT_RENDEZVOUS_TIMEOUT: "not every rank joined the process group in time",
}
#: the worker's own text inside a message (the rest names pod and exit code)
_MAX_MESSAGE = MAX_MESSAGE - 200


def now_iso() -> str:
    return rfc3339()


def _ts(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _cond(obj: Body | None, ctype: str) -> Body | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c
    return None


def _container_status(pod: Body, name: str = "worker") -> Body:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == name:
            return cs
    return statuses[0] if statuses else {}


def latest_pod(pods: list[Body]) -> Body | None:
    if not pods:
        return None
    return max(
        pods,
        key=lambda p: (
            _ts((p.get("metadata") or {}).get("creationTimestamp")),
            (p.get("metadata") or {}).get("name", ""),
        ),
    )


def _terminated(pod: Body | None) -> Body | None:
    if pod is None:
        return None
    cs = _container_status(pod)
    term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
        "terminated"
    )
    return term or None


def _last_failed_pod(pods: list[Body]) -> Body | None:
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    return latest_pod(failed)


def _short(text: str) -> str:
    return bounded((text or "").strip(), _MAX_MESSAGE, keep="tail")


def worker_failure(pod: Body | None) -> tuple[int | None, str]:
    """(exit code, text) of a failed worker pod: the termination message names the cause."""
    term = _terminated(pod)
    if not term:
        reason = ((pod or {}).get("status") or {}).get("reason") or ""
        msg = ((pod or {}).get("status") or {}).get("message") or ""
        return None, _short(f"{reason}: {msg}".strip(": "))
    code = term.get("exitCode")
    detail = term.get("message") or term.get("reason") or ""
    return code, _short(detail)


def describe_exit(code: int | None, pod_name: str, detail: str) -> str:
    meaning = EXIT_MEANING.get(code or -1)
    head = f"worker exited with code {code}" if code is not None else "worker failed"
    if meaning:
        head += f" ({meaning})"
    head += f" in pod {pod_name}"
    return f"{head}: {detail}" if detail else head


@dataclass
class Observed:
    phase: str
    reason: str
    message: str
    condition: str  # the condition type that is True


def observe(body: Body, job: Body | None, pods: list[Body]) -> Observed:
    """Classify the run's state (no timestamps, no side effects); the message bounded
    (:func:`.messages.bounded`)."""
    obs = _observe(body, job, pods)
    return Observed(obs.phase, obs.reason, bounded(obs.message), obs.condition)


def _observe(body: Body, job: Body | None, pods: list[Body]) -> Observed:
    spec = body.get("spec") or {}
    name = (body.get("metadata") or {}).get("name", "")
    if job is None:
        return Observed("Pending", "JobPending", f"creating the Job for run {name}", "Queued")
    jname = (job.get("metadata") or {}).get("name", "")
    jstatus = job.get("status") or {}
    pod = latest_pod(pods)

    complete = _cond(job, "Complete") or _cond(job, "SuccessCriteriaMet")
    if complete:
        return Observed("Succeeded", "Completed", f"Job {jname} completed", "Succeeded")

    failed = _cond(job, "Failed") or _cond(job, "FailureTarget")
    if failed:
        jreason = failed.get("reason") or "JobFailed"
        fpod = _last_failed_pod(pods) or pod
        pod_name = ((fpod or {}).get("metadata") or {}).get("name", "?")
        code, detail = worker_failure(fpod)
        if jreason == "DeadlineExceeded":
            msg = f"Job {jname} ran longer than activeDeadlineSeconds"
            if failed.get("message"):
                msg += f": {failed['message']}"
            return Observed("Failed", "DeadlineExceeded", msg, "Failed")
        if jreason == "BackoffLimitExceeded":
            attempts = attempts_of(job, pods)
            msg = (
                f"gave up after {attempts} attempt(s) (backoffLimit {spec.get('backoffLimit', 2)})"
            )
            if fpod is not None:
                msg += "; last: " + describe_exit(code, pod_name, detail)
            return Observed("Failed", "BackoffLimitExceeded", msg, "Failed")
        if fpod is not None and code == EXIT_RENDEZVOUS_TIMEOUT:
            msg = describe_exit(code, pod_name, detail)
            return Observed("Failed", "RendezvousTimeout", msg, "Failed")
        if fpod is not None and (code is not None or jreason == "PodFailurePolicy"):
            return Observed(
                "Failed", "WorkerError", describe_exit(code, pod_name, detail), "Failed"
            )
        msg = failed.get("message") or f"Job {jname} failed ({jreason})"
        return Observed("Failed", jreason if jreason.isalnum() else "JobFailed", msg, "Failed")

    job_suspended = bool((job.get("spec") or {}).get("suspend")) or bool(_cond(job, "Suspended"))
    if job_suspended:
        if spec.get("suspend"):
            return Observed("Suspended", "Suspended", "suspended by spec.suspend", "Suspended")
        if spec.get("queueName"):
            return Observed(
                "Pending",
                "WaitingForQueue",
                f"waiting for admission by Kueue queue {spec['queueName']}",
                "Queued",
            )
        return Observed("Suspended", "Suspended", f"Job {jname} is suspended", "Suspended")

    if pod is None:
        if jstatus.get("active"):
            return Observed("Running", "PodRunning", f"Job {jname} is running", "Running")
        return Observed(
            "Pending", "JobCreated", f"Job {jname} created, waiting for its pod", "Queued"
        )

    pmeta = pod.get("metadata") or {}
    pstatus = pod.get("status") or {}
    pname = pmeta.get("name", "")
    phase = pstatus.get("phase") or "Pending"
    if phase == "Running" or (phase == "Succeeded" and not complete):
        return Observed("Running", "PodRunning", f"pod {pname} is running", "Running")
    if phase == "Failed":
        code, detail = worker_failure(pod)
        return Observed(
            "Running",
            "Retrying",
            f"attempt failed, the Job retries: {describe_exit(code, pname, detail)}",
            "Running",
        )
    # Pending: why?
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        msg = f"pod {pname}: {waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(": ")
        return Observed("Pending", "ImagePullBackOff", msg, "Queued")
    for c in pstatus.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            reason = c.get("reason") or "Unschedulable"
            msg = f"pod {pname} cannot be scheduled: {c.get('message') or reason}"
            return Observed("Pending", "Unschedulable", msg, "Queued")
    if waiting.get("reason"):
        msg = f"pod {pname}: {waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
        return Observed("Pending", waiting["reason"], msg, "Queued")
    return Observed("Pending", "PodPending", f"pod {pname} is starting", "Queued")


def observe_compile(body: Body, cjob: Body, pods: list[Body]) -> Observed:
    """The run while its precompile Job (``cjob``) runs and no training Job exists yet."""
    jname = (cjob.get("metadata") or {}).get("name", "")
    failed = _cond(cjob, "Failed") or _cond(cjob, "FailureTarget")
    if failed:
        fpod = _last_failed_pod(pods)
        if fpod is not None:
            pod_name = (fpod.get("metadata") or {}).get("name", "?")
            code, detail = worker_failure(fpod)
            term = _terminated(fpod) or {}
            if term.get("message"):  # "compile of graph I NAME failed: ...": the graph first
                detail = bounded(term["message"].strip(), _MAX_MESSAGE)
            msg = f"precompile pod {pod_name} failed (exit code {code})"
            msg += f": {detail}" if detail else ""
        else:
            msg = failed.get("message") or f"precompile Job {jname} failed"
        return Observed("Failed", "CompileFailed", bounded(msg), "Failed")
    if _cond(cjob, "Complete") or _cond(cjob, "SuccessCriteriaMet"):
        msg = f"device graphs compiled by Job {jname}; creating the training Job"
        return Observed("Pending", "Compiled", msg, "Queued")
    st = cjob.get("status") or {}
    total = int((cjob.get("spec") or {}).get("completions") or 0)
    done = int(st.get("succeeded") or 0)
    msg = f"compiling device graphs: {done}/{total} done (Job {jname})"
    return Observed("Compiling", "Compiling", msg, "Queued")


def _elapsed(start: Any, now: str) -> float | None:
    try:
        t0 = dt.datetime.strptime(_ts(start), "%Y-%m-%dT%H:%M:%SZ")
        t1 = dt.datetime.strptime(now, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return max((t1 - t0).total_seconds(), 0.0)


def compile_progress(cjob: Body, now: str) -> Body:
    """``status.compile`` {done, total, etaSeconds, jobName} of the precompile Job ``cjob``
    (``etaSeconds`` left out before the first graph is done, as the API would drop a null)."""
    cstatus = cjob.get("status") or {}
    total = int((cjob.get("spec") or {}).get("completions") or 0)
    jname = (cjob.get("metadata") or {}).get("name", "")
    progress = compile_status(cstatus, total, _elapsed(cstatus.get("startTime"), now), jname)
    return {k: v for k, v in progress.items() if v is not None}


def compute_compile_status(
    body: Body, cjob: Body, pods: list[Body], *, now: str | None = None
) -> Body:
    """The operator's status subtree while the precompile Job ``cjob`` stands for the run (no
    training Job yet): phase ``Compiling`` with ``compile`` {done, total, etaSeconds, jobName}
    (ETA from the elapsed time per completed graph), ``Failed``/``CompileFailed`` with the
    failed pod's termination message, or ``Pending``/``Compiled`` once it completed."""
    now = now or now_iso()
    meta = body.get("metadata") or {}
    old = body.get("status") or {}
    obs = observe_compile(body, cjob, pods)
    generation = meta.get("generation")
    out: Body = {
        "phase": obs.phase,
        "conditions": set_conditions(old.get("conditions"), obs, now, generation),
        "message": obs.message,
        "compile": compile_progress(cjob, now),
    }
    if generation is not None:
        out["observedGeneration"] = generation
    if obs.phase == "Failed":
        out["completionTime"] = old.get("completionTime") or now
    return out


def attempts_of(job: Body | None, pods: list[Body]) -> int:
    st = (job or {}).get("status") or {}
    counted = (
        int(st.get("active") or 0) + int(st.get("succeeded") or 0) + int(st.get("failed") or 0)
    )
    return max(counted, len(pods))


def set_conditions(
    old: list[Body] | None, obs: Observed, now: str, generation: int | None
) -> list[Body]:
    """All five typed conditions; ``lastTransitionTime`` moves only when a status flips."""
    by_type = {c.get("type"): c for c in old or [] if isinstance(c, dict)}
    out: list[Body] = []
    for ctype in CONDITION_TYPES:
        true = ctype == obs.condition
        status = "True" if true else "False"
        if true:
            reason, message = obs.reason, obs.message
        else:
            reason, message = _false_reason(ctype, obs)
        prev = by_type.get(ctype) or {}
        ltt = prev.get("lastTransitionTime") if prev.get("status") == status else None
        cond: Body = {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": ltt or now,
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    return out


def _false_reason(ctype: str, obs: Observed) -> tuple[str, str]:
    if ctype == "Queued":
        return ("Started" if obs.phase != "Suspended" else "Suspended"), ""
    if ctype == "Running":
        return {
            "Succeeded": ("Completed", ""),
            "Failed": ("Failed", ""),
            "Suspended": ("Suspended", ""),
        }.get(obs.phase, ("NotStarted", ""))
    return "NotYet" if obs.phase not in TERMINAL_PHASES else obs.phase, ""


def compute_status(
    body: Body, job: Body | None, pods: list[Body], *, now: str | None = None
) -> Body:
    """The operator's status subtree (all of :data:`OPERATOR_KEYS` that have a value)."""
    now = now or now_iso()
    meta = body.get("metadata") or {}
    old = body.get("status") or {}
    obs = observe(body, job, pods)
    generation = meta.get("generation")
    out: Body = {
        "phase": obs.phase,
        "conditions": set_conditions(old.get("conditions"), obs, now, generation),
        "message": obs.message,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    if job is not None:
        jmeta = job.get("metadata") or {}
        jstatus = job.get("status") or {}
        out["jobName"] = jmeta.get("name")
        if jstatus.get("startTime"):
            out["startTime"] = jstatus["startTime"]
        out["attempts"] = attempts_of(job, pods)
        if obs.phase == "Succeeded":
            out["completionTime"] = (
                jstatus.get("completionTime") or old.get("completionTime") or now
            )
        elif obs.phase == "Failed":
            failed = _cond(job, "Failed") or _cond(job, "FailureTarget") or {}
            out["completionTime"] = (
                old.get("completionTime") or failed.get("lastTransitionTime") or now
            )
    pod = latest_pod(pods)
    if pod is not None:
        out["podName"] = (pod.get("metadata") or {}).get("name")
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            out["nodeName"] = node
    # keep what we knew (e.g. the pod is gone after completion or TTL)
    for key in ("jobName", "podName", "nodeName", "startTime", "attempts"):
        if key not in out and old.get(key) is not None:
            out[key] = old[key]
    return {k: v for k, v in out.items() if v is not None}


def status_changed(old: Body | None, new: Body) -> bool:
    """Whether writing ``new`` would change the operator subtree of ``old``."""
    old = old or {}
    return any(old.get(k) != new.get(k) for k in new)


def transition_events(old: Body | None, new: Body) -> list[tuple[str, str, str]]:
    """Events worth posting for a status change: (type Normal/Warning, reason, message)."""
    old = old or {}
    events: list[tuple[str, str, str]] = []
    old_phase, new_phase = old.get("phase"), new.get("phase")
    new_true = next((c for c in new.get("conditions", []) if c["status"] == "True"), None)
    old_true = next((c for c in old.get("conditions") or [] if c.get("status") == "True"), None)
    reason = (new_true or {}).get("reason", new_phase or "")
    if old_phase != new_phase or (old_true or {}).get("reason") != reason:
        warn = new_phase == "Failed" or reason in (
            "ImagePullBackOff",
            "Unschedulable",
            "Retrying",
        )
        events.append(("Warning" if warn else "Normal", reason, new.get("message", "")))
    return events
