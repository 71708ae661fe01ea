"""A local "kubelet" + Job controller for the API emulator: runs containers as subprocesses.

Parts: :mod:`.jobs` (Job controller), :mod:`.pods` (pod runner), :mod:`.podenv` (pod environment),
:mod:`.runtime` (how a container runs: ``runtime=`` a :class:`~.runtime.PodRuntime`, by default
:class:`~.runtime.HostRuntime`, a local subprocess; :class:`~.podman.PodmanRuntime` runs each
pod's image as a real container, without the path rewriting described below).

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
                 tick_seconds=0.2, pod_identity=True, runtime=None)
    kubelet.pod_dir(ns, pod) / "container.log"; kubelet.pvc_dir(claim); kubelet.kubeconfig
    kubelet.disrupt_pod(ns, pod)         # eviction: DisruptionTarget=True, then the pod fails

It runs on the emulator's event loop and uses its storage in-process (no HTTP). What it does:

Job controller (``batch/v1`` Jobs; NonIndexed: one pod at a time, ``parallelism`` is ignored
and ``completions`` > 1 run one after another; ``completionMode: Indexed``: one pod per index at
once, ``<job>-<i>-<5 chars>`` with the index annotation/label, ``JOB_COMPLETION_INDEX``,
hostname ``<job>-<i>``, ``status.completedIndexes``; pod names under a headless Service resolve
to 127.0.0.1 in the pod environment, see :mod:`.podenv`):
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
  allocatable ``node_capacity``, by default an accelerator node of 8 cards as the backend
  registry describes it, :func:`npu_lora.api.backends.example_node`: its discovery labels,
  whole cards and every partitioned resource);
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
  with ``pod_identity=True``, the default, it carries the token of the pod's
  ``serviceAccountName`` (``ApiEmulator.service_account_token``: random, issued per
  ServiceAccount, revoked with it) and the emulator enforces RBAC on its requests, as a cluster
  would; ``pod_identity=False`` gives pods the admin kubeconfig, for tests only; otherwise the
  admin kubeconfig lives in ``<root>/admin/`` (0700), never in a pod's environment or files:
  a pod whose environment would name it or carry the admin token does not start),
  ``NPU_LORA_SANDBOX=1``, ``NPU_LORA_PATH_MAP`` (JSON ``{container path: local path}``),
  ``NPU_LORA_TERMINATION_MESSAGE_PATH`` (the local termination-message file),
  ``NPU_LORA_KERNEL_CACHE`` (this process's kernel cache, as the worker image's ENV names its
  pre-built one: the host kernels are built once, not in every pod) and ``extra_env``;
  ``PATH`` starts with the directory of ``python_executable`` (a venv's console scripts work);
- ``/var/run/secrets/kubernetes.io/serviceaccount`` maps to a directory with ``namespace``,
  ``token`` (the pod's ServiceAccount token) and ``ca.crt`` (the emulator's serving certificate);
- volumes become local directories: a PVC ``claimName`` → ``<root>/pvc/<namespace>/<claimName>[/subPath]``;
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
- a pod whose ``nodeSelector`` or required node affinity (``nodeSelectorTerms``, ORed, of
  ``matchExpressions`` with In/NotIn/Exists/DoesNotExist/Gt/Lt and ``matchFields`` on
  ``metadata.name``) the node does not satisfy, or that requests more of an extended
  resource than ``node_capacity`` has, stays ``Pending`` with condition ``PodScheduled=False``,
  ``reason: Unschedulable`` and the scheduler's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .emulator import ApiEmulator
from .jobs import JobController, _JobState
from .podenv import NODE_NAME, PodEnvironment
from .pods import PodRunner, _Proc
from .resources import ApiError, now_iso
from .runtime import HostRuntime, PodRuntime

__all__ = ["LocalKubelet"]


log = logging.getLogger(__name__)


_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class LocalKubelet(JobController, PodRunner, PodEnvironment):
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
        runtime: PodRuntime | None = None,
    ) -> None:
        self.emu = emu
        self.root = Path(root).resolve()
        self.node_name = node_name
        from npu_lora.api.backends import example_node  # the accelerators' labels, resources

        accel_labels, accel_capacity = example_node()
        self.node_labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **accel_labels,
            **dict(node_labels or {}),
        }
        self.node_capacity = {
            "cpu": "16",
            "memory": "64Gi",
            "pods": "110",
            **accel_capacity,
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
        #: how containers run (default: :class:`~npu_lora_sandbox.runtime.HostRuntime`)
        self.runtime: PodRuntime = runtime or HostRuntime()
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
        #: the sandbox's own credentials (a 0700 directory): the admin kubeconfig (written only
        #: for ``pod_identity=False``; ``npu-lora sandbox`` writes the user's there too) and the
        #: operator's. No pod is given this directory, a path into it or a token from it.
        self.private_dir = self.root / "admin"
        self.kubeconfig = self.private_dir / "kubeconfig"
        #: paths no pod may reach through a hostPath or its environment, besides the root
        self.private_paths: tuple[Path, ...] = (self.private_dir,)

    def start(self) -> LocalKubelet:
        (self.root / "pvc").mkdir(parents=True, exist_ok=True)
        (self.root / "pods").mkdir(parents=True, exist_ok=True)
        self.private_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.private_dir, 0o700)
        if not self.pod_identity:
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
                if p.container is not None and p.container.running:
                    p.container.kill()
        self._main_task = None

    def __enter__(self) -> LocalKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.root / "pods" / f"{namespace}_{name}"

    def pvc_dir(self, claim: str, namespace: str = "default") -> Path:
        """The directory standing in for PersistentVolumeClaim ``claim`` of ``namespace``
        (``<root>/pvc/<namespace>/<claim>``; claims are per namespace, as in a cluster). Raises
        ValueError for a name that is not a DNS-1123 name (``..``, ``/``)."""
        for what, value in (("claimName", claim), ("namespace", namespace)):
            if not isinstance(value, str) or len(value) > 253 or not _DNS1123.fullmatch(value):
                raise ValueError(f"{what} {value!r:.80} is not a DNS-1123 name")
        return self.root / "pvc" / namespace / claim

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
