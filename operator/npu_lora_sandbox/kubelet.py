"""A local "kubelet" + Job controller for the API emulator: runs containers as subprocesses.

Usage::

    from npu_lora_sandbox.emulator import ApiEmulator
    from npu_lora_sandbox.kubelet import LocalKubelet

    emu = ApiEmulator().start()
    kubelet = LocalKubelet(emu, root=Path("/tmp/sandbox")).start()
    ...                                   # create batch/v1 Jobs (or bare Pods) through the API
    kubelet.stop(); emu.stop()           # emu.stop() alone also terminates the kubelet's processes

    LocalKubelet(emu, root, *, node_name="sandbox-node", node_labels=None, node_capacity=None,
                 python_executable=sys.executable, entrypoints=None, extra_env=None,
                 image_pull_failure="doesnotexist", backoff_seconds=0.2, max_grace_seconds=5.0,
                 tick_seconds=0.2, pod_identity=True)
    kubelet.pod_dir(ns, pod) / "container.log"; kubelet.pvc_dir(claim); kubelet.kubeconfig
    kubelet.disrupt_pod(ns, pod)         # eviction: DisruptionTarget=True, then the pod fails

It runs on the emulator's event loop and uses its storage in-process (no HTTP). What it does:

Job controller (``batch/v1`` Jobs; one pod at a time: ``parallelism`` is ignored and
``completions`` > 1 run one after another; indexed Jobs are not emulated):
- creates the Job's Pod ``<job>-<5 random chars>`` from the template (labels ``job-name``,
  ``batch.kubernetes.io/job-name``, ``controller-uid``, ``batch.kubernetes.io/controller-uid``;
  a controller ownerReference to the Job), and a replacement after a counted failure, after a short
  backoff (``backoff_seconds``, doubling, capped at 5 s; real clusters use 10 s doubling);
- writes ``status.active/ready/succeeded/failed/terminating``, ``startTime``, ``completionTime`` and
  the conditions of Kubernetes 1.32: ``SuccessCriteriaMet`` + ``Complete``; ``FailureTarget`` +
  ``Failed`` with reasons ``BackoffLimitExceeded``, ``DeadlineExceeded``, ``PodFailurePolicy``;
  ``Suspended`` (``JobSuspended``/``JobResumed``);
- ``backoffLimit``; ``podFailurePolicy`` rules in order (``onExitCodes`` ``In``/``NotIn`` with
  optional ``containerName``; ``onPodConditions`` such as ``DisruptionTarget``) with actions
  ``FailJob``, ``Ignore``, ``Count``; ``activeDeadlineSeconds`` (kills the pod → DeadlineExceeded);
  ``spec.suspend`` (the running pod is deleted and its process terminated; resuming creates a new
  pod); ``ttlSecondsAfterFinished`` (deletes the finished Job, cascading to its pods);
- a pod deleted by someone else while running counts as failed (like the real controller);
  :meth:`LocalKubelet.disrupt_pod` simulates an eviction (``DisruptionTarget`` condition, then the
  pod fails), so "disruptions do not count" policies can be tested.

Kubelet (every pod, Job-owned or bare, runs once: ``restartPolicy`` is not emulated):
- binds it to the node ``sandbox-node`` (a Node object it creates; labels ``node_labels``,
  allocatable ``node_capacity``, by default including ``furiosa.ai/rngd: 8``);
- runs the first container's ``command`` + ``args`` as a local subprocess (``python``/``python3``
  as ``command[0]`` become ``python_executable``, default this interpreter; an image without a
  command may be given one through ``entrypoints={"image-prefix": [...]}``) in its own session,
  stdout+stderr to ``<root>/pods/<ns>_<pod>/container.log`` (served as ``kubectl logs``);
- environment: ``PATH``/``HOME``/``LANG``/``PYTHONPATH``/``VIRTUAL_ENV``/``TMPDIR`` of this process, then the
  container's ``env`` (literal values, ``$(VAR)`` expansion, ``fieldRef`` for ``metadata.name``,
  ``metadata.namespace``, ``metadata.uid``, labels/annotations, ``spec.nodeName``,
  ``spec.serviceAccountName``, ``status.podIP``; ``configMapKeyRef``/``secretKeyRef``;
  ``envFrom``), plus ``KUBECONFIG`` (a kubeconfig for the emulator, so the in-container
  ``kubernetes`` client reaches the API: in-cluster config is absent, so clients fall back to it;
  with ``pod_identity=True``, the default, it authenticates as the pod's ``serviceAccountName``
  and the emulator enforces RBAC on its requests, as a cluster would; ``pod_identity=False``
  gives pods the admin kubeconfig),
  ``NPU_LORA_SANDBOX=1``, ``NPU_LORA_PATH_MAP`` (JSON ``{container path: local path}``),
  ``NPU_LORA_TERMINATION_MESSAGE_PATH`` (the local termination-message file) and ``extra_env``;
  ``PATH`` starts with the directory of ``python_executable`` (a venv's console scripts work);
- ``/var/run/secrets/kubernetes.io/serviceaccount`` maps to a directory with ``namespace``,
  ``token`` (the pod's ServiceAccount token) and an empty ``ca.crt``;
- volumes become local directories: a PVC ``claimName`` → ``<root>/pvc/<claimName>[/subPath]``;
  ``emptyDir`` (and unknown kinds) → ``<root>/pods/<ns>_<pod>/volumes/<name>``; ``configMap`` and
  ``secret`` → files materialised there (``items`` honoured); ``hostPath`` → itself;
- **path rewriting**: a container sees paths like ``/output``; the kubelet replaces every
  occurrence of each ``mountPath`` (longest first, whole path components only) and of the
  ``terminationMessagePath`` (default ``/dev/termination-log`` → a file in the pod directory) in
  ``command``, ``args``, ``env`` values, ``workingDir`` and the contents of materialised configMap
  files with the local path. Paths hard-coded inside programs are not rewritten: programs can read
  ``NPU_LORA_PATH_MAP`` / ``NPU_LORA_TERMINATION_MESSAGE_PATH`` (or get the path through an env
  var or an argument of the Job, which are rewritten);
- on exit: phase ``Succeeded``/``Failed``, ``containerStatuses[0].state.terminated`` with
  ``exitCode`` (a signal N gives 128+N), ``reason`` ``Completed``/``Error``, ``message`` = the
  termination-message file or, with ``terminationMessagePolicy: FallbackToLogsOnError`` on a
  failure with an empty file, the log's last 80 lines / 2048 bytes; ``startedAt``/``finishedAt``;
- deleting a pod (or its Job: cascade) terminates the process group: SIGTERM, then SIGKILL after
  the grace period (``terminationGracePeriodSeconds`` capped by ``max_grace_seconds``).

Failure knobs (for the operator's condition mapping):
- an image containing ``image_pull_failure`` (default ``"doesnotexist"``) never starts: the pod stays
  ``Pending`` with container ``waiting.reason: ImagePullBackOff`` (and ``Failed``/``BackOff``
  events; ``kubectl logs`` answers "is waiting to start: trying and failing to pull image");
- a pod whose ``nodeSelector`` the node's labels don't satisfy, or that requests more of an extended
  resource than ``node_capacity`` has, stays ``Pending`` with condition ``PodScheduled=False``,
  ``reason: Unschedulable`` and the scheduler's message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import os
import re
import secrets
import shutil
import signal
import string
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .emulator import ApiEmulator, ApiError, now_iso

__all__ = ["LocalKubelet"]

log = logging.getLogger(__name__)

NODE_NAME = "sandbox-node"
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR", "SYSTEMROOT")


@dataclass
class _Proc:
    uid: str
    namespace: str
    name: str
    task: asyncio.Task[None] | None = None
    proc: asyncio.subprocess.Process | None = None
    grace: float = 5.0
    killing: bool = False
    started_at: str = ""


@dataclass
class _JobState:
    failed_at: list[float] = field(default_factory=list)
    next_create: float = 0.0
    started: float = 0.0  # monotonic time of startTime (second-precision timestamps are too coarse)


class LocalKubelet:
    """Runs Jobs/Pods of an :class:`ApiEmulator` as local processes. See the module docstring."""

    def __init__(
        self,
        emu: ApiEmulator,
        root: str | Path,
        *,
        node_name: str = NODE_NAME,
        node_labels: Mapping[str, str] | None = None,
        node_capacity: Mapping[str, str] | None = None,
        python_executable: str | None = None,
        entrypoints: Mapping[str, list[str]] | None = None,
        extra_env: Mapping[str, str] | None = None,
        image_pull_failure: str = "doesnotexist",
        backoff_seconds: float = 0.2,
        max_grace_seconds: float = 5.0,
        tick_seconds: float = 0.2,
        pod_identity: bool = True,
    ) -> None:
        self.emu = emu
        self.root = Path(root).resolve()
        self.node_name = node_name
        self.node_labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **dict(node_labels or {}),
        }
        self.node_capacity = {
            "cpu": "16",
            "memory": "64Gi",
            "pods": "110",
            "furiosa.ai/rngd": "8",
            **dict(node_capacity or {}),
        }
        self.python_executable = python_executable or sys.executable
        self.entrypoints = dict(entrypoints or {})
        self.extra_env = dict(extra_env or {})
        self.image_pull_failure = image_pull_failure
        self.backoff_seconds = backoff_seconds
        self.max_grace_seconds = max_grace_seconds
        self.tick_seconds = tick_seconds
        self.pod_identity = pod_identity
        self._procs: dict[str, _Proc] = {}
        self._handled: set[str] = set()  # pod uids the kubelet took care of (started/stuck/failed)
        self._accounted: set[str] = set()  # pod uids counted into their Job's status
        self._controller_deleted: set[str] = set()  # pod uids the Job controller deleted itself
        self._jobs: dict[str, _JobState] = {}
        self._known_pods: dict[
            str, dict[str, Any]
        ] = {}  # uid -> last seen pod (to detect deletions)
        self._main_task: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ready: asyncio.Event | None = None
        self.kubeconfig = self.root / "kubeconfig"

    # ----------------------------------------------------------------------------- lifecycle

    def start(self) -> LocalKubelet:
        (self.root / "pvc").mkdir(parents=True, exist_ok=True)
        (self.root / "pods").mkdir(parents=True, exist_ok=True)
        self.emu.write_kubeconfig(self.kubeconfig)
        self._ensure_node()
        fut = asyncio.run_coroutine_threadsafe(self._main(), self.emu.loop)
        self._main_task = fut  # type: ignore[assignment]
        self.emu.add_stop_hook(self._shutdown)  # emu.stop() terminates the processes too
        return self

    def stop(self) -> None:
        """Stop the controllers and terminate every running process (SIGTERM, then SIGKILL)."""
        if self._main_task is None:
            return
        self.emu.remove_stop_hook(self._shutdown)
        loop = self.emu._loop
        if loop is not None and loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            with contextlib.suppress(Exception):
                fut.result(self.max_grace_seconds + 10)
        else:  # the emulator is gone already: kill what is left directly
            for p in list(self._procs.values()):
                if p.proc is not None and p.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.proc.pid, signal.SIGKILL)
        self._main_task = None

    def __enter__(self) -> LocalKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.root / "pods" / f"{namespace}_{name}"

    def pvc_dir(self, claim: str) -> Path:
        return self.root / "pvc" / claim

    def disrupt_pod(self, namespace: str, name: str, reason: str = "EvictionByEvictionAPI") -> None:
        """Simulate an eviction: add ``DisruptionTarget=True`` to the pod, then terminate it."""

        def op() -> None:
            pod = self.emu.get("v1", "Pod", name, namespace)
            if pod is None:
                return
            conds = [
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") != "DisruptionTarget"
            ]
            conds.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": "Eviction API: evicting",
                    "lastTransitionTime": now_iso(),
                }
            )
            self.emu.patch(
                "v1",
                "Pod",
                name,
                {"status": {"conditions": conds}},
                namespace=namespace,
                subresource="status",
            )
            uid = pod["metadata"]["uid"]
            p = self._procs.get(uid)
            if p is not None:
                self._spawn(self._kill(p))

        self.emu.call(op)

    # ----------------------------------------------------------------------------- main loop

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _main(self) -> None:
        q = self.emu.subscribe([("batch", "jobs"), ("", "pods")])
        try:
            while True:
                try:
                    self._reconcile()
                except Exception:
                    log.exception("sandbox kubelet: reconcile failed")
                try:
                    await asyncio.wait_for(q.get(), self.tick_seconds)
                    while not q.empty():
                        q.get_nowait()
                except TimeoutError:
                    pass
        finally:
            self.emu.unsubscribe(q)

    async def _shutdown(self) -> None:
        await asyncio.gather(*(self._kill(p) for p in list(self._procs.values())))
        task = self._main_task
        if task is not None:
            task.cancel()

    def _ensure_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self.node_labels},
            "status": {
                "capacity": self.node_capacity,
                "allocatable": self.node_capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "sandbox kubelet is posting ready status",
                        "lastHeartbeatTime": now_iso(),
                        "lastTransitionTime": now_iso(),
                    }
                ],
                "nodeInfo": {
                    "kubeletVersion": "v1.32.0-sandbox",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.node_name},
                ],
            },
        }
        if self.emu.get("v1", "Node", self.node_name) is None:
            self.emu.create(node, keep_status=True)

    def _reconcile(self) -> None:
        pods = self.emu.list("v1", "Pod")
        jobs = self.emu.list("batch/v1", "Job")
        live = {p["metadata"]["uid"]: p for p in pods}
        # Pods that disappeared: kill their processes; a Job counts an unaccounted one as failed.
        for uid, old in list(self._known_pods.items()):
            if uid not in live:
                del self._known_pods[uid]
                p = self._procs.get(uid)
                if p is not None:
                    self._spawn(self._kill(p))
                self._pod_vanished(old, jobs)
        for uid, pod in live.items():
            self._known_pods[uid] = pod
            self._reconcile_pod(pod)
        for job in jobs:
            try:
                self._reconcile_job(job, [p for p in pods if self._owned_by(p, job)])
            except ApiError as exc:
                if exc.code not in (404, 409):
                    raise

    # ----------------------------------------------------------------------------- job controller

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
        spec = job.get("spec") or {}
        juid = meta["uid"]
        st = self._jobs.setdefault(juid, _JobState())
        status = copy.deepcopy(job.get("status") or {})
        active = [
            p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        if self._finished(job):
            for pod in active:
                self._delete_pod(pod)
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None:
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
            return
        if meta.get("deletionTimestamp"):
            for pod in active:
                self._delete_pod(pod)
            return
        status.setdefault("terminating", 0)
        status.setdefault("uncountedTerminatedPods", {})

        # Account for finished pods.
        pfp = (spec.get("podFailurePolicy") or {}).get("rules") or []
        for pod in pods:
            puid = pod["metadata"]["uid"]
            phase = (pod.get("status") or {}).get("phase")
            if puid in self._accounted or phase not in ("Succeeded", "Failed"):
                continue
            self._accounted.add(puid)
            if phase == "Succeeded":
                status["succeeded"] = int(status.get("succeeded") or 0) + 1
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
                return

        # Suspension.
        if spec.get("suspend"):
            for pod in active:
                self._delete_pod(pod)
            status["active"] = 0
            status["ready"] = 0
            status.pop("startTime", None)
            self._set_condition(status, "Suspended", "True", "JobSuspended", "Job suspended")
            if any(
                c.get("type") == "Suspended" and c.get("status") == "True"
                for c in (job.get("status") or {}).get("conditions") or []
            ):
                self._patch_job_status(job, status)
                return
            self._patch_job_status(job, status)
            self._event(job, "Normal", "Suspended", "Job suspended")
            return
        if any(
            c.get("type") == "Suspended" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            self._set_condition(status, "Suspended", "False", "JobResumed", "Job resumed")
            status["startTime"] = now_iso()
            st.started = time.monotonic()
            self._event(job, "Normal", "Resumed", "Job resumed")
        if not status.get("startTime"):
            status["startTime"] = now_iso()
            st.started = time.monotonic()

        completions = int(spec.get("completions") or 1)
        if int(status.get("succeeded") or 0) >= completions:
            for pod in active:
                self._delete_pod(pod)
            status["active"] = 0
            status["ready"] = 0
            status["completionTime"] = now_iso()
            self._set_condition(
                status,
                "SuccessCriteriaMet",
                "True",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
            self._set_condition(
                status,
                "Complete",
                "True",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
            self._patch_job_status(job, status)
            self._event(job, "Normal", "Completed", "Job completed")
            return
        backoff_limit = int(spec.get("backoffLimit", 6))
        if int(status.get("failed") or 0) > backoff_limit:
            self._fail_job(
                job,
                status,
                active,
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
            return
        deadline = spec.get("activeDeadlineSeconds")
        elapsed = time.monotonic() - st.started if st.started else _age_seconds(status["startTime"])
        if deadline is not None and elapsed >= float(deadline):
            self._fail_job(
                job,
                status,
                active,
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            )
            return
        if not active and time.monotonic() >= st.next_create:
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

    def _create_job_pod(self, job: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        tmpl = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        pmeta = tmpl.get("metadata") or {}
        suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{suffix}",
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

    def _event(self, obj: dict[str, Any], etype: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        now = now_iso()
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            # Like real event names: "<object>.<hex time>", so that lists come out in time order.
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": etype,
            "source": {
                "component": "sandbox-kubelet" if obj.get("kind") == "Pod" else "job-controller"
            },
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiError):
            self.emu.create(ev)

    # ----------------------------------------------------------------------------- kubelet

    def _reconcile_pod(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        phase = (pod.get("status") or {}).get("phase")
        if (
            uid in self._handled
            or phase in ("Succeeded", "Failed")
            or pod["metadata"].get("deletionTimestamp")
        ):
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName") and spec["nodeName"] != self.node_name:
            return
        why = self._unschedulable(spec)
        if why:
            if not any(
                c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in (pod.get("status") or {}).get("conditions") or []
            ):
                self._pod_status(
                    pod,
                    {
                        "phase": "Pending",
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": why,
                                "lastTransitionTime": now_iso(),
                                "lastProbeTime": None,
                            }
                        ],
                    },
                )
                self._event(pod, "Warning", "FailedScheduling", why)
            return
        self._handled.add(uid)
        meta = pod["metadata"]
        pod = self.emu.patch(
            "v1",
            "Pod",
            meta["name"],
            {"spec": {"nodeName": self.node_name}},
            namespace=meta["namespace"],
        )
        self._event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.node_name}",
        )
        containers = spec.get("containers") or []
        c0 = containers[0] if containers else {"name": "main", "image": ""}
        image = str(c0.get("image", ""))
        base_conds = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": now_iso(),
                "lastProbeTime": None,
            },
            {
                "type": "Initialized",
                "status": "True",
                "lastTransitionTime": now_iso(),
                "lastProbeTime": None,
            },
        ]
        if self.image_pull_failure and self.image_pull_failure in image:
            msg = f'Back-off pulling image "{image}"'
            self._pod_status(
                pod,
                {
                    "phase": "Pending",
                    "hostIP": "127.0.0.1",
                    "startTime": now_iso(),
                    "conditions": [
                        *base_conds,
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "ContainersNotReady",
                            "message": f"containers with unready status: [{c0.get('name')}]",
                            "lastTransitionTime": now_iso(),
                            "lastProbeTime": None,
                        },
                    ],
                    "containerStatuses": [
                        {
                            "name": c0.get("name"),
                            "image": image,
                            "imageID": "",
                            "ready": False,
                            "started": False,
                            "restartCount": 0,
                            "state": {"waiting": {"reason": "ImagePullBackOff", "message": msg}},
                        }
                    ],
                },
            )
            self._event(
                pod,
                "Warning",
                "Failed",
                f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found',
            )
            self._event(pod, "Normal", "BackOff", msg)
            return
        p = _Proc(uid=uid, namespace=meta["namespace"], name=meta["name"])
        p.grace = min(float(spec.get("terminationGracePeriodSeconds", 30)), self.max_grace_seconds)
        self._procs[uid] = p
        p.task = self._spawn(self._run_pod(p, pod, c0, base_conds))

    def _unschedulable(self, spec: dict[str, Any]) -> str | None:
        sel = spec.get("nodeSelector") or {}
        if any(self.node_labels.get(k) != v for k, v in sel.items()):
            return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        for c in spec.get("containers") or []:
            res = c.get("resources") or {}
            wants = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            for k, v in wants.items():
                if k in ("cpu", "memory", "ephemeral-storage") or "/" not in k:
                    continue
                have = self.node_capacity.get(k)
                if have is None or _quantity(v) > _quantity(have):
                    return f"0/1 nodes are available: 1 Insufficient {k}. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
        return None

    def _pod_status(self, pod: dict[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
        meta = pod["metadata"]
        cur = self.emu.get("v1", "Pod", meta["name"], meta["namespace"])
        if cur is None or cur["metadata"]["uid"] != meta["uid"]:
            return None
        new = {**(cur.get("status") or {}), **status}
        try:
            return self.emu.update(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                    "status": new,
                },
                subresource="status",
            )
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    # ----------------------------------------------------------------------------- processes

    def _mounts(
        self, pod: dict[str, Any], container: dict[str, Any], pdir: Path
    ) -> dict[str, Path]:
        volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
        mapping: dict[str, Path] = {}
        for vm in container.get("volumeMounts") or []:
            vol = volumes.get(vm.get("name"), {})
            if "persistentVolumeClaim" in vol:
                local = self.pvc_dir(vol["persistentVolumeClaim"].get("claimName", vm.get("name")))
            elif "hostPath" in vol:
                local = Path(vol["hostPath"].get("path", "/"))
            else:
                local = pdir / "volumes" / str(vm.get("name"))
            if vm.get("subPath"):
                local = local / vm["subPath"]
            if "hostPath" not in vol:
                local.mkdir(parents=True, exist_ok=True)
            mapping[str(vm.get("mountPath", "")).rstrip("/") or "/"] = local
        return mapping

    def _materialise(
        self, pod: dict[str, Any], container: dict[str, Any], pdir: Path, rewrite: Any
    ) -> None:
        ns = pod["metadata"]["namespace"]
        volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
        for vm in container.get("volumeMounts") or []:
            vol = volumes.get(vm.get("name"), {})
            src: dict[str, bytes] = {}
            items = None
            if "configMap" in vol:
                cm = self.emu.get("v1", "ConfigMap", vol["configMap"].get("name", ""), ns) or {}
                src = {k: rewrite(v).encode() for k, v in (cm.get("data") or {}).items()}
                src.update(
                    {k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()}
                )
                items = vol["configMap"].get("items")
            elif "secret" in vol:
                sec = self.emu.get("v1", "Secret", vol["secret"].get("secretName", ""), ns) or {}
                src = {k: base64.b64decode(v) for k, v in (sec.get("data") or {}).items()}
                src.update({k: str(v).encode() for k, v in (sec.get("stringData") or {}).items()})
                items = vol["secret"].get("items")
            else:
                continue
            target = pdir / "volumes" / str(vm.get("name"))
            target.mkdir(parents=True, exist_ok=True)
            files = (
                {i["key"]: i.get("path", i["key"]) for i in items} if items else {k: k for k in src}
            )
            for key, rel in files.items():
                if key in src:
                    dest = target / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(src[key])

    def _env(self, pod: dict[str, Any], container: dict[str, Any], rewrite: Any) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        env.update(self.extra_env)
        for src in container.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                cm = self.emu.get("v1", "ConfigMap", src["configMapRef"].get("name", ""), ns) or {}
                env.update({prefix + k: rewrite(str(v)) for k, v in (cm.get("data") or {}).items()})
            if "secretRef" in src:
                sec = self.emu.get("v1", "Secret", src["secretRef"].get("name", ""), ns) or {}
                env.update(
                    {
                        prefix + k: base64.b64decode(v).decode(errors="replace")
                        for k, v in (sec.get("data") or {}).items()
                    }
                )
        for item in container.get("env") or []:
            name = item.get("name")
            if not name:
                continue
            if "value" in item:
                env[name] = rewrite(_expand(str(item["value"]), env))
                continue
            vf = item.get("valueFrom") or {}
            value: str | None = None
            if "fieldRef" in vf:
                value = _field_ref(pod, vf["fieldRef"].get("fieldPath", ""))
            elif "configMapKeyRef" in vf:
                ref = vf["configMapKeyRef"]
                cm = self.emu.get("v1", "ConfigMap", ref.get("name", ""), ns) or {}
                raw = (cm.get("data") or {}).get(ref.get("key", ""))
                value = rewrite(raw) if raw is not None else None
            elif "secretKeyRef" in vf:
                ref = vf["secretKeyRef"]
                sec = self.emu.get("v1", "Secret", ref.get("name", ""), ns) or {}
                raw = (sec.get("data") or {}).get(ref.get("key", ""))
                value = base64.b64decode(raw).decode(errors="replace") if raw is not None else None
            elif "resourceFieldRef" in vf:
                value = "1"
            if value is not None:
                env[name] = value
        return env

    async def _run_pod(
        self,
        p: _Proc,
        pod: dict[str, Any],
        container: dict[str, Any],
        base_conds: list[dict[str, Any]],
    ) -> None:
        ns, name = p.namespace, p.name
        pdir = self.pod_dir(ns, name)
        if pdir.exists():
            shutil.rmtree(pdir, ignore_errors=True)
        pdir.mkdir(parents=True, exist_ok=True)
        log_path = pdir / "container.log"
        log_path.touch()
        self.emu.register_pod_log(ns, name, log_path)
        image = str(container.get("image", ""))
        cname = container.get("name", "main")
        try:
            mapping = self._mounts(pod, container, pdir)
            tm_path = str(container.get("terminationMessagePath") or "/dev/termination-log")
            tm_local = pdir / "termination-log"
            tm_local.touch()
            mapping[tm_path] = tm_local
            sa_name = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
            if self.pod_identity:
                kubeconfig = self.emu.write_kubeconfig(
                    pdir / "kubeconfig", namespace=ns, service_account=(ns, sa_name)
                )
                token = self.emu.service_account_token(ns, sa_name)
            else:
                kubeconfig, token = self.kubeconfig, "sandbox"
            sa_dir = pdir / "serviceaccount"
            sa_dir.mkdir(exist_ok=True)
            (sa_dir / "namespace").write_text(ns)
            (sa_dir / "token").write_text(token)
            (sa_dir / "ca.crt").write_text("")
            mapping.setdefault(SA_PATH, sa_dir)
            rewrite = _rewriter(mapping)
            self._materialise(pod, container, pdir, rewrite)
            env = self._env(pod, container, rewrite)
            py_bin = str(Path(self.python_executable).parent)
            env["PATH"] = os.pathsep.join([py_bin, env.get("PATH", os.defpath)])
            env["KUBECONFIG"] = str(kubeconfig)
            env["NPU_LORA_SANDBOX"] = "1"
            env["NPU_LORA_PATH_MAP"] = json.dumps({k: str(v) for k, v in mapping.items()})
            env["NPU_LORA_TERMINATION_MESSAGE_PATH"] = str(tm_local)
            env.setdefault("HOSTNAME", name)
            command = list(container.get("command") or [])
            if not command:
                for prefix, entry in self.entrypoints.items():
                    if image.startswith(prefix):
                        command = list(entry)
                        break
            if not command:
                raise _StartError(
                    f"sandbox kubelet: container {cname!r} has no command (image {image!r}); set one or configure entrypoints"
                )
            argv = [
                rewrite(_expand(str(a), env)) for a in command + list(container.get("args") or [])
            ]
            if argv[0] in ("python", "python3"):
                argv[0] = self.python_executable
            workdir = rewrite(str(container.get("workingDir") or "")) or str(pdir)
            Path(workdir).mkdir(parents=True, exist_ok=True)
        except _StartError as exc:
            self._finish(p, pod, container, 128, str(exc), "", "StartError", base_conds)
            return
        except Exception as exc:
            log.exception("sandbox kubelet: cannot prepare pod %s/%s", ns, name)
            self._finish(
                p, pod, container, 128, f"sandbox kubelet: {exc}", "", "StartError", base_conds
            )
            return
        started = now_iso()
        p.started_at = started
        self._event(
            pod, "Normal", "Pulled", f'Container image "{image}" already present on machine'
        )
        try:
            with log_path.open("ab") as logf:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=logf,
                    stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL,
                    env=env,
                    cwd=workdir,
                    start_new_session=True,
                )
        except OSError as exc:
            self._finish(
                p,
                pod,
                container,
                128,
                f"failed to start container: {exc}",
                started,
                "StartError",
                base_conds,
            )
            return
        p.proc = proc
        self._event(pod, "Normal", "Started", f"Started container {cname}")
        self._pod_status(
            pod,
            {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "startTime": started,
                "conditions": [
                    *base_conds,
                    {
                        "type": "ContainersReady",
                        "status": "True",
                        "lastTransitionTime": started,
                        "lastProbeTime": None,
                    },
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": started,
                        "lastProbeTime": None,
                    },
                ],
                "containerStatuses": [
                    {
                        "name": cname,
                        "image": image,
                        "imageID": f"sandbox://{image}",
                        "containerID": f"sandbox://{proc.pid}",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": started}},
                    }
                ],
            },
        )
        if p.killing:  # deleted while starting
            await self._kill(p)
        code = await proc.wait()
        if code < 0:
            code = 128 - code
        message = tm_local.read_text(errors="replace")[:4096] if tm_local.exists() else ""
        if (
            not message.strip()
            and code != 0
            and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            data = log_path.read_bytes()
            tail = b"".join(data.splitlines(keepends=True)[-80:])[-2048:]
            message = tail.decode(errors="replace")
        self._finish(
            p,
            pod,
            container,
            code,
            message,
            started,
            "Completed" if code == 0 else "Error",
            base_conds,
        )

    def _finish(
        self,
        p: _Proc,
        pod: dict[str, Any],
        container: dict[str, Any],
        code: int,
        message: str,
        started: str,
        reason: str,
        base_conds: list[dict[str, Any]],
    ) -> None:
        self._procs.pop(p.uid, None)
        finished = now_iso()
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started or finished,
            "finishedAt": finished,
        }
        if message:
            term["message"] = message
        if p.proc is not None:
            term["containerID"] = f"sandbox://{p.proc.pid}"
        cur = self.emu.get("v1", "Pod", p.name, p.namespace)
        extra = [
            c
            for c in ((cur or {}).get("status") or {}).get("conditions") or []
            if c.get("type") == "DisruptionTarget"
        ]
        self._pod_status(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [
                    *base_conds,
                    *extra,
                    {
                        "type": "ContainersReady",
                        "status": "False",
                        "reason": "PodCompleted" if code == 0 else "PodFailed",
                        "lastTransitionTime": finished,
                        "lastProbeTime": None,
                    },
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "PodCompleted" if code == 0 else "PodFailed",
                        "lastTransitionTime": finished,
                        "lastProbeTime": None,
                    },
                ],
                "containerStatuses": [
                    {
                        "name": container.get("name", "main"),
                        "image": container.get("image", ""),
                        "imageID": f"sandbox://{container.get('image', '')}",
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": {"terminated": term},
                        **({"containerID": term["containerID"]} if "containerID" in term else {}),
                    }
                ],
            },
        )

    async def _kill(self, p: _Proc) -> None:
        p.killing = True
        proc = p.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), p.grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
        # Reap any children left in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class _StartError(Exception):
    pass


def _age_seconds(ts: str) -> float:
    import datetime as dt

    try:
        t = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (dt.datetime.now(dt.UTC) - t).total_seconds()


_QTY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
}


def _quantity(value: Any) -> float:
    m = _QTY.match(str(value).strip())
    if not m:
        return 0.0
    return float(m.group(1)) * _SUFFIX.get(m.group(2), 1)


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion (``$$(VAR)`` escapes; unknown variables stay as written)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$?\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


def _field_ref(pod: dict[str, Any], path: str) -> str:
    meta = pod["metadata"]
    m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": NODE_NAME,
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", "default"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    return str(simple.get(path) or "")


def _rewriter(mapping: Mapping[str, Path]) -> Any:
    """Replace container paths (whole path components, longest first) with local paths."""
    items = sorted(
        ((k, str(v)) for k, v in mapping.items() if k and k != "/"), key=lambda kv: -len(kv[0])
    )
    if not items:
        return lambda s: s
    pattern = re.compile(
        "|".join(rf"(?<![\w.\-/]){re.escape(k)}(?=/|$|[^\w.\-])" for k, _ in items)
    )
    table = dict(items)

    def rewrite(text: str) -> str:
        return pattern.sub(lambda m: table[m.group(0)], text)

    return rewrite
