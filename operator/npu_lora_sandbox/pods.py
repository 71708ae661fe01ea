"""The sandbox kubelet's pod runner (see :class:`PodRunner`)."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .podenv import _StartError
from .resources import ApiError, now_iso
from .runtime import Container

log = logging.getLogger(__name__)


@dataclass
class _Proc:
    uid: str
    namespace: str
    name: str
    task: asyncio.Task[None] | None = None
    container: Container | None = None
    grace: float = 5.0
    killing: bool = False
    started_at: str = ""


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


def _condition(
    ctype: str, status: str, when: str, reason: str | None = None, message: str | None = None
) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": ctype, "status": status}
    if reason is not None:
        cond["reason"] = reason
    if message is not None:
        cond["message"] = message
    return {**cond, "lastTransitionTime": when, "lastProbeTime": None}


def _base_conditions() -> list[dict[str, Any]]:
    """PodScheduled + Initialized, true from now."""
    return [
        _condition("PodScheduled", "True", now_iso()),
        _condition("Initialized", "True", now_iso()),
    ]


def _running_status(
    container: dict[str, Any], c: Container, started: str, base_conds: list[dict[str, Any]]
) -> dict[str, Any]:
    image = str(container.get("image", ""))
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": started,
        "conditions": [
            *base_conds,
            _condition("ContainersReady", "True", started),
            _condition("Ready", "True", started),
        ],
        "containerStatuses": [
            {
                "name": container.get("name", "main"),
                "image": image,
                "imageID": f"sandbox://{image}",
                "containerID": c.id,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
        ],
    }


def _terminated_status(
    container: dict[str, Any],
    term: dict[str, Any],
    base_conds: list[dict[str, Any]],
    extra: list[dict[str, Any]],
) -> dict[str, Any]:
    code, finished = term["exitCode"], term["finishedAt"]
    why = "PodCompleted" if code == 0 else "PodFailed"
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": [
            *base_conds,
            *extra,
            _condition("ContainersReady", "False", finished, why),
            _condition("Ready", "False", finished, why),
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
    }


def _exit_message(container: dict[str, Any], code: int, tm_local: Path, log_path: Path) -> str:
    """The termination-message file, or (``FallbackToLogsOnError``, a failure, an empty file) the
    log's last 80 lines / 2048 bytes."""
    message = tm_local.read_text(errors="replace")[:4096] if tm_local.exists() else ""
    if (
        not message.strip()
        and code != 0
        and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    ):
        data = log_path.read_bytes()
        tail = b"".join(data.splitlines(keepends=True)[-80:])[-2048:]
        message = tail.decode(errors="replace")
    return message


class PodRunner:
    """The pod runner: schedules a pod on the node, starts its container through the
    :class:`~npu_lora_sandbox.runtime.PodRuntime`, writes the pod's status, stops it.

    A mixin of :class:`~npu_lora_sandbox.kubelet.LocalKubelet` (its state lives there).
    """

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
            self._mark_unschedulable(pod, why)
            return
        self._handled.add(uid)
        pod = self._bind(pod)
        containers = spec.get("containers") or []
        c0 = containers[0] if containers else {"name": "main", "image": ""}
        image = str(c0.get("image", ""))
        base_conds = _base_conditions()
        if self.image_pull_failure and self.image_pull_failure in image:
            self._image_pull_backoff(pod, c0, base_conds)
            return
        meta = pod["metadata"]
        p = _Proc(uid=uid, namespace=meta["namespace"], name=meta["name"])
        p.grace = min(float(spec.get("terminationGracePeriodSeconds", 30)), self.max_grace_seconds)
        self._procs[uid] = p
        p.task = self._spawn(self._run_pod(p, pod, c0, base_conds))

    def _mark_unschedulable(self, pod: dict[str, Any], why: str) -> None:
        """``PodScheduled=False`` (``Unschedulable``) and a FailedScheduling event, once."""
        if any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (pod.get("status") or {}).get("conditions") or []
        ):
            return
        cond = _condition("PodScheduled", "False", now_iso(), "Unschedulable", why)
        self._pod_status(pod, {"phase": "Pending", "conditions": [cond]})
        self._event(pod, "Warning", "FailedScheduling", why)

    def _bind(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Bind the pod to this node (``spec.nodeName``) and say so in an event."""
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
        return pod

    def _image_pull_backoff(
        self, pod: dict[str, Any], c0: dict[str, Any], base_conds: list[dict[str, Any]]
    ) -> None:
        """The pod stays Pending: its container waits in ``ImagePullBackOff``."""
        image = str(c0.get("image", ""))
        msg = f'Back-off pulling image "{image}"'
        unready = f"containers with unready status: [{c0.get('name')}]"
        not_ready = _condition("Ready", "False", now_iso(), "ContainersNotReady", unready)
        waiting = {"waiting": {"reason": "ImagePullBackOff", "message": msg}}
        self._pod_status(
            pod,
            {
                "phase": "Pending",
                "hostIP": "127.0.0.1",
                "startTime": now_iso(),
                "conditions": [*base_conds, not_ready],
                "containerStatuses": [
                    {
                        "name": c0.get("name"),
                        "image": image,
                        "imageID": "",
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": waiting,
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

    def _unschedulable(self, spec: dict[str, Any]) -> str | None:
        sel = spec.get("nodeSelector") or {}
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = required.get("nodeSelectorTerms")
        # the Node object's labels as they are now (``kubectl label node`` reschedules)
        live = self.emu.get("v1", "Node", self.node_name)
        labels = ((live or {}).get("metadata") or {}).get("labels") or self.node_labels
        node = {"labels": labels, "fields": {"metadata.name": self.node_name}}
        if any(labels.get(k) != v for k, v in sel.items()) or (
            terms is not None and not any(node_term_matches(t, node) for t in terms)
        ):
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

    def _pod_workdir(self, namespace: str, name: str) -> Path:
        """A fresh pod directory with an empty ``container.log`` registered for ``kubectl logs``."""
        pdir = self.pod_dir(namespace, name)
        if pdir.exists():
            shutil.rmtree(pdir, ignore_errors=True)
        pdir.mkdir(parents=True, exist_ok=True)
        log_path = pdir / "container.log"
        log_path.touch()
        self.emu.register_pod_log(namespace, name, log_path)
        return pdir

    async def _run_pod(
        self,
        p: _Proc,
        pod: dict[str, Any],
        container: dict[str, Any],
        base_conds: list[dict[str, Any]],
    ) -> None:
        ns, name = p.namespace, p.name
        pdir = self._pod_workdir(ns, name)
        log_path = pdir / "container.log"
        image = str(container.get("image", ""))
        cname = container.get("name", "main")

        def fail_to_start(message: str, started: str = "") -> None:
            self._finish(p, pod, container, 128, message, started, "StartError", base_conds)

        try:
            launch, tm_local = self._prepare(pod, container, pdir, log_path)
        except _StartError as exc:
            fail_to_start(str(exc))
            return
        except Exception as exc:
            log.exception("sandbox kubelet: cannot prepare pod %s/%s", ns, name)
            fail_to_start(f"sandbox kubelet: {exc}")
            return
        started = now_iso()
        p.started_at = started
        self._event(
            pod, "Normal", "Pulled", f'Container image "{image}" already present on machine'
        )
        try:
            c = await self.runtime.start(launch)
        except OSError as exc:
            fail_to_start(f"failed to start container: {exc}", started)
            return
        p.container = c
        self._event(pod, "Normal", "Started", f"Started container {cname}")
        self._pod_status(pod, _running_status(container, c, started, base_conds))
        if p.killing:  # deleted while starting
            await self._kill(p)
        code = await c.wait()
        message = _exit_message(container, code, tm_local, log_path)
        reason = getattr(c, "reason", None) or ("Completed" if code == 0 else "Error")
        self._finish(p, pod, container, code, message, started, reason, base_conds)

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
        if p.container is not None:
            term["containerID"] = p.container.id
        cur = self.emu.get("v1", "Pod", p.name, p.namespace)
        extra = [
            c
            for c in ((cur or {}).get("status") or {}).get("conditions") or []
            if c.get("type") == "DisruptionTarget"
        ]
        self._pod_status(pod, _terminated_status(container, term, base_conds, extra))

    async def _kill(self, p: _Proc) -> None:
        p.killing = True
        c = p.container
        if c is None or not c.running:
            return
        await c.stop(p.grace)


def _requirement_matches(req: dict[str, Any], values: dict[str, str]) -> bool:
    """One node-selector requirement against a node's labels (or fields)."""
    key, op, want = req.get("key"), req.get("operator"), [str(v) for v in req.get("values") or []]
    have = values.get(str(key))
    if op == "In":
        return have is not None and have in want
    if op == "NotIn":
        return have is None or have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(want) == 1:
        try:
            a, b = int(have), int(want[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_term_matches(term: dict[str, Any] | None, node: dict[str, dict[str, str]]) -> bool:
    """A ``nodeSelectorTerm``: all its ``matchExpressions`` (labels) and ``matchFields``
    (``metadata.name``) hold; an empty term matches no node (as the scheduler's)."""
    exprs = (term or {}).get("matchExpressions") or []
    fields = (term or {}).get("matchFields") or []
    if not exprs and not fields:
        return False
    return all(_requirement_matches(r, node["labels"]) for r in exprs) and all(
        _requirement_matches(r, node["fields"]) for r in fields
    )
