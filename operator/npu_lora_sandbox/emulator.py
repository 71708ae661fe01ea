"""An in-process Kubernetes API server for tests and the laptop sandbox, built on ``kmock``.

:class:`ApiEmulator` subclasses :class:`kmock.KubernetesEmulator` and replaces its request
handling with a small but faithful API server: real HTTPS (see :mod:`.tls`) on a free localhost port, against which
the real ``kubectl`` (v1.32), the ``kubernetes`` Python client and kopf work.

Usage (sync or async code alike: the server runs in its own thread with its own event loop)::

    from npu_lora_sandbox.emulator import ApiEmulator

    emu = ApiEmulator()                 # ApiEmulator(port=0, host="127.0.0.1")
    emu.start()                         # returns once the port listens
    emu.load_crd(crd_dict)              # or create the CRD through the API (kubectl apply)
    emu.write_kubeconfig(path)          # https + its CA, admin token, context namespace "default"
    emu.url                             # "https://127.0.0.1:PORT" (emu.tls.client_context())
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
- authentication and RBAC (see :mod:`.auth`): bearer tokens; the kubeconfig ``write_kubeconfig``
  writes carries the sandbox admin's random token (:attr:`ApiEmulator.admin_token`), or with
  ``service_account=(ns, name)`` that ServiceAccount's (random, stored, revoked with the
  ServiceAccount; the kubelet gives each pod its ``serviceAccountName``'s); unknown tokens get
  401; no token is ``system:anonymous`` (``/healthz``, ``/version`` only, as the default
  ``system:public-info-viewer`` binding allows; discovery needs authentication). Non-admin
  requests, and impersonation (``kubectl --as=...``, allowed to the admin and to whoever RBAC
  lets ``impersonate``), are authorized against the stored Roles/ClusterRoles and bindings (403
  Forbidden with the apiserver's message otherwise); (Self|Local)SubjectAccessReviews are
  answered (``kubectl auth can-i VERB RES --as=system:serviceaccount:NS:SA``); in-process:
  :meth:`ApiEmulator.authorize`. Every decision on a resource request of a non-admin identity
  is recorded: :meth:`ApiEmulator.authorization_log` (user, verb, group, resource,
  subresource, namespace, name, allowed).
- protobuf request bodies only for what kubectl's typed clients send in common commands
  (``kubectl create namespace|configmap|secret|serviceaccount``, ``auth can-i``); others get 415.

Other in-process helpers: :meth:`ApiEmulator.call` (run a function on the server loop),
:meth:`~ApiEmulator.subscribe`/``unsubscribe`` (a queue of ``(rv, type, obj, old)`` changes, loop
thread only), :meth:`~ApiEmulator.register_pod_log`, :meth:`~ApiEmulator.add_stop_hook`,
:meth:`~ApiEmulator.resource_for`.

kubectl tip: kubectl caches discovery per server address for hours (``~/.kube/cache``); emulators
reuse ports, so pass ``--cache-dir=<fresh dir>`` (the test fixture does).

Not emulated: client certificates, TLS (plain http), token expiry, aggregated ClusterRoles,
admission webhooks, quotas, conversion between CRD versions (all served versions
share one storage), managedFields and SSA conflicts, protobuf responses,
``limit``/``continue`` pagination (lists are always complete), scale subresources, graceful pod
deletion (pods disappear at once; the kubelet then terminates the process), namespace deletion
waiting for finalizers of its contents, ``events.k8s.io/v1`` and ``v1`` events sharing storage.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml

from .admission import Admission
from .auth import DECISIONS_KEPT, DEFAULT_RBAC, Authorizer, Decision, new_token
from .discovery import Discovery
from .garbage import GarbageCollector
from .http_api import HttpApi
from .resources import (
    HISTORY,
    ApiError,
    ResourceType,
    T,
    _builtin_types,
    now_iso,
)
from .store import ObjectStore
from .tls import serving_cert
from .watch import WatchHub, _Watcher

__all__ = ["ApiEmulator", "ApiError", "ResourceType"]


class ApiEmulator(
    HttpApi,
    WatchHub,
    Discovery,
    Authorizer,
    GarbageCollector,
    Admission,
    ObjectStore,
    kmock.KubernetesEmulator,
):  # type: ignore[misc]
    """The API server. See the module docstring for the API and behaviour."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, admin_token: str | None = None
    ) -> None:
        super().__init__()
        #: the serving certificate (HTTPS: kubectl sends credentials only over TLS)
        self.tls = serving_cert(host)
        #: the sandbox admin's bearer token (random per emulator unless given)
        self.admin_token = admin_token or new_token("sandbox-admin-")
        # ServiceAccount tokens: token -> (namespace, name, uid) and back (see .auth)
        self._sa_tokens: dict[str, tuple[str, str, str]] = {}
        self._sa_token_of: dict[tuple[str, str, str], str] = {}
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
        # authorization decisions on HTTP requests of non-admin identities (see .auth)
        self._decisions: collections.deque[Decision] = collections.deque(maxlen=DECISIONS_KEPT)
        for rt in _builtin_types():
            self._register(rt)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._create_internal(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
        for obj in DEFAULT_RBAC:  # a real cluster's default discovery roles and bindings
            self._create_internal(copy.deepcopy(obj))

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
            ctx = self.tls.server_context()
            site = aiohttp.web.TCPSite(runner, self._host, self._want_port, ssl_context=ctx)
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
        return f"https://{self._host}:{self.port}"

    def write_kubeconfig(
        self,
        path: str | Path,
        *,
        namespace: str = "default",
        service_account: tuple[str, str] | None = None,
    ) -> Path:
        """Write a kubeconfig (https, trusting :attr:`tls`) for kubectl and the Python client.

        By default its user is the sandbox admin (the bearer token :attr:`admin_token`);
        ``service_account=(namespace, name)`` makes it authenticate as that ServiceAccount
        instead (:meth:`service_account_token`), with RBAC enforced on its requests. The file is
        written with mode 0600 (it holds a credential).
        """
        token = (
            self.service_account_token(*service_account) if service_account else self.admin_token
        )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sandbox",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.tls.cert_pem).decode(),
                    },
                }
            ],
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
        path.touch(mode=0o600)
        path.chmod(0o600)
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
