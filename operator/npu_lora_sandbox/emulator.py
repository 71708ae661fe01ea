"""An in-process Kubernetes API server for tests and the laptop sandbox, built on ``kmock``.

:class:`ApiEmulator` subclasses :class:`kmock.KubernetesEmulator` and replaces its request
handling with a small but faithful API server: real HTTP on a free localhost port, against which
the real ``kubectl`` (v1.32), the ``kubernetes`` Python client and kopf work.

Usage (sync or async code alike: the server runs in its own thread with its own event loop)::

    from npu_lora_sandbox.emulator import ApiEmulator

    emu = ApiEmulator()                 # ApiEmulator(port=0, host="127.0.0.1")
    emu.start()                         # returns once the port listens
    emu.load_crd(crd_dict)              # or create the CRD through the API (kubectl apply)
    emu.write_kubeconfig(path)          # insecure http, admin user, context namespace "default"
    emu.url                             # "http://127.0.0.1:PORT"
    obj = emu.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {...}})
    emu.get("v1", "ConfigMap", "name", namespace="default")       # None when absent
    emu.list("batch/v1", "Job", namespace="default", label_selector="a=b")
    emu.patch("v1", "Pod", "p", {"status": {...}}, namespace="default", subresource="status")
    emu.update(obj)                     # PUT semantics (resourceVersion conflicts raise ApiError)
    emu.delete("v1", "ConfigMap", "name", namespace="default")
    emu.stop()                          # also: with ApiEmulator() as emu: ...

In-process calls default a namespaced resource's namespace to ``"default"``; ``list`` without a
namespace lists all namespaces. Resources are named by ``(apiVersion, Kind or plural)``.

The in-process methods raise :class:`ApiError` (``.code``, ``.reason``, ``.status`` dict) exactly
where the HTTP API answers an error. They are thread-safe (they run on the server's loop).

What the server does:

- create: 201; server-set ``uid``, ``resourceVersion`` (global counter), ``generation`` (1, then +1
  on changes outside metadata/status), ``creationTimestamp``, namespace from the URL,
  ``generateName``; 409 AlreadyExists / 404 NotFound / 422 Invalid ``metav1.Status`` objects with
  the apiserver's messages; namespaces must exist.
- ``/status`` writes change only status; main-resource writes ignore status (status subresource).
- PUT with resourceVersion conflict detection (409 Conflict); JSON merge, JSON, strategic merge
  patch and server-side apply (``application/apply-patch+yaml``: creates when absent; merged like a
  strategic merge patch; fields a ``fieldManager`` applied before and drops from its applied
  configuration are removed — simplified ownership: no conflicts, no managedFields).
- list (``<Kind>List``, label selectors incl. set-based, field selectors on any dotted path),
  all-namespaces lists, ``dryRun=All``.
- watch (JSON lines): ``resourceVersion`` honoured (absent/"0": synthetic ADDED first),
  ``timeoutSeconds``, ``sendInitialEvents`` + bookmarks, 410 Gone when the history is too old.
- ``meta.k8s.io/v1`` Table output (CRD ``additionalPrinterColumns``; familiar columns for
  built-ins), also on watches (``kubectl get -w``), and PartialObjectMetadata(List).
- CRDs: registration in discovery (short names, categories, subresources), structural schema
  pruning/defaulting/validation and CEL rules (see :mod:`.schema`), ``fieldValidation=Strict``
  rejects unknown fields with 400 like the apiserver.
- finalizers (deletionTimestamp first, removal once the list is empty), background cascade deletion
  by ownerReferences (``propagationPolicy: Orphan`` orphans instead; ``Foreground`` is treated as
  background), namespace deletion removes its contents.
- a few built-in validations that catch builder bugs: metadata.name format, ownerReferences need
  apiVersion/kind/name/uid, Job restartPolicy (and ``Never`` with podFailurePolicy), containers
  need name and image, a Job's pod template / podFailurePolicy / completionMode are immutable.
- discovery (``/api``, ``/apis``, per group/version; legacy JSON: aggregated discovery requests are
  answered with the legacy documents, which clients accept), ``/version``, ``/healthz``,
  ``/livez``, ``/readyz``, and ``/openapi/v3`` (index + per group/version documents declaring each
  resource's PATCH operation with ``fieldValidation``, so client-side ``kubectl apply`` validates
  on the server; ``/openapi/v2`` answers 404, which kubectl tolerates).
- pod logs (``pods/<name>/log``, ``follow``, ``tailLines``) from files registered by the kubelet.
- RBAC: the default kubeconfig user is a cluster admin; requests that impersonate
  (``kubectl --as=...``) or carry a ServiceAccount token (``write_kubeconfig(...,
  service_account=(ns, name))``; the kubelet gives each pod one for its ``serviceAccountName``)
  are authorized against the stored Roles/ClusterRoles and bindings (403 Forbidden with the
  apiserver's message otherwise); (Self|Local)SubjectAccessReviews are answered
  (``kubectl auth can-i VERB RES --as=system:serviceaccount:NS:SA``); in-process:
  :meth:`ApiEmulator.authorize`. Discovery, ``/version`` and ``/openapi`` are open to everyone.
- protobuf request bodies only for what kubectl's typed clients send in common commands
  (``kubectl create namespace|configmap|secret|serviceaccount``, ``auth can-i``); others get 415.

Other in-process helpers: :meth:`ApiEmulator.call` (run a function on the server loop),
:meth:`~ApiEmulator.subscribe`/``unsubscribe`` (a queue of ``(rv, type, obj, old)`` changes, loop
thread only), :meth:`~ApiEmulator.register_pod_log`, :meth:`~ApiEmulator.add_stop_hook`,
:meth:`~ApiEmulator.resource_for`.

kubectl tip: kubectl caches discovery per server address for hours (``~/.kube/cache``); emulators
reuse ports, so pass ``--cache-dir=<fresh dir>`` (the test fixture does).

Not emulated: real authentication (any other token is the admin), aggregated ClusterRoles,
admission webhooks, quotas, conversion between CRD versions (all served versions
share one storage), managedFields and SSA conflicts, protobuf responses,
``limit``/``continue`` pagination (lists are always complete), scale subresources, graceful pod
deletion (pods disappear at once; the kubelet then terminates the process), namespace deletion
waiting for finalizers of its contents, ``events.k8s.io/v1`` and ``v1`` events sharing storage.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime as dt
import hashlib
import json
import logging
import re
import secrets
import string
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import kmock
import yaml

from . import patching, protobuf, schema, table

__all__ = ["ApiEmulator", "ApiError", "ResourceType"]

log = logging.getLogger(__name__)
T = TypeVar("T")

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
HISTORY = 50_000  # watch events kept for resourceVersion-based resumption
SA_TOKEN_PREFIX = "sandbox-sa:"  # bearer "sandbox-sa:<ns>:<name>" = that ServiceAccount


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """An API failure rendered as a ``metav1.Status``."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    @property
    def status(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            st["details"] = self.details
        return st


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    subresources: set[str] = field(default_factory=set)
    crd_name: str | None = None  # set for custom resources
    schema: dict[str, Any] | None = None
    printer_columns: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not self.singular:
            self.singular = self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """``configmaps`` or ``moefinetunes.npu-lora.io`` (the apiserver's error-message name)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def kind_group(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


def _builtin_types() -> list[ResourceType]:
    R = ResourceType
    return [
        R("", "v1", "namespaces", "Namespace", False, short_names=["ns"], subresources={"status"}),
        R("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
        R("", "v1", "secrets", "Secret"),
        R("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"]),
        R(
            "",
            "v1",
            "pods",
            "Pod",
            short_names=["po"],
            categories=["all"],
            subresources={"status", "log"},
        ),
        R("", "v1", "events", "Event", short_names=["ev"]),
        R("", "v1", "nodes", "Node", False, short_names=["no"], subresources={"status"}),
        R(
            "",
            "v1",
            "services",
            "Service",
            short_names=["svc"],
            categories=["all"],
            subresources={"status"},
        ),
        R(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            short_names=["pvc"],
            subresources={"status"},
        ),
        R("batch", "v1", "jobs", "Job", categories=["all"], subresources={"status"}),
        R(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            short_names=["deploy"],
            categories=["all"],
            subresources={"status"},
        ),
        R("events.k8s.io", "v1", "events", "Event", short_names=["ev"]),
        R("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        R("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        R("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
        R("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
        R("coordination.k8s.io", "v1", "leases", "Lease"),
        R("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, short_names=["pc"]),
        R(
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
            False,
        ),
        R("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False),
        R("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview"),
        R(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            short_names=["crd", "crds"],
            subresources={"status"},
        ),
    ]


# ------------------------------------------------------------------------------------- selectors

_SET_REQ = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(text: str | None) -> Callable[[dict[str, str]], bool]:
    if not text:
        return lambda labels: True
    reqs: list[Callable[[dict[str, str]], bool]] = []
    for part in _split_selector(text):
        part = part.strip()
        if "!=" in part:
            k, v = (s.strip() for s in part.split("!=", 1))
            reqs.append(lambda lb, k=k, v=v: lb.get(k) != v)
        elif "==" in part or ("=" in part and "(" not in part):
            k, v = (s.strip() for s in re.split(r"==?", part, maxsplit=1))
            reqs.append(lambda lb, k=k, v=v: lb.get(k) == v)
        else:
            m = _SET_REQ.match(part)
            if not m:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
            neg, k, op, vals = m.groups()
            values = {x.strip() for x in (vals or "").split(",") if x.strip()}
            if op == "in":
                reqs.append(lambda lb, k=k, vs=values: lb.get(k) in vs)
            elif op == "notin":
                reqs.append(lambda lb, k=k, vs=values: lb.get(k) not in vs)
            elif neg:
                reqs.append(lambda lb, k=k: k not in lb)
            else:
                reqs.append(lambda lb, k=k: k in lb)
    return lambda labels: all(r(labels) for r in reqs)


def _dotted(obj: Any, path: str) -> str:
    node = obj
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


def parse_field_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    if not text:
        return lambda obj: True
    reqs: list[Callable[[dict[str, Any]], bool]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(lambda o, k=k.strip(), v=v.strip(): _dotted(o, k) != v)
        else:
            k, v = re.split(r"==?", part, maxsplit=1)
            reqs.append(lambda o, k=k.strip(), v=v.strip(): _dotted(o, k) == v)
    return lambda obj: all(r(obj) for r in reqs)


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")


# ------------------------------------------------------------------------------------- emulator


@dataclass
class _Watcher:
    storage_key: tuple[str, str] | None  # None: everything (internal subscribers)
    queue: asyncio.Queue[tuple[int, str, dict[str, Any], dict[str, Any] | None]]


@dataclass
class _ParsedPath:
    group: str
    version: str
    rtype: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch_prefix: bool = False


class ApiEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    """The API server. See the module docstring for the API and behaviour."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__()
        self._host = host
        self._want_port = port
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._store: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = (
            collections.defaultdict(dict)
        )
        self._rv = 0
        self._history: collections.deque[
            tuple[int, tuple[str, str], str, dict[str, Any], dict[str, Any] | None]
        ] = collections.deque(maxlen=HISTORY)
        self._watchers: set[int] = set()
        self._watcher_objs: dict[int, _Watcher] = {}
        self._log_files: dict[tuple[str, str], Path] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._port: int | None = None
        self._tlock = threading.RLock()
        self._start_time = now_iso()
        self._stop_hooks: list[Callable[[], Any]] = []
        # server-side apply: (uid, fieldManager, subresource) -> the field paths it applied
        self._applied: dict[tuple[str, str, str], set[tuple[str, ...]]] = {}
        for rt in _builtin_types():
            self._register(rt)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._create_internal(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )

    # ----------------------------------------------------------------------------- lifecycle

    def start(self) -> ApiEmulator:
        """Start serving in a background thread; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("the emulator is already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(ready))
            except BaseException as exc:
                failure.append(exc)
                ready.set()
            finally:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="api-emulator", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise RuntimeError(f"the API emulator failed to start: {failure[0]!r}") from failure[0]
        return self

    async def _serve(self, ready: threading.Event) -> None:
        self._stop_event = asyncio.Event()
        async with self:  # kmock's handler context (its background stream feeder)
            server = aiohttp.web.Server(self, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, self._host, self._want_port)
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []
            self._port = sockets[0].getsockname()[1]
            ready.set()
            try:
                await self._stop_event.wait()
            finally:
                for hook in list(self._stop_hooks):
                    with contextlib.suppress(Exception):
                        await hook()
                for w in list(self._watcher_objs.values()):
                    w.queue.put_nowait((-1, "STOP", {}, None))
                await runner.cleanup()

    def stop(self) -> None:
        """Stop serving (idempotent); open watches are closed."""
        if self._thread is None or self._loop is None:
            return
        loop, stop_event = self._loop, self._stop_event
        if stop_event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop_event.set)
        self._thread.join(15)
        self._thread = None

    def add_stop_hook(self, hook: Callable[[], Any]) -> None:
        """Run ``await hook()`` on the server loop when :meth:`stop` is called (e.g. the kubelet)."""
        self._stop_hooks.append(hook)

    def remove_stop_hook(self, hook: Callable[[], Any]) -> None:
        with contextlib.suppress(ValueError):
            self._stop_hooks.remove(hook)

    def __enter__(self) -> ApiEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the emulator is not started")
        return self._loop

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the emulator is not started")
        return self._port

    @property
    def url(self) -> str:  # type: ignore[override]
        return f"http://{self._host}:{self.port}"

    @staticmethod
    def service_account_token(namespace: str, name: str) -> str:
        """A bearer token that authenticates as ``system:serviceaccount:<namespace>:<name>``."""
        return f"{SA_TOKEN_PREFIX}{namespace}:{name}"

    def write_kubeconfig(
        self,
        path: str | Path,
        *,
        namespace: str = "default",
        service_account: tuple[str, str] | None = None,
    ) -> Path:
        """Write a kubeconfig (insecure http) for kubectl and the Python client.

        By default its user is a cluster admin; ``service_account=(namespace, name)`` makes it
        authenticate as that ServiceAccount instead, with RBAC enforced on its requests.
        """
        token = self.service_account_token(*service_account) if service_account else "sandbox"
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "sandbox", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "sandbox",
                    "context": {"cluster": "sandbox", "user": "sandbox", "namespace": namespace},
                }
            ],
            "current-context": "sandbox",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the server's loop thread (directly when already there) and return its result."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._in_loop_thread():
            with self._tlock:
                return fn(*args, **kwargs)
        fut: asyncio.Future[T] | Any = asyncio.run_coroutine_threadsafe(
            self._acall(fn, *args, **kwargs), loop
        )
        return fut.result(30)  # type: ignore[no-any-return]

    async def _acall(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._tlock:
            return fn(*args, **kwargs)

    def _in_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return threading.current_thread() is self._thread

    # ----------------------------------------------------------------------------- public API

    def resource_for(self, api_version: str, kind_or_plural: str) -> ResourceType:
        """Resolve ``("batch/v1", "Job")`` or ``("batch/v1", "jobs")`` to a :class:`ResourceType`."""
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if (
                rt.group == group
                and rt.version == version
                and kind_or_plural in (rt.kind, rt.plural)
            ):
                return rt
        raise ApiError(
            404,
            "NotFound",
            f"the server could not find the requested resource ({api_version} {kind_or_plural})",
        )

    def load_crd(self, crd: dict[str, Any]) -> dict[str, Any]:
        """Create (or replace) a CustomResourceDefinition; its resources are served at once."""

        def op() -> dict[str, Any]:
            rt = self.resource_for("apiextensions.k8s.io/v1", "customresourcedefinitions")
            name = crd.get("metadata", {}).get("name", "")
            existing = self._store[rt.storage_key].get(("", name))
            if existing is None:
                return self._create(rt, None, crd)
            body = copy.deepcopy(crd)
            body.setdefault("metadata", {})["resourceVersion"] = existing["metadata"][
                "resourceVersion"
            ]
            return self._update(rt, None, name, body)

        return self.call(op)

    def create(
        self, obj: dict[str, Any], *, namespace: str | None = None, keep_status: bool = False
    ) -> dict[str, Any]:
        """Create ``obj`` (resource from apiVersion/kind); ``keep_status`` keeps a given status."""

        def op() -> dict[str, Any]:
            rt = self.resource_for(obj["apiVersion"], obj["kind"])
            ns = (
                namespace
                or obj.get("metadata", {}).get("namespace")
                or ("default" if rt.namespaced else None)
            )
            return self._create(rt, ns, obj, keep_status=keep_status)

        return self.call(op)

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        def op() -> dict[str, Any] | None:
            rt = self.resource_for(api_version, kind)
            obj = self._store[rt.storage_key].get(self._key(rt, _ns(rt, namespace), name))
            return self._out(rt, obj) if obj is not None else None

        return self.call(op)

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        def op() -> list[dict[str, Any]]:
            rt = self.resource_for(api_version, kind)
            return [
                self._out(rt, o)
                for o in self._select(rt, namespace, label_selector, field_selector)
            ]

        return self.call(op)

    def update(self, obj: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        def op() -> dict[str, Any]:
            rt = self.resource_for(obj["apiVersion"], obj["kind"])
            meta = obj.get("metadata", {})
            return self._update(rt, _ns(rt, meta.get("namespace")), meta["name"], obj, subresource)

        return self.call(op)

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: str = "merge",
        field_manager: str | None = None,
    ) -> dict[str, Any]:
        """``patch_type``: ``merge``, ``json``, ``strategic`` or ``apply`` (server-side apply,
        with ``field_manager``)."""

        def op() -> dict[str, Any]:
            rt = self.resource_for(api_version, kind)
            return self._patch(
                rt,
                _ns(rt, namespace),
                name,
                patch,
                patch_type,
                subresource,
                field_manager=field_manager,
            )

        return self.call(op)

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
    ) -> dict[str, Any] | None:
        def op() -> dict[str, Any] | None:
            rt = self.resource_for(api_version, kind)
            try:
                return self._delete(rt, _ns(rt, namespace), name, propagation=propagation)
            except ApiError as exc:
                if exc.code == 404:
                    return None
                raise

        return self.call(op)

    def register_pod_log(self, namespace: str, name: str, path: Path) -> None:
        """Serve ``path`` as the log of pod ``namespace/name`` (``kubectl logs``)."""
        self._log_files[(namespace, name)] = Path(path)

    def subscribe(
        self, storage_keys: Iterable[tuple[str, str]] | None = None
    ) -> asyncio.Queue[Any]:
        """(Loop thread only.) A queue receiving ``(rv, type, obj, old)`` for every change."""
        q: asyncio.Queue[Any] = asyncio.Queue()
        keys = list(storage_keys) if storage_keys is not None else [None]
        for key in keys:
            w = _Watcher(key, q)
            self._watcher_objs[id(w)] = w
        return q

    def unsubscribe(self, q: asyncio.Queue[Any]) -> None:
        for wid, w in list(self._watcher_objs.items()):
            if w.queue is q:
                del self._watcher_objs[wid]

    @property
    def resource_version(self) -> int:
        return self._rv

    # ----------------------------------------------------------------------------- registry

    def _register(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt
        with contextlib.suppress(Exception):  # keep kmock's own view of the resources in sync
            self.resources[f"{rt.group}/{rt.version}/{rt.plural}"] = kmock.ResourceInfo(
                kind=rt.kind,
                singular=rt.singular,
                namespaced=rt.namespaced,
                verbs=set(VERBS),
                shortnames=set(rt.short_names),
                categories=set(rt.categories),
                subresources=set(rt.subresources),
            )

    def _unregister_crd(self, crd_name: str) -> None:
        for key, rt in list(self._types.items()):
            if rt.crd_name == crd_name:
                del self._types[key]
                with contextlib.suppress(Exception):
                    del self.resources[f"{rt.group}/{rt.version}/{rt.plural}"]

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        name = crd["metadata"]["name"]
        self._unregister_crd(name)
        for ver in spec.get("versions") or []:
            if not ver.get("served", True):
                continue
            subs = set((ver.get("subresources") or {}).keys())
            self._register(
                ResourceType(
                    group=spec.get("group", ""),
                    version=ver["name"],
                    plural=names.get("plural", ""),
                    kind=names.get("kind", ""),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    singular=names.get("singular") or names.get("kind", "").lower(),
                    short_names=list(names.get("shortNames") or []),
                    categories=list(names.get("categories") or []),
                    subresources=subs,
                    crd_name=name,
                    schema=(ver.get("schema") or {}).get("openAPIV3Schema")
                    or {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    printer_columns=ver.get("additionalPrinterColumns"),
                )
            )

    # ----------------------------------------------------------------------------- store core

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(
        self, rt: ResourceType, etype: str, obj: dict[str, Any], old: dict[str, Any] | None = None
    ) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._history.append((rv, rt.storage_key, etype, obj, old))
        for w in list(self._watcher_objs.values()):
            if w.storage_key is None or w.storage_key == rt.storage_key:
                w.queue.put_nowait((rv, etype, obj, old))

    def _out(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        out["apiVersion"] = rt.api_version
        out["kind"] = rt.kind
        return out

    def _select(
        self,
        rt: ResourceType,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        lsel = parse_label_selector(label_selector)
        fsel = parse_field_selector(field_selector)
        out = []
        for (ns, _name), obj in sorted(self._store[rt.storage_key].items()):
            if namespace and rt.namespaced and ns != namespace:
                continue
            if lsel(obj["metadata"].get("labels") or {}) and fsel(obj):
                out.append(obj)
        return out

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str]:
        return ((namespace or "") if rt.namespaced else "", name)

    def _not_found(self, rt: ResourceType, name: str) -> ApiError:
        return ApiError(
            404,
            "NotFound",
            f'{rt.qualified} "{name}" not found',
            {"name": name, "group": rt.group, "kind": rt.plural},
        )

    def _invalid(self, rt: ResourceType, name: str, causes: list[schema.Cause]) -> ApiError:
        return ApiError(
            422,
            "Invalid",
            schema.invalid_message(rt.kind_group, name, causes),
            {
                "name": name,
                "group": rt.group,
                "kind": rt.kind,
                "causes": [c.as_status_cause() for c in causes],
            },
        )

    def _create_internal(self, obj: dict[str, Any]) -> dict[str, Any]:
        rt = self.resource_for(obj["apiVersion"], obj["kind"])
        return self._create(rt, obj.get("metadata", {}).get("namespace"), obj)

    def _create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        keep_status: bool = False,
        field_validation: str | None = None,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            ns = namespace or body_ns or ""
            if not ns:
                raise ApiError(400, "BadRequest", "the namespace of the object must be set")
            meta["namespace"] = ns
            if not self._store[("", "namespaces")].get(("", ns)):
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{ns}" not found',
                    {"name": ns, "kind": "namespaces"},
                )
        else:
            meta.pop("namespace", None)
            ns = ""
        if not meta.get("name") and meta.get("generateName"):
            for _ in range(20):
                candidate = meta["generateName"] + "".join(
                    secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5)
                )
                if (ns, candidate) not in self._store[rt.storage_key]:
                    meta["name"] = candidate
                    break
        name = meta.get("name") or ""
        causes: list[schema.Cause] = []
        if not name:
            causes.append(
                schema.Cause(
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            )
        elif (
            not (DNS_LABEL if rt.kind in ("Namespace", "Job") else DNS_SUBDOMAIN).match(name)
            or len(name) > 253
        ):
            causes.append(
                schema._invalid(
                    "metadata.name",
                    name,
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                )
            )
        if causes:
            raise self._invalid(rt, name, causes)
        if (ns, name) in self._store[rt.storage_key]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rt.qualified} "{name}" already exists',
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        for k in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "selfLink",
        ):
            meta.pop(k, None)
        if rt.has_status and not keep_status:
            obj.pop("status", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        self._default_builtin(rt, obj, None)
        self._check_meta(rt, obj)
        self._check_workload(rt, obj)
        self._check_custom(rt, obj, None, field_validation, warnings)
        meta["generation"] = 1
        if dry_run:
            meta["resourceVersion"] = str(self._rv)
            return self._out(rt, obj)
        meta["resourceVersion"] = self._next_rv()
        self._store[rt.storage_key][(ns, name)] = obj
        self._emit(rt, "ADDED", obj)
        self._after_write(rt, obj, None)
        return self._out(rt, obj)

    def _default_builtin(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        meta = obj["metadata"]
        if rt.kind == "Namespace" and rt.group == "":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj.setdefault("status", {}).setdefault("phase", "Active")
        elif rt.kind == "Job" and rt.group == "batch" and old is None:
            spec = obj.setdefault("spec", {})
            uid = meta["uid"]
            if not spec.get("manualSelector"):
                spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            tmpl_meta = spec.setdefault("template", {}).setdefault("metadata", {})
            labels = tmpl_meta.setdefault("labels", {})
            labels.update(
                {
                    "batch.kubernetes.io/controller-uid": uid,
                    "batch.kubernetes.io/job-name": meta["name"],
                    "controller-uid": uid,
                    "job-name": meta["name"],
                }
            )
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", 1)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
            self._default_pod_spec(spec["template"].setdefault("spec", {}))
            obj.setdefault("status", {})
        elif rt.kind == "Pod" and rt.group == "" and old is None:
            self._default_pod_spec(obj.setdefault("spec", {}))
            status = obj.setdefault("status", {})
            status.setdefault("phase", "Pending")
            status.setdefault("qosClass", "BestEffort")
        elif rt.kind == "CustomResourceDefinition":
            spec = obj.get("spec") or {}
            names = dict(spec.get("names") or {})
            names.setdefault("singular", str(names.get("kind", "")).lower())
            names.setdefault("listKind", f"{names.get('kind', '')}List")
            kept = (obj.get("status") or {}).get("conditions")
            obj["status"] = {
                "acceptedNames": names,
                "conditions": [
                    {
                        "type": "NamesAccepted",
                        "status": "True",
                        "reason": "NoConflicts",
                        "message": "no conflicts found",
                        "lastTransitionTime": now_iso(),
                    },
                    {
                        "type": "Established",
                        "status": "True",
                        "reason": "InitialNamesAccepted",
                        "message": "the initial names have been accepted",
                        "lastTransitionTime": now_iso(),
                    },
                ],
                "storedVersions": [
                    v["name"] for v in spec.get("versions") or [] if v.get("storage")
                ],
            }
            if kept:
                obj["status"]["conditions"] = kept
        elif rt.kind == "ServiceAccount" and rt.group == "":
            pass

    @staticmethod
    def _default_pod_spec(pspec: dict[str, Any]) -> None:
        pspec.setdefault("restartPolicy", "Always")
        pspec.setdefault("terminationGracePeriodSeconds", 30)
        pspec.setdefault("dnsPolicy", "ClusterFirst")
        pspec.setdefault("schedulerName", "default-scheduler")
        pspec.setdefault("serviceAccountName", pspec.get("serviceAccount") or "default")
        for c in pspec.get("containers") or []:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            image = str(c.get("image", ""))
            c.setdefault(
                "imagePullPolicy",
                "Always" if image.endswith(":latest") or ":" not in image else "IfNotPresent",
            )

    def _check_custom(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        field_validation: str | None,
        warnings: list[str] | None,
    ) -> None:
        if rt.schema is None:
            return
        sch = rt.schema
        removed = schema.prune(obj, sch)
        if removed:
            if (field_validation or "").lower() == "strict":
                msg = ", ".join(f'unknown field "{p}"' for p in removed)
                raise ApiError(
                    400,
                    "BadRequest",
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: {msg}',
                )
            if (field_validation or "").lower() == "warn" and warnings is not None:
                warnings.extend(f'unknown field "{p}"' for p in removed)
        schema.apply_defaults(obj, sch)

        def cel_view(o: dict[str, Any]) -> dict[str, Any]:
            # Root-level CEL rules see apiVersion, kind and metadata.name/generateName only.
            view = {k: v for k, v in o.items() if k != "metadata"}
            m = o.get("metadata") or {}
            view["metadata"] = {k: m[k] for k in ("name", "generateName") if k in m}
            return view

        body = cel_view(obj)
        old_body = cel_view(old) if old else None
        causes = schema.validate(body, sch, old=old_body, has_old=old is not None)
        if causes:
            raise self._invalid(rt, obj["metadata"].get("name", ""), causes)

    def _check_meta(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """ownerReferences need apiVersion, kind, name and uid (as in the apiserver)."""
        causes = []
        for i, ref in enumerate(obj["metadata"].get("ownerReferences") or []):
            for key in ("apiVersion", "kind", "name", "uid"):
                if not (ref or {}).get(key):
                    causes.append(
                        schema.Cause(
                            f"metadata.ownerReferences[{i}].{key}",
                            "FieldValueInvalid",
                            f'Invalid value: "": {key} must not be empty',
                        )
                    )
        if causes:
            raise self._invalid(rt, obj["metadata"].get("name", ""), causes)

    def _check_workload(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """A few of the apiserver's Pod/Job validations that catch builder bugs."""
        if rt.group not in ("", "batch") or rt.kind not in ("Pod", "Job"):
            return
        causes: list[schema.Cause] = []
        if rt.kind == "Job":
            spec = obj.get("spec") or {}
            pspec = (spec.get("template") or {}).get("spec") or {}
            prefix = "spec.template.spec"
            restart = pspec.get("restartPolicy")
            if restart not in ("OnFailure", "Never"):
                causes.append(
                    schema.Cause(
                        f"{prefix}.restartPolicy",
                        "FieldValueNotSupported",
                        f'Unsupported value: {schema.format_value(restart)}: supported values: "OnFailure", "Never"',
                    )
                )
            elif spec.get("podFailurePolicy") and restart != "Never":
                causes.append(
                    schema._invalid(
                        f"{prefix}.restartPolicy",
                        restart,
                        'only "Never" is supported when podFailurePolicy is specified',
                    )
                )
        else:
            pspec = obj.get("spec") or {}
            prefix = "spec"
        containers = pspec.get("containers") or []
        if not containers:
            causes.append(
                schema.Cause(f"{prefix}.containers", "FieldValueRequired", "Required value")
            )
        for i, c in enumerate(containers):
            for key in ("name", "image"):
                if not (c or {}).get(key):
                    causes.append(
                        schema.Cause(
                            f"{prefix}.containers[{i}].{key}",
                            "FieldValueRequired",
                            "Required value",
                        )
                    )
        if causes:
            raise self._invalid(rt, obj["metadata"].get("name", ""), causes)

    def _check_job_immutables(
        self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any]
    ) -> None:
        """Like the apiserver: a Job's pod template is immutable, except the scheduling
        directives of a suspended Job that never started; podFailurePolicy/completionMode too."""
        ospec, nspec = old.get("spec") or {}, new.get("spec") or {}
        causes = []
        otmpl, ntmpl = ospec.get("template") or {}, nspec.get("template") or {}
        if otmpl != ntmpl:
            never_started = ospec.get("suspend") and not (old.get("status") or {}).get("startTime")
            mutable = ("nodeSelector", "tolerations", "affinity", "schedulingGates")

            def strip(t: dict[str, Any]) -> dict[str, Any]:
                t = copy.deepcopy(t)
                for k in mutable:
                    (t.get("spec") or {}).pop(k, None)
                for k in ("labels", "annotations"):
                    (t.get("metadata") or {}).pop(k, None)
                return t

            if not never_started or strip(otmpl) != strip(ntmpl):
                causes.append(
                    schema.Cause(
                        "spec.template",
                        "FieldValueInvalid",
                        'Invalid value: "object": field is immutable',
                    )
                )
        for key in ("podFailurePolicy", "completionMode"):
            if key in ospec and ospec.get(key) != nspec.get(key):
                causes.append(
                    schema.Cause(
                        f"spec.{key}",
                        "FieldValueInvalid",
                        f"Invalid value: {schema.format_value(nspec.get(key))}: field is immutable",
                    )
                )
        if causes:
            raise self._invalid(rt, new["metadata"]["name"], causes)

    @staticmethod
    def _spec_part(obj: dict[str, Any], has_status: bool) -> dict[str, Any]:
        drop = (
            ("metadata", "status", "apiVersion", "kind")
            if has_status
            else ("metadata", "apiVersion", "kind")
        )
        return {k: v for k, v in obj.items() if k not in drop}

    def _update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None = None,
        *,
        dry_run: bool = False,
        field_validation: str | None = None,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        key = self._key(rt, namespace, name)
        old = self._store[rt.storage_key].get(key)
        if old is None:
            raise self._not_found(rt, name)
        bmeta = body.get("metadata") or {}
        if bmeta.get("name") and bmeta["name"] != name:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        rv = bmeta.get("resourceVersion")
        if rv and str(rv) != old["metadata"]["resourceVersion"]:
            raise self._conflict(rt, name)
        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            new["metadata"] = copy.deepcopy(bmeta)
            if rt.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        return self._commit(
            rt, old, new, dry_run=dry_run, field_validation=field_validation, warnings=warnings
        )

    def _conflict(self, rt: ResourceType, name: str) -> ApiError:
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            {"name": name, "group": rt.group, "kind": rt.plural},
        )

    def _commit(
        self,
        rt: ResourceType,
        old: dict[str, Any],
        new: dict[str, Any],
        *,
        dry_run: bool = False,
        field_validation: str | None = None,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        ometa = old["metadata"]
        meta = new.setdefault("metadata", {})
        for k in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if k in ometa:
                meta[k] = ometa[k]
            else:
                meta.pop(k, None)
        meta["resourceVersion"] = ometa["resourceVersion"]
        if rt.kind == "Job" and rt.group == "batch":
            new.setdefault("spec", {})["selector"] = (old.get("spec") or {}).get("selector")
            self._check_job_immutables(rt, old, new)
        self._default_builtin(rt, new, old)
        self._check_meta(rt, new)
        self._check_custom(rt, new, old, field_validation, warnings)
        for k in ("labels", "annotations", "finalizers", "ownerReferences"):
            if k in meta and not meta[k]:
                del meta[k]
        if self._spec_part(new, rt.has_status) != self._spec_part(old, rt.has_status):
            meta["generation"] = int(ometa.get("generation", 1)) + 1
        if rt.kind == "CustomResourceDefinition":
            new["status"] = copy.deepcopy(old.get("status"))
            self._default_builtin(rt, new, None)
        comparable_old = {k: v for k, v in old.items()}
        if new == comparable_old:
            return self._out(rt, old)  # a no-op write: no new resourceVersion, no event
        if dry_run:
            return self._out(rt, new)
        meta["resourceVersion"] = self._next_rv()
        key = self._key(rt, meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._store[rt.storage_key][key]
            self._emit(rt, "DELETED", new, old)
            self._after_delete(rt, new)
            return self._out(rt, new)
        self._store[rt.storage_key][key] = new
        self._emit(rt, "MODIFIED", new, old)
        self._after_write(rt, new, old)
        return self._out(rt, new)

    def _patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        patch_type: str,
        subresource: str | None = None,
        *,
        dry_run: bool = False,
        field_validation: str | None = None,
        warnings: list[str] | None = None,
        field_manager: str | None = None,
    ) -> dict[str, Any]:
        key = self._key(rt, namespace, name)
        old = self._store[rt.storage_key].get(key)
        manager = field_manager or "unknown"
        applied_paths = _apply_paths(patch) if patch_type == "apply" else set()
        if old is None:
            if patch_type == "apply" and subresource is None:
                if isinstance(patch, dict):
                    pm = patch.get("metadata") or {}
                    if pm.get("name") and pm["name"] != name:
                        raise ApiError(
                            400,
                            "BadRequest",
                            "the name of the object does not match the name on the URL",
                        )
                    patch = copy.deepcopy(patch)
                    patch.setdefault("metadata", {})["name"] = name
                created = self._create(
                    rt,
                    namespace,
                    patch,
                    dry_run=dry_run,
                    field_validation=field_validation,
                    warnings=warnings,
                )
                if not dry_run:
                    self._applied[(created["metadata"]["uid"], manager, "")] = applied_paths
                return created
            raise self._not_found(rt, name)
        current = self._out(rt, old)
        try:
            if patch_type == "json":
                patched = patching.json_patch(current, patch)
            elif patch_type == "merge":
                patched = patching.merge_patch(current, patch)
            elif patch_type in ("strategic", "apply"):
                if patch_type == "apply" and isinstance(patch, dict):
                    patch = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}
                if rt.crd_name is not None:
                    patched = patching.merge_patch(current, patch)
                else:
                    patched = patching.strategic_merge_patch(current, patch)
                if patch_type == "apply":
                    # Server-side apply ownership (simplified: one owner per field): what this
                    # manager applied before and no longer applies is removed.
                    prev = self._applied.get(
                        (old["metadata"]["uid"], manager, subresource or ""), set()
                    )
                    for path in sorted(prev - applied_paths, key=len, reverse=True):
                        if not any(p[: len(path)] == path for p in applied_paths):
                            _remove_path(patched, path)
            else:
                raise ApiError(
                    415, "UnsupportedMediaType", f"unsupported patch type {patch_type!r}"
                )
        except patching.PatchError as exc:
            raise ApiError(
                422 if patch_type == "json" else 400,
                "Invalid" if patch_type == "json" else "BadRequest",
                str(exc),
            ) from exc
        if not isinstance(patched, dict):
            raise ApiError(400, "BadRequest", "the patch must produce an object")
        pmeta = patched.get("metadata") or {}
        if patch_type != "json":
            prv = (
                (patch.get("metadata") or {}).get("resourceVersion")
                if isinstance(patch, dict)
                else None
            )
            if prv and str(prv) != old["metadata"]["resourceVersion"]:
                raise self._conflict(rt, name)
        elif str(pmeta.get("resourceVersion", "")) not in ("", old["metadata"]["resourceVersion"]):
            raise self._conflict(rt, name)
        pmeta["resourceVersion"] = ""
        patched["metadata"] = pmeta
        if patch_type == "apply" and not dry_run:
            self._applied[(old["metadata"]["uid"], manager, subresource or "")] = applied_paths
        return self._update(
            rt,
            namespace,
            name,
            patched,
            subresource,
            dry_run=dry_run,
            field_validation=field_validation,
            warnings=warnings,
        )

    def _delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
        preconditions: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        key = self._key(rt, namespace, name)
        old = self._store[rt.storage_key].get(key)
        if old is None:
            raise self._not_found(rt, name)
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {old['metadata']['uid']}",
            )
        if (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != old["metadata"]["resourceVersion"]
        ):
            raise self._conflict(rt, name)
        if dry_run:
            return self._out(rt, old)
        if propagation == "Orphan":
            self._orphan_dependents(old["metadata"]["uid"])
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return self._out(rt, old)
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = now_iso()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._store[rt.storage_key][key] = new
            self._emit(rt, "MODIFIED", new, old)
            return self._out(rt, new)
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        del self._store[rt.storage_key][key]
        self._emit(rt, "DELETED", gone, old)
        self._after_delete(rt, gone)
        return self._out(rt, gone)

    def _orphan_dependents(self, uid: str) -> None:
        for skey, objs in list(self._store.items()):
            for obj in list(objs.values()):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    rt = self._type_for_storage(skey)
                    if rt is None:
                        continue
                    new = copy.deepcopy(obj)
                    new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                    self._commit(rt, obj, new)

    def _type_for_storage(self, skey: tuple[str, str]) -> ResourceType | None:
        for rt in self._types.values():
            if rt.storage_key == skey:
                return rt
        return None

    def _existing_uids(self) -> set[str]:
        return {o["metadata"]["uid"] for objs in self._store.values() for o in objs.values()}

    def _after_write(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        if rt.kind == "CustomResourceDefinition":
            self._register_crd(obj)
        elif rt.kind == "Namespace" and rt.group == "" and old is None:
            ns = obj["metadata"]["name"]
            sa = self.resource_for("v1", "serviceaccounts")
            if (ns, "default") not in self._store[sa.storage_key]:
                with contextlib.suppress(ApiError):
                    self._create(sa, ns, {"metadata": {"name": "default"}})

    def _after_delete(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Cascade: dependents (ownerReferences), CRD instances, namespace contents."""
        if rt.kind == "CustomResourceDefinition":
            names = (obj.get("spec") or {}).get("names") or {}
            skey = ((obj.get("spec") or {}).get("group", ""), names.get("plural", ""))
            crt = self._type_for_storage(skey)
            if crt is not None:
                for ns, name in list(self._store[skey]):
                    with contextlib.suppress(ApiError):
                        self._force_delete(crt, ns, name)
            self._unregister_crd(obj["metadata"]["name"])
        if rt.kind == "Namespace" and rt.group == "":
            ns = obj["metadata"]["name"]
            for skey, objs in list(self._store.items()):
                nrt = self._type_for_storage(skey)
                if nrt is None or not nrt.namespaced:
                    continue
                for ons, oname in list(objs):
                    if ons == ns:
                        with contextlib.suppress(ApiError):
                            self._force_delete(nrt, ons, oname)
        self._collect_garbage(obj["metadata"]["uid"])

    def _force_delete(self, rt: ResourceType, ns: str, name: str) -> None:
        key = (ns, name)
        obj = self._store[rt.storage_key].get(key)
        if obj is None:
            return
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        del self._store[rt.storage_key][key]
        self._emit(rt, "DELETED", gone, obj)
        self._collect_garbage(gone["metadata"]["uid"])

    def _collect_garbage(self, owner_uid: str) -> None:
        """Background deletion of the dependents of a deleted owner (transitively)."""
        existing = None
        for skey, objs in list(self._store.items()):
            rt = self._type_for_storage(skey)
            if rt is None:
                continue
            for (ns, name), obj in list(objs.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == owner_uid for r in refs):
                    continue
                if existing is None:
                    existing = self._existing_uids()
                others = [r for r in refs if r.get("uid") != owner_uid and r.get("uid") in existing]
                if others:
                    new = copy.deepcopy(obj)
                    new["metadata"]["ownerReferences"] = [
                        r for r in refs if r.get("uid") != owner_uid
                    ]
                    self._commit(rt, obj, new)
                    continue
                with contextlib.suppress(ApiError):
                    self._delete(rt, ns or None, name)

    # ----------------------------------------------------------------------------- HTTP layer

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's own request parsing fails on some core paths (e.g. /api/v1/namespaces): the
        # emulator parses the Kubernetes paths itself and never records requests.
        body = await raw.read()
        try:
            return await self._dispatch(raw, body)
        except ApiError as exc:
            return self._json(exc.status, exc.code)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug here must not take the server down
            log.exception("emulator failure on %s %s", raw.method, raw.path)
            return self._json(
                ApiError(500, "InternalError", f"emulator failure: {exc!r}").status, 500
            )

    @staticmethod
    def _json(
        body: Any, status: int = 200, headers: dict[str, str] | None = None
    ) -> aiohttp.web.Response:
        return aiohttp.web.Response(
            body=json.dumps(body, separators=(",", ":")).encode(),
            status=status,
            content_type="application/json",
            headers=headers,
        )

    def _parse_path(self, path: str) -> _ParsedPath | None:
        parts = [p for p in path.split("/") if p]
        if not parts:
            return None
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        pp = _ParsedPath(group, version)
        if rest and rest[0] == "watch":
            pp.watch_prefix = True
            rest = rest[1:]
        if not rest:
            return pp
        if len(rest) >= 3 and rest[0] == "namespaces":
            rt = self._types.get((group, version, rest[2]))
            if rt is not None and rt.namespaced:
                pp.rtype, pp.namespace = rt, rest[1]
                pp.name = rest[3] if len(rest) > 3 else None
                pp.subresource = rest[4] if len(rest) > 4 else None
                if len(rest) > 5:
                    return None
                return pp
        pp.rtype = self._types.get((group, version, rest[0]))
        if pp.rtype is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        pp.name = rest[1] if len(rest) > 1 else None
        pp.subresource = rest[2] if len(rest) > 2 else None
        if len(rest) > 3:
            return None
        return pp

    async def _dispatch(
        self, raw: aiohttp.web.BaseRequest, body: bytes
    ) -> aiohttp.web.StreamResponse:
        path = raw.path.rstrip("/") or "/"
        method = raw.method.upper()
        q = raw.query
        if path in ("/healthz", "/livez", "/readyz"):
            return aiohttp.web.Response(text="ok")
        if path == "/version":
            return self._json(
                {
                    "major": "1",
                    "minor": "32",
                    "gitVersion": "v1.32.0-npu-lora-sandbox",
                    "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean",
                    "buildDate": self._start_time,
                    "goVersion": "go1.23.0",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }
            )
        if path == "/":
            return self._json(
                {
                    "paths": sorted(
                        {"/api", "/api/v1", "/apis", "/version", "/healthz", "/openapi/v3"}
                        | {f"/apis/{g}/{v}" for g, v in self._group_versions() if g}
                    )
                }
            )
        if path == "/api":
            return self._json(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self._host}:{self._port}"}
                    ],
                }
            )
        if path == "/apis":
            return self._json(self._api_group_list())
        if path.startswith("/openapi"):
            return self._openapi(path)
        parts = [p for p in path.split("/") if p]
        if parts[0] == "apis" and len(parts) == 2:
            for grp in self._api_group_list()["groups"]:
                if grp["name"] == parts[1]:
                    return self._json({"kind": "APIGroup", "apiVersion": "v1", **grp})
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        pp = self._parse_path(path)
        if pp is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if pp.rtype is None:
            if method != "GET":
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            return self._json(self._resource_list(pp.group, pp.version))
        return await self._resource_request(raw, method, q, body, pp)

    # ----------------------------------------------------------------------------- discovery

    def _group_versions(self) -> list[tuple[str, str]]:
        seen: dict[tuple[str, str], None] = {}
        for rt in self._types.values():
            seen[(rt.group, rt.version)] = None
        return list(seen)

    def _api_group_list(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for g, v in self._group_versions():
            if g:
                groups.setdefault(g, [])
                if v not in groups[g]:
                    groups[g].append(v)
        out = []
        for g, versions in groups.items():
            versions = sorted(versions, key=_version_priority)
            out.append(
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in versions],
                    "preferredVersion": {
                        "groupVersion": f"{g}/{versions[0]}",
                        "version": versions[0],
                    },
                }
            )
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = []
        found = False
        for rt in self._types.values():
            if rt.group != group or rt.version != version:
                continue
            found = True
            entry: dict[str, Any] = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": VERBS,
                "storageVersionHash": hashlib.sha256(
                    f"{rt.group}/{rt.plural}".encode()
                ).hexdigest()[:12],
            }
            if rt.short_names:
                entry["shortNames"] = rt.short_names
            if rt.categories:
                entry["categories"] = rt.categories
            resources.append(entry)
            for sub in sorted(rt.subresources):
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind if sub != "log" else "Pod",
                        "verbs": ["get", "patch", "update"] if sub != "log" else ["get"],
                    }
                )
        if not found:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    def _openapi(self, path: str) -> aiohttp.web.Response:
        if path == "/openapi/v3":
            paths = {}
            for g, v in self._group_versions():
                key = f"apis/{g}/{v}" if g else f"api/{v}"
                doc = self._openapi_gv(g, v)
                digest = (
                    hashlib.sha256(json.dumps(doc, sort_keys=True).encode())
                    .hexdigest()[:32]
                    .upper()
                )
                paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
            return self._json({"paths": paths})
        m = re.match(r"^/openapi/v3/(?:api/([^/]+)|apis/([^/]+)/([^/]+))$", path)
        if m:
            if m.group(1):
                g, v = "", m.group(1)
            else:
                g, v = m.group(2), m.group(3)
            if (g, v) not in self._group_versions():
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._json(self._openapi_gv(g, v))
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _openapi_gv(self, group: str, version: str) -> dict[str, Any]:
        paths: dict[str, Any] = {}
        schemas: dict[str, Any] = {}
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        rev_group = ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"
        for rt in self._types.values():
            if rt.group != group or rt.version != version:
                continue
            gvk = {"group": group, "version": version, "kind": rt.kind}
            schema_name = f"{rev_group}.{version}.{rt.kind}"
            body_schema = (
                copy.deepcopy(rt.schema)
                if rt.schema
                else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            )
            body_schema["x-kubernetes-group-version-kind"] = [gvk]
            schemas[schema_name] = body_schema
            ref = {"$ref": f"#/components/schemas/{schema_name}"}
            content = {"application/json": {"schema": ref}}
            params = [
                {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            ]
            patch_content = {
                t: {"schema": {"type": "object"}}
                for t in (
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                )
            }
            base = (
                f"{prefix}/namespaces/{{namespace}}/{rt.plural}"
                if rt.namespaced
                else f"{prefix}/{rt.plural}"
            )

            def op(
                action: str,
                with_body: bool,
                patch: bool = False,
                gvk: dict[str, str] = gvk,
                params: list[dict[str, Any]] = params,
                content: dict[str, Any] = content,
                patch_content: dict[str, Any] = patch_content,
            ) -> dict[str, Any]:
                o: dict[str, Any] = {
                    "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": params if with_body else [],
                    "responses": {"200": {"description": "OK", "content": content}},
                }
                if with_body:
                    o["requestBody"] = {"content": patch_content if patch else content}
                return o

            paths[base] = {"get": op("list", False), "post": op("post", True)}
            paths[f"{base}/{{name}}"] = {
                "get": op("get", False),
                "put": op("put", True),
                "patch": op("patch", True, True),
                "delete": op("delete", False),
            }
            if rt.has_status:
                paths[f"{base}/{{name}}/status"] = {
                    "get": op("get", False),
                    "put": op("put", True),
                    "patch": op("patch", True, True),
                }
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (npu-lora sandbox)", "version": "v1.32.0"},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    # ----------------------------------------------------------------------------- resources

    async def _resource_request(
        self, raw: aiohttp.web.BaseRequest, method: str, q: Any, body: bytes, pp: _ParsedPath
    ) -> aiohttp.web.StreamResponse:
        rt = pp.rtype
        assert rt is not None
        identity = self._identity(raw)
        if identity is not None and rt.group != "authorization.k8s.io":
            self._enforce(identity, rt, method, q, pp)
        accept = raw.headers.get("Accept", "")
        dry_run = q.get("dryRun") == "All"
        field_validation = q.get("fieldValidation")
        warnings: list[str] = []
        if pp.subresource is not None and pp.subresource not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if pp.name is None:
            if method == "GET":
                if pp.watch_prefix or _truthy(q.get("watch")):
                    return await self._serve_watch(raw, rt, pp.namespace, q, accept)
                objs = self._select(
                    rt, pp.namespace, q.get("labelSelector"), q.get("fieldSelector")
                )
                return self._render_list(rt, objs, accept, q)
            if method == "POST" and rt.group == "authorization.k8s.io":
                return self._json(
                    self._access_review(rt, pp.namespace, self._decode(raw, body), raw), 201
                )
            if method == "POST":
                data = self._decode(raw, body)
                obj = self._create(
                    rt,
                    pp.namespace,
                    data,
                    dry_run=dry_run,
                    field_validation=field_validation,
                    warnings=warnings,
                )
                return self._json(obj, 201, self._warning_headers(warnings))
            if method == "DELETE":
                objs = self._select(
                    rt, pp.namespace, q.get("labelSelector"), q.get("fieldSelector")
                )
                deleted = []
                for obj in list(objs):
                    with contextlib.suppress(ApiError):
                        deleted.append(
                            self._delete(
                                rt,
                                obj["metadata"].get("namespace"),
                                obj["metadata"]["name"],
                                dry_run=dry_run,
                            )
                        )
                return self._json(self._list_body(rt, deleted))
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        if pp.subresource == "log":
            return await self._serve_log(raw, pp.namespace or "", pp.name, q)
        if method == "GET":
            if _truthy(q.get("watch")) or pp.watch_prefix:
                return await self._serve_watch(
                    raw,
                    rt,
                    pp.namespace,
                    {**q, "fieldSelector": f"metadata.name={pp.name}"},
                    accept,
                )
            obj = self._store[rt.storage_key].get(self._key(rt, pp.namespace, pp.name))
            if obj is None:
                raise self._not_found(rt, pp.name)
            if "as=Table" in accept:
                return self._json(self._table(rt, [obj], q))
            if "as=PartialObjectMetadata" in accept:
                return self._json(
                    {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj["metadata"],
                    }
                )
            return self._json(self._out(rt, obj))
        if method == "PUT":
            data = self._decode(raw, body)
            obj = self._update(
                rt,
                pp.namespace,
                pp.name,
                data,
                pp.subresource,
                dry_run=dry_run,
                field_validation=field_validation,
                warnings=warnings,
            )
            return self._json(obj, 200, self._warning_headers(warnings))
        if method == "PATCH":
            ctype = (raw.headers.get("Content-Type") or "").split(";")[0].strip()
            patch_type = {
                "application/merge-patch+json": "merge",
                "application/json-patch+json": "json",
                "application/strategic-merge-patch+json": "strategic",
                "application/apply-patch+yaml": "apply",
                "application/apply-patch+cbor": "apply",
            }.get(ctype)
            if patch_type is None:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json ("{ctype}")',
                )
            if patch_type == "apply":
                try:
                    data = yaml.safe_load(body.decode() or "{}")
                except yaml.YAMLError as exc:
                    raise ApiError(400, "BadRequest", f"error decoding YAML: {exc}") from exc
            else:
                data = self._decode(raw, body)
            existed = self._key(rt, pp.namespace, pp.name) in self._store[rt.storage_key]
            obj = self._patch(
                rt,
                pp.namespace,
                pp.name,
                data,
                patch_type,
                pp.subresource,
                dry_run=dry_run,
                field_validation=field_validation,
                warnings=warnings,
                field_manager=q.get("fieldManager"),
            )
            return self._json(obj, 200 if existed else 201, self._warning_headers(warnings))
        if method == "DELETE":
            opts: dict[str, Any] = {}
            if body.strip():
                with contextlib.suppress(ValueError):
                    opts = json.loads(body) or {}
            propagation = q.get("propagationPolicy") or opts.get("propagationPolicy")
            if opts.get("orphanDependents") is True:
                propagation = "Orphan"
            obj = self._delete(
                rt,
                pp.namespace,
                pp.name,
                propagation=propagation,
                preconditions=opts.get("preconditions"),
                dry_run=dry_run or "All" in (opts.get("dryRun") or []),
            )
            return self._json(obj)
        raise ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )

    # ----------------------------------------------------------------------------- RBAC reviews

    @staticmethod
    def _identity(raw: aiohttp.web.BaseRequest) -> tuple[str, list[str]] | None:
        """``None`` for the sandbox admin; else ``(user, groups)`` whose requests RBAC checks:
        impersonation headers (``kubectl --as``) or a ServiceAccount token (see
        :meth:`service_account_token`)."""
        user = raw.headers.get("Impersonate-User")
        if user:
            return user, list(raw.headers.getall("Impersonate-Group", []))
        auth = raw.headers.get("Authorization", "")
        if auth.startswith(f"Bearer {SA_TOKEN_PREFIX}"):
            ns, _, name = auth[len("Bearer ") + len(SA_TOKEN_PREFIX) :].partition(":")
            return f"system:serviceaccount:{ns}:{name}", []
        return None

    def _enforce(
        self,
        identity: tuple[str, list[str]],
        rt: ResourceType,
        method: str,
        q: Any,
        pp: _ParsedPath,
    ) -> None:
        if method == "GET":
            watching = pp.watch_prefix or _truthy(q.get("watch"))
            verb = "watch" if watching else ("get" if pp.name else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
            if method == "DELETE":
                verb = "delete" if pp.name else "deletecollection"
        attrs = {
            "verb": verb,
            "group": rt.group,
            "resource": rt.plural,
            "subresource": pp.subresource or "",
            "name": pp.name or "",
            "namespace": pp.namespace or "",
        }
        user, groups = identity
        allowed, _ = self.authorize(user, groups, attrs)
        if allowed:
            return
        res = f"{rt.plural}/{pp.subresource}" if pp.subresource else rt.plural
        where = f' in the namespace "{pp.namespace}"' if pp.namespace else " at the cluster scope"
        subject = f'{rt.qualified} "{pp.name}"' if pp.name else rt.qualified
        raise ApiError(
            403,
            "Forbidden",
            f'{subject} is forbidden: User "{user}" cannot {verb} resource "{res}" '
            f'in API group "{rt.group}"{where}',
            {"name": pp.name or "", "group": rt.group, "kind": rt.plural},
        )

    def _access_review(
        self, rt: ResourceType, namespace: str | None, body: Any, raw: aiohttp.web.BaseRequest
    ) -> dict[str, Any]:
        """Answer a (Self|Local)SubjectAccessReview by evaluating the stored RBAC objects."""
        review = copy.deepcopy(body) if isinstance(body, dict) else {}
        spec = review.setdefault("spec", {})
        if rt.kind == "SelfSubjectAccessReview":
            identity = self._identity(raw)
            user, groups = identity if identity is not None else (None, [])
        else:
            user, groups = spec.get("user"), list(spec.get("groups") or [])
        attrs = dict(spec.get("resourceAttributes") or {})
        if rt.kind == "LocalSubjectAccessReview":
            attrs["namespace"] = namespace
        non_resource = spec.get("nonResourceAttributes")
        if user is None:
            allowed, reason = True, "the sandbox user is a cluster admin"
        else:
            allowed, reason = self.authorize(user, groups, attrs, non_resource)
        review["apiVersion"] = rt.api_version
        review["kind"] = rt.kind
        review.setdefault("metadata", {})["creationTimestamp"] = None
        review["status"] = {"allowed": allowed, **({"reason": reason} if reason else {})}
        return review

    def authorize(
        self,
        user: str,
        groups: list[str],
        attrs: dict[str, Any],
        non_resource: dict[str, Any] | None = None,
    ) -> tuple[bool, str]:
        """RBAC evaluation of ``user``/``groups`` against the stored (Cluster)Role(Binding)s.

        ``attrs`` are SubjectAccessReview ``resourceAttributes`` (verb, group, resource,
        subresource, name, namespace). Returns ``(allowed, reason)``.
        """
        groups = [*groups, "system:authenticated"]
        if user.startswith("system:serviceaccount:"):
            sa_ns = user.split(":")[2]
            groups += ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}"]

        def subject_matches(subj: dict[str, Any], binding_ns: str) -> bool:
            kind = subj.get("kind")
            if kind == "ServiceAccount":
                sns = subj.get("namespace") or binding_ns
                return user == f"system:serviceaccount:{sns}:{subj.get('name')}"
            if kind == "User":
                return subj.get("name") == user
            if kind == "Group":
                return subj.get("name") in groups
            return False

        def rule_matches(rule: dict[str, Any]) -> bool:
            verb = attrs.get("verb", "")
            if non_resource is not None:
                urls = rule.get("nonResourceURLs") or []
                path = non_resource.get("path", "")
                return (
                    non_resource.get("verb") in rule.get("verbs", [])
                    or "*" in rule.get("verbs", [])
                ) and any(
                    u == path or u == "*" or (u.endswith("*") and path.startswith(u[:-1]))
                    for u in urls
                )
            if verb not in rule.get("verbs", []) and "*" not in rule.get("verbs", []):
                return False
            if attrs.get("group", "") not in rule.get("apiGroups", []) and "*" not in rule.get(
                "apiGroups", []
            ):
                return False
            res = attrs.get("resource", "")
            sub = attrs.get("subresource", "")
            full = f"{res}/{sub}" if sub else res
            resources = rule.get("resources", [])
            if not (full in resources or "*" in resources or (sub and f"*/{sub}" in resources)):
                return False
            names = rule.get("resourceNames") or []
            return not names or attrs.get("name", "") in names

        def role_rules(ref: dict[str, Any], ns: str) -> list[dict[str, Any]]:
            if ref.get("kind") == "ClusterRole":
                role = self._store[("rbac.authorization.k8s.io", "clusterroles")].get(
                    ("", ref.get("name", ""))
                )
            else:
                role = self._store[("rbac.authorization.k8s.io", "roles")].get(
                    (ns, ref.get("name", ""))
                )
            return list((role or {}).get("rules") or [])

        for (_, name), crb in self._store[
            ("rbac.authorization.k8s.io", "clusterrolebindings")
        ].items():
            if not any(subject_matches(s, "") for s in crb.get("subjects") or []):
                continue
            if any(rule_matches(r) for r in role_rules(crb.get("roleRef") or {}, "")):
                return True, f'RBAC: allowed by ClusterRoleBinding "{name}"'
        ns = attrs.get("namespace") or ""
        if ns and non_resource is None:
            for (bns, name), rb in self._store[
                ("rbac.authorization.k8s.io", "rolebindings")
            ].items():
                if bns != ns or not any(subject_matches(s, bns) for s in rb.get("subjects") or []):
                    continue
                if any(rule_matches(r) for r in role_rules(rb.get("roleRef") or {}, bns)):
                    return True, f'RBAC: allowed by RoleBinding "{name}/{bns}"'
        return False, ""

    @staticmethod
    def _warning_headers(warnings: list[str]) -> dict[str, str] | None:
        if not warnings:
            return None
        return {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)}

    @staticmethod
    def _decode(raw: aiohttp.web.BaseRequest, body: bytes) -> Any:
        if "protobuf" in (raw.headers.get("Content-Type") or ""):
            try:
                return protobuf.decode(body)
            except (protobuf.Unsupported, IndexError, UnicodeDecodeError) as exc:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the sandbox API emulator cannot decode this protobuf body ({exc}); use JSON (kubectl apply)",
                ) from exc
        try:
            return json.loads(body or b"null")
        except ValueError:
            try:
                return yaml.safe_load(body.decode())
            except (yaml.YAMLError, UnicodeDecodeError) as exc:
                raise ApiError(
                    400, "BadRequest", f"the body of the request was in an unknown format: {exc}"
                ) from exc

    def _list_body(self, rt: ResourceType, objs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": [self._out(rt, o) for o in objs],
        }

    def _render_list(
        self, rt: ResourceType, objs: list[dict[str, Any]], accept: str, q: Any
    ) -> aiohttp.web.Response:
        if "as=Table" in accept:
            return self._json(self._table(rt, objs, q))
        if "as=PartialObjectMetadataList" in accept:
            return self._json(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": [
                        {
                            "kind": "PartialObjectMetadata",
                            "apiVersion": "meta.k8s.io/v1",
                            "metadata": o["metadata"],
                        }
                        for o in objs
                    ],
                }
            )
        return self._json(self._list_body(rt, objs))

    def _table(
        self, rt: ResourceType, objs: list[dict[str, Any]], q: Any, with_columns: bool = True
    ) -> dict[str, Any]:
        return table.build_table(
            rt.kind,
            [self._out(rt, o) for o in objs],
            printer_columns=rt.printer_columns,
            is_custom=rt.crd_name is not None,
            include_object=q.get("includeObject") or "Metadata",
            resource_version=str(self._rv),
            with_columns=with_columns,
        )

    async def _serve_watch(
        self,
        raw: aiohttp.web.BaseRequest,
        rt: ResourceType,
        namespace: str | None,
        q: Any,
        accept: str,
    ) -> aiohttp.web.StreamResponse:
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(q.get("fieldSelector"))

        def matches(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            if namespace and rt.namespaced and obj["metadata"].get("namespace") != namespace:
                return False
            return lsel(obj["metadata"].get("labels") or {}) and fsel(obj)

        as_table = "as=Table" in accept
        rv_param = q.get("resourceVersion") or ""
        send_initial = _truthy(q.get("sendInitialEvents"))
        initial: list[tuple[str, dict[str, Any]]] = []
        gone = False
        if send_initial or rv_param in ("", "0"):
            initial = [("ADDED", o) for o in self._select(rt, None) if matches(o)]
        else:
            try:
                since = int(rv_param)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid resource version {rv_param!r}") from exc
            if (
                self._history
                and self._history[0][0] > since + 1
                and len(self._history) == self._history.maxlen
            ):
                gone = True
            for erv, skey, etype, obj, old in self._history:
                if erv <= since or skey != rt.storage_key:
                    continue
                ev = self._filter_event(etype, obj, old, matches)
                if ev is not None:
                    initial.append(ev)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        w = _Watcher(rt.storage_key, queue)
        self._watcher_objs[id(w)] = w
        resp = aiohttp.web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"}
        )
        resp.enable_chunked_encoding()
        first_table = [True]

        def encode(etype: str, obj: dict[str, Any]) -> bytes:
            if etype in ("BOOKMARK", "ERROR"):
                payload = obj
            elif as_table:
                payload = self._table(rt, [obj], q, with_columns=first_table[0])
                first_table[0] = False
            else:
                payload = self._out(rt, obj)
            return (
                json.dumps({"type": etype, "object": payload}, separators=(",", ":")).encode()
                + b"\n"
            )

        try:
            await resp.prepare(raw)
            if gone:
                await resp.write(
                    encode(
                        "ERROR",
                        ApiError(
                            410,
                            "Expired",
                            f"too old resource version: {rv_param} ({self._history[0][0]})",
                        ).status,
                    )
                )
                return resp
            for etype, obj in initial:
                await resp.write(encode(etype, obj))
            bookmarks = _truthy(q.get("allowWatchBookmarks"))
            if send_initial and bookmarks:
                await resp.write(
                    encode(
                        "BOOKMARK",
                        {
                            "kind": rt.kind,
                            "apiVersion": rt.api_version,
                            "metadata": {
                                "resourceVersion": str(self._rv),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    )
                )
            timeout = float(q.get("timeoutSeconds") or 0) or None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            while True:
                wait = None if deadline is None else deadline - loop.time()
                if wait is not None and wait <= 0:
                    break
                try:
                    _rv, etype, obj, old = await asyncio.wait_for(queue.get(), timeout=wait)
                except TimeoutError:
                    break
                if etype == "STOP":
                    break
                ev = self._filter_event(etype, obj, old, matches)
                if ev is not None:
                    await resp.write(encode(*ev))
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self._watcher_objs.pop(id(w), None)
        return resp

    @staticmethod
    def _filter_event(
        etype: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        matches: Callable[[dict[str, Any] | None], bool],
    ) -> tuple[str, dict[str, Any]] | None:
        if matches(obj):
            if etype == "MODIFIED" and old is not None and not matches(old):
                return ("ADDED", obj)
            return (etype, obj)
        if etype == "MODIFIED" and matches(old):
            return ("DELETED", obj)
        return None

    async def _serve_log(
        self, raw: aiohttp.web.BaseRequest, namespace: str, name: str, q: Any
    ) -> aiohttp.web.StreamResponse:
        prt = self.resource_for("v1", "pods")
        if (namespace, name) not in self._store[prt.storage_key]:
            raise self._not_found(prt, name)
        path = self._log_files.get((namespace, name))
        if path is None:
            pod = self._store[prt.storage_key][(namespace, name)]
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            cname = q.get("container") or containers[0].get("name", "")
            waiting = next(
                (
                    (cs.get("state") or {}).get("waiting") or {}
                    for cs in (pod.get("status") or {}).get("containerStatuses") or []
                ),
                {},
            )
            why = {"ImagePullBackOff": "trying and failing to pull image"}.get(
                waiting.get("reason", ""), waiting.get("reason") or "ContainerCreating"
            )
            raise ApiError(
                400, "BadRequest", f'container "{cname}" in pod "{name}" is waiting to start: {why}'
            )
        data = path.read_bytes() if path.exists() else b""
        tail = q.get("tailLines")
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(tail) :]) if int(tail) > 0 else b""
        if not _truthy(q.get("follow")):
            return aiohttp.web.Response(body=data, content_type="text/plain")
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(raw)
        await resp.write(data)
        offset = path.stat().st_size if path is not None and path.exists() else 0
        try:
            while True:
                pod = self._store[prt.storage_key].get((namespace, name))
                done = pod is None or (pod.get("status") or {}).get("phase") in (
                    "Succeeded",
                    "Failed",
                )
                path = self._log_files.get((namespace, name))
                if path is not None and path.exists():
                    with path.open("rb") as fh:
                        fh.seek(offset)
                        chunk = fh.read()
                    if chunk:
                        offset += len(chunk)
                        await resp.write(chunk)
                if done:
                    break
                await asyncio.sleep(0.2)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp


_APPLY_META_SKIP = {
    "name",
    "namespace",
    "resourceVersion",
    "uid",
    "generation",
    "creationTimestamp",
}


def _apply_paths(body: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The leaf field paths of an applied configuration (lists count as leaves)."""
    out: set[tuple[str, ...]] = set()
    if not isinstance(body, dict):
        return out
    for key, value in body.items():
        if not prefix and key in ("apiVersion", "kind"):
            continue
        if prefix == ("metadata",) and key in _APPLY_META_SKIP:
            continue
        path = (*prefix, key)
        sub = _apply_paths(value, path) if isinstance(value, dict) and value else set()
        out |= sub or {path}
    return out


def _remove_path(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _ns(rt: ResourceType, namespace: str | None) -> str | None:
    """In-process calls: namespaced resources default to the "default" namespace."""
    if not rt.namespaced:
        return None
    return namespace or "default"


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not m:
        return (3, 0, 0)
    major = int(m.group(1))
    stage = {"alpha": 2, "beta": 1, None: 0}[m.group(2)]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor)
