"""The sandbox kubelet's Job controller (see :class:`JobController`)."""

from __future__ import annotations

import copy
import secrets
import string
import time
from dataclasses import dataclass, field
from typing import Any

from .resources import now_iso

#: An Indexed Job's pod index (annotation and label, as Kubernetes sets them); the pod's
#: ``JOB_COMPLETION_INDEX`` comes from the annotation through the downward API.
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "JOB_COMPLETION_INDEX"


def _indexed(job: dict[str, Any]) -> bool:
    return (job.get("spec") or {}).get("completionMode") == "Indexed"


def _pod_index(pod: dict[str, Any]) -> int | None:
    v = ((pod.get("metadata") or {}).get("annotations") or {}).get(INDEX_KEY)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _ranges(indexes: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (``status.completedIndexes``)."""
    out: list[str] = []
    xs = sorted(set(indexes))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def _parse_ranges(text: str) -> list[int]:
    out: list[int] = []
    for part in (text or "").split(","):
        if part:
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    return out


@dataclass
class _JobState:
    failed_at: list[float] = field(default_factory=list)
    next_create: float = 0.0
    started: float = 0.0  # monotonic time of startTime (second-precision timestamps are too coarse)


def _age_seconds(ts: str) -> float:
    import datetime as dt

    try:
        t = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (dt.datetime.now(dt.UTC) - t).total_seconds()


class JobController:
    """The Job controller: a Job's pods, its status and conditions, backoff, podFailurePolicy,
    suspension, deadlines and TTL. ``completionMode: Indexed``: one pod per index not yet
    succeeded (``completions`` of them, all at once), each with the index annotation and label,
    ``JOB_COMPLETION_INDEX`` in its containers' environment, hostname ``<job>-<index>`` (and the
    template's ``subdomain``), ``status.completedIndexes``.

    A mixin of :class:`~npu_lora_sandbox.kubelet.LocalKubelet` (its state lives there).
    """

    @staticmethod
    def _owned_by(pod: dict[str, Any], job: dict[str, Any]) -> bool:
        uid = job["metadata"]["uid"]
        return any(
            r.get("uid") == uid and r.get("controller")
            for r in pod["metadata"].get("ownerReferences") or []
        )

    def _pod_vanished(self, pod: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self._controller_deleted or uid in self._accounted:
            return
        for job in jobs:
            if self._owned_by(pod, job) and not self._finished(job):
                self._accounted.add(uid)
                status = copy.deepcopy(job.get("status") or {})
                status["failed"] = int(status.get("failed") or 0) + 1
                self._patch_job_status(job, status)
                st = self._jobs.setdefault(job["metadata"]["uid"], _JobState())
                st.next_create = time.monotonic() + self._backoff(status["failed"])

    @staticmethod
    def _finished(job: dict[str, Any]) -> bool:
        return any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in (job.get("status") or {}).get("conditions") or []
        )

    def _backoff(self, failures: int) -> float:
        return min(self.backoff_seconds * (2 ** max(failures - 1, 0)), 5.0)

    def _patch_job_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        meta = job["metadata"]
        if status != (job.get("status") or {}):
            self.emu.update(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                    "status": status,
                },
                subresource="status",
            )
            job["status"] = status

    @staticmethod
    def _set_condition(
        status: dict[str, Any], ctype: str, cstatus: str, reason: str, message: str
    ) -> None:
        conds = status.setdefault("conditions", [])
        now = now_iso()
        for c in conds:
            if c.get("type") == ctype:
                if (c.get("status"), c.get("reason"), c.get("message")) == (
                    cstatus,
                    reason,
                    message,
                ):
                    return  # unchanged: no write, no event
                if c.get("status") != cstatus:
                    c["lastTransitionTime"] = now
                c.update(
                    {"status": cstatus, "reason": reason, "message": message, "lastProbeTime": now}
                )
                return
        conds.append(
            {
                "type": ctype,
                "status": cstatus,
                "reason": reason,
                "message": message,
                "lastProbeTime": now,
                "lastTransitionTime": now,
            }
        )

    def _delete_pod(self, pod: dict[str, Any]) -> None:
        self._controller_deleted.add(pod["metadata"]["uid"])
        self.emu.delete("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])

    def _fail_job(
        self,
        job: dict[str, Any],
        status: dict[str, Any],
        active: list[dict[str, Any]],
        reason: str,
        message: str,
    ) -> None:
        for pod in active:
            self._delete_pod(pod)
        self._set_condition(status, "FailureTarget", "True", reason, message)
        self._set_condition(status, "Failed", "True", reason, message)
        status["active"] = 0
        status["ready"] = 0
        status.setdefault("terminating", 0)
        self._patch_job_status(job, status)
        self._event(job, "Warning", reason, message)

    def _reconcile_job(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta = job["metadata"]
        st = self._jobs.setdefault(meta["uid"], _JobState())
        status = copy.deepcopy(job.get("status") or {})
        active = [
            p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        if self._finished(job):
            self._after_finish(job, status, active)
            return
        if meta.get("deletionTimestamp"):
            for pod in active:
                self._delete_pod(pod)
            return
        status.setdefault("terminating", 0)
        status.setdefault("uncountedTerminatedPods", {})
        if self._account_finished_pods(job, pods, active, status, st):
            return
        if self._suspension(job, active, status, st):
            return
        if not status.get("startTime"):
            status["startTime"] = now_iso()
            st.started = time.monotonic()
        if self._complete_or_fail(job, active, status, st):
            return
        if _indexed(job):
            done = {
                _pod_index(p) for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"
            }
            running = {_pod_index(p) for p in active}
            n = int((job.get("spec") or {}).get("completions") or 1)
            missing = [i for i in range(n) if i not in done and i not in running]
            if missing and time.monotonic() >= st.next_create:
                for i in missing:
                    pod = self._create_job_pod(job, index=i)
                    active.append(pod)
                    self._event(
                        job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}"
                    )
        elif not active and time.monotonic() >= st.next_create:
            pod = self._create_job_pod(job)
            active = [pod]
            self._event(
                job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}"
            )
        status["active"] = len(active)
        status["ready"] = sum(
            1
            for p in active
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        self._patch_job_status(job, status)

    def _after_finish(
        self, job: dict[str, Any], status: dict[str, Any], active: list[dict[str, Any]]
    ) -> None:
        """A finished Job: its leftover pods go; ``ttlSecondsAfterFinished`` deletes it."""
        meta, spec = job["metadata"], job.get("spec") or {}
        for pod in active:
            self._delete_pod(pod)
        ttl = spec.get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        done = status.get("completionTime") or next(
            (
                c.get("lastTransitionTime")
                for c in status.get("conditions") or []
                if c.get("type") in ("Complete", "Failed")
            ),
            None,
        )
        if done and _age_seconds(done) >= float(ttl):
            self.emu.delete("batch/v1", "Job", meta["name"], meta["namespace"])

    def _account_finished_pods(
        self,
        job: dict[str, Any],
        pods: list[dict[str, Any]],
        active: list[dict[str, Any]],
        status: dict[str, Any],
        st: _JobState,
    ) -> bool:
        """Count newly finished pods into ``status`` (podFailurePolicy first). True when a
        ``FailJob`` rule failed the Job."""
        pfp = ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
        for pod in pods:
            puid = pod["metadata"]["uid"]
            phase = (pod.get("status") or {}).get("phase")
            if puid in self._accounted or phase not in ("Succeeded", "Failed"):
                continue
            self._accounted.add(puid)
            if phase == "Succeeded":
                status["succeeded"] = int(status.get("succeeded") or 0) + 1
                if _indexed(job) and _pod_index(pod) is not None:
                    have = _parse_ranges(status.get("completedIndexes") or "")
                    status["completedIndexes"] = _ranges([*have, _pod_index(pod)])
                continue
            action, idx, detail = self._match_failure_policy(pfp, pod)
            if action == "Ignore":
                st.next_create = time.monotonic() + self.backoff_seconds
                continue
            status["failed"] = int(status.get("failed") or 0) + 1
            st.next_create = time.monotonic() + self._backoff(status["failed"])
            if action == "FailJob":
                msg = f"{detail} matching FailJob rule at index {idx}"
                self._fail_job(
                    job, status, [p for p in active if p is not pod], "PodFailurePolicy", msg
                )
                return True
        return False

    def _suspension(
        self,
        job: dict[str, Any],
        active: list[dict[str, Any]],
        status: dict[str, Any],
        st: _JobState,
    ) -> bool:
        """``spec.suspend``: delete the running pod, ``Suspended=True`` (True: nothing more to
        do); resuming flips the condition and restarts the clock."""
        if (job.get("spec") or {}).get("suspend"):
            for pod in active:
                self._delete_pod(pod)
            status["active"] = 0
            status["ready"] = 0
            status.pop("startTime", None)
            self._set_condition(status, "Suspended", "True", "JobSuspended", "Job suspended")
            was_suspended = any(
                c.get("type") == "Suspended" and c.get("status") == "True"
                for c in (job.get("status") or {}).get("conditions") or []
            )
            self._patch_job_status(job, status)
            if not was_suspended:
                self._event(job, "Normal", "Suspended", "Job suspended")
            return True
        if any(
            c.get("type") == "Suspended" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            self._set_condition(status, "Suspended", "False", "JobResumed", "Job resumed")
            status["startTime"] = now_iso()
            st.started = time.monotonic()
            self._event(job, "Normal", "Resumed", "Job resumed")
        return False

    def _complete_or_fail(
        self,
        job: dict[str, Any],
        active: list[dict[str, Any]],
        status: dict[str, Any],
        st: _JobState,
    ) -> bool:
        """Completions reached, ``backoffLimit`` exceeded or ``activeDeadlineSeconds`` passed:
        finish the Job and return True."""
        spec = job.get("spec") or {}
        completions = int(spec.get("completions") or 1)
        if int(status.get("succeeded") or 0) >= completions:
            for pod in active:
                self._delete_pod(pod)
            status["active"] = 0
            status["ready"] = 0
            status["completionTime"] = now_iso()
            done = "Reached expected number of succeeded pods"
            self._set_condition(status, "SuccessCriteriaMet", "True", "CompletionsReached", done)
            self._set_condition(status, "Complete", "True", "CompletionsReached", done)
            self._patch_job_status(job, status)
            self._event(job, "Normal", "Completed", "Job completed")
            return True
        backoff_limit = int(spec.get("backoffLimit", 6))
        if int(status.get("failed") or 0) > backoff_limit:
            msg = "Job has reached the specified backoff limit"
            self._fail_job(job, status, active, "BackoffLimitExceeded", msg)
            return True
        deadline = spec.get("activeDeadlineSeconds")
        elapsed = time.monotonic() - st.started if st.started else _age_seconds(status["startTime"])
        if deadline is not None and elapsed >= float(deadline):
            msg = "Job was active longer than specified deadline"
            self._fail_job(job, status, active, "DeadlineExceeded", msg)
            return True
        return False

    @staticmethod
    def _match_failure_policy(
        rules: list[dict[str, Any]], pod: dict[str, Any]
    ) -> tuple[str, int, str]:
        pstatus = pod.get("status") or {}
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for idx, rule in enumerate(rules):
            action = rule.get("action", "Count")
            on_codes = rule.get("onExitCodes")
            if on_codes:
                values = set(on_codes.get("values") or [])
                op = on_codes.get("operator", "In")
                for cs in pstatus.get("containerStatuses") or []:
                    if (
                        on_codes.get("containerName")
                        and cs.get("name") != on_codes["containerName"]
                    ):
                        continue
                    term = (cs.get("state") or {}).get("terminated")
                    if not term:
                        continue
                    code = int(term.get("exitCode", 0))
                    if (op == "In" and code in values) or (
                        op == "NotIn" and code not in values and code != 0
                    ):
                        return (
                            action,
                            idx,
                            f"Container {cs.get('name')} for pod {ns}/{name} failed with exit code {code}",
                        )
            for pc in rule.get("onPodConditions") or []:
                for c in pstatus.get("conditions") or []:
                    if c.get("type") == pc.get("type") and c.get("status") == pc.get(
                        "status", "True"
                    ):
                        return action, idx, f"Pod {ns}/{name} has condition {pc.get('type')}"
        return "Count", -1, ""

    def _create_job_pod(self, job: dict[str, Any], index: int | None = None) -> dict[str, Any]:
        meta = job["metadata"]
        tmpl = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        pmeta = tmpl.get("metadata") or {}
        suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
        prefix = meta["name"] if index is None else f"{meta['name']}-{index}"
        if index is not None:
            pmeta.setdefault("annotations", {})[INDEX_KEY] = str(index)
            pmeta.setdefault("labels", {})[INDEX_KEY] = str(index)
            pspec = tmpl.setdefault("spec", {})
            pspec.setdefault("hostname", prefix)
            ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}
            for c in pspec.get("containers") or []:
                env = [e for e in c.get("env") or [] if e.get("name") != INDEX_ENV]
                c["env"] = [{"name": INDEX_ENV, "valueFrom": ref}, *env]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{prefix}-{suffix}",
                "namespace": meta["namespace"],
                "labels": dict(pmeta.get("labels") or {}),
                "annotations": dict(pmeta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": tmpl.get("spec") or {},
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        return self.emu.create(pod)
