"""kopf handlers: thin glue between the API and the pure builders / status mapping.

- create/resume of a MoEFinetune: build the children (:mod:`.builders`), check them against the
  admission policy (:mod:`.policy`: a violation fails the run, reason ``PolicyViolation``,
  before any child exists; the same check, on the spec as it is now, precedes every spec
  change and every un-suspend, and a refused spec suspends the run's Jobs: :func:`admit`, no
  waiver for a run whose Job exists) and create them
  idempotently — a 409 means the object exists: it is adopted when it is ours (same owner uid)
  or an orphan, and the handler retries later when another owner still holds the name (e.g. the
  garbage collector has not yet removed the Job of a deleted run of the same name). So an
  operator restarted mid-run adopts the running Job and never creates a second one.
- ``spec.device.precompile`` (:mod:`.precompile`): the precompile Job (an Indexed Job, one
  index per device graph, CPU only) is created before the training Job; while it runs the run
  is ``Compiling`` (``status.compile``); its completion (a Job event, or the resume handler
  after a restart) runs the create handler's path again, which then creates the training Job.
  A failed compile fails the run (``CompileFailed``, the graph and the compiler's message)
  before any training Job exists, so no card is ever requested.
- events of Jobs and Pods labelled ``npu-lora.io/run``: recompute the operator's subtree of the
  run's status (:func:`.status.compute_status`) and merge-patch it through ``/status`` when it
  changed; post an Event for each transition.
- ``spec`` changes, by the field's ``OnUpdate`` tag (:mod:`npu_lora.api.v1alpha1`, the one
  list): ``job`` fields are copied to the Job; ``worker-config`` fields rewrite the worker
  ConfigMap and take effect with the next worker pod (a retry, or after suspend/resume);
  ``new-run`` fields cannot change a created Job (its pod template is immutable): the operator
  posts a Warning event and leaves the Job alone (delete and re-create the run to apply them);
  ``immutable`` fields never reach the operator (CEL on the server). ``spec.suspend`` has its
  own handler: with ``queueName`` the Job is created suspended and Kueue un-suspends it on
  admission; ``spec.suspend: true`` suspends it (Kueue then evicts the workload), ``false``
  leaves the re-admission to Kueue.
- ``spec.managedBy`` (Kueue MultiKueue's external-framework contract): only runs whose
  ``managedBy`` is this operator's (:data:`npu_lora.api.v1alpha1.MANAGED_BY`, the default) are
  reconciled; every handler of a run is filtered by :func:`managed_here` (kopf ``when=``), and
  the status writers check it again, so a run another controller manages gets no child from us
  and its status is never written (MultiKueue copies it from the worker cluster).
- deletion: nothing to do; the children carry ownerReferences and the garbage collector removes
  them (no finalizer is needed, and none is added: there is no deletion handler).

The operator's own kopf state lives in annotations with the ``npu-lora.io`` prefix
(see :func:`build_settings`), never in ``status``. What the handlers share (configuration, API
access, per-run locks) is a :class:`State` in kopf's memo (:func:`new_memo`, passed to
``kopf.run(memo=...)``; each handler gets it as ``memo.state``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

import kopf
import kubernetes
from npu_lora.api import v1alpha1 as api
from npu_lora.api.v1alpha1 import API_VERSION, GROUP, PLURAL, VERSION

from npu_lora_operator import builders, policy, precompile
from npu_lora_operator import metrics as prom
from npu_lora_operator import status as st
from npu_lora_operator.kube import Kube, KubeError, plural_of
from npu_lora_operator.messages import bounded
from npu_lora_operator.settings import OperatorConfig

Body = dict[str, Any]
log = logging.getLogger("npu_lora_operator")

RUN_NAME_ANNOTATION = builders.RUN_NAME_ANNOTATION
#: condition reason of a run whose child name is held by an object that is not its own
CONFLICT_REASON = "ChildConflict"

#: The handlers live in their own registry (``kopf.operator(registry=registry)``).
registry = kopf.OperatorRegistry()


class State:
    """The operator's shared state: configuration, API access and one lock per run (status
    writes of a run are serialised). kopf gives each handler a shallow copy of the operator's
    memo, so every handler sees this one object."""

    def __init__(self, config: OperatorConfig, kube: Kube) -> None:
        self.config = config
        self.kube = kube
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())


def new_memo(config: OperatorConfig | None = None, kube: Kube | None = None) -> kopf.Memo:
    """The memo to pass to ``kopf.run``/``kopf.operator``: ``memo.state`` is a :class:`State`
    (default configuration; API access through the default ``kubernetes`` client)."""
    return kopf.Memo(state=State(config or OperatorConfig(), kube or Kube()))


def build_settings(settings: kopf.OperatorSettings | None = None) -> kopf.OperatorSettings:
    """kopf settings: ``npu-lora.io``-prefixed annotations/finalizer, standalone, events."""
    s = settings or kopf.OperatorSettings()
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    s.persistence.finalizer = f"{GROUP}/finalizer"
    s.peering.standalone = True
    s.peering.mandatory = False
    s.posting.reporting_component = "npu-lora-operator"
    # kopf would post its own INFO logs ("Handler ... succeeded") as Events on every Job/Pod
    # event; the handlers post meaningful Events themselves
    s.posting.level = logging.WARNING
    s.execution.max_workers = 16
    s.networking.request_timeout = 60
    s.watching.server_timeout = 300
    s.watching.client_timeout = 330
    # watch only the Jobs and Pods of runs (server-side label selector), not the whole cluster's
    s.watching.label_selectors["batch", "jobs"] = builders.RUN_LABEL
    s.watching.label_selectors["v1", "pods"] = builders.RUN_LABEL
    # every namespace/CRD the operator needs is named explicitly: no scanning of namespaces
    s.scanning.disabled = True
    return s


class _QuietEventHandlers(logging.Filter):
    """Drop kopf's "Handler 'job_event' succeeded." lines (one per Job/Pod event)."""

    _PREFIXES = ("Handler 'job_event' succeeded", "Handler 'pod_event' succeeded")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        return not record.getMessage().startswith(self._PREFIXES)


def quiet_kopf_logs() -> None:
    """Install :class:`_QuietEventHandlers` on kopf's per-object logger (idempotent)."""
    logger = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietEventHandlers) for f in logger.filters):
        logger.addFilter(_QuietEventHandlers())


@kopf.on.login(registry=registry)
def login(**_: Any) -> kopf.ConnectionInfo:
    """Reuse the ``kubernetes`` client configuration loaded by the command (kubeconfig or
    in-cluster), so kopf and the operator's own requests talk to the same server."""
    cfg = kubernetes.client.Configuration.get_default_copy()
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization"
    )
    scheme, token = None, None
    if header:
        parts = header.split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        username=cfg.username or None,
        password=cfg.password or None,
    )


# ---------------------------------------------------------------------------------------------
# helpers


def is_managed(obj: Body | None) -> bool:
    """Run ``obj`` is this operator's: ``spec.managedBy`` is ours or unset (a run created before
    the field existed, or not yet defaulted)."""
    spec = (obj or {}).get("spec") or {}
    return (spec.get("managedBy") or api.MANAGED_BY) == api.MANAGED_BY


def managed_here(body: kopf.Body, **_: Any) -> bool:
    """kopf ``when=`` filter of every MoEFinetune handler: :func:`is_managed`."""
    return is_managed(dict(body))


def _uid(obj: Body | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid")


def _owned_by(obj: Body, uid: str | None) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


def _post(body: Body, events: Iterable[tuple[str, str, str]]) -> None:
    for etype, reason, message in events:
        try:
            kopf.event(body, type=etype, reason=reason or "Update", message=bounded(message))
        except Exception as e:  # no event loop (unit tests) or posting failed
            log.debug("event not posted: %s %s: %s (%s)", etype, reason, message, e)


class ChildConflict(Exception):
    """An object under a child's name that does not carry this run's identity."""

    def __init__(self, obj: Body, why: str):
        meta = obj.get("metadata") or {}
        self.object = f"{obj.get('kind')} {meta.get('namespace') or ''}/{meta.get('name')}"
        super().__init__(
            f"{self.object} exists and is not this run's ({why}); the operator does not adopt "
            "it: delete it, or re-create the run under another name"
        )


#: how many times a run waits for the garbage collector to remove its predecessor's child
#: (a deleted run of the same name) before it fails
MAX_PREDECESSOR_RETRIES = 24


def _identity_of(existing: Body, obj: Body, owner: builders.Run) -> str | None:
    """None when ``existing`` carries ``owner``'s identity (an owner reference with its uid and
    its run label), else why not."""
    meta = existing.get("metadata") or {}
    if not _owned_by(existing, owner.uid):
        refs = meta.get("ownerReferences") or []
        if not refs:
            return "it has no owner reference to this run"
        return "its owner is " + ", ".join(
            f"{r.get('kind', '')}/{r.get('name', '')} uid {r.get('uid', '')}" for r in refs[:3]
        )
    want = (obj.get("metadata") or {}).get("labels", {}).get(builders.RUN_LABEL)
    if (meta.get("labels") or {}).get(builders.RUN_LABEL) != want:
        return f"its label {builders.RUN_LABEL} is not this run's"
    return None


def _predecessor(existing: Body, owner: builders.Run) -> bool:
    """``existing`` belongs to a deleted run of the same name (the garbage collector removes
    it) or is being deleted."""
    meta = existing.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return True
    return any(
        r.get("kind") == api.KIND and r.get("name") == owner.name and r.get("uid") != owner.uid
        for r in meta.get("ownerReferences") or []
    )


def ensure_object(kube: Kube, obj: Body, owner: builders.Run, retry: int = 0) -> tuple[Body, bool]:
    """Create ``obj``; on 409 adopt the existing one only when it carries this run's identity
    (owner reference with this uid + run label; a ConfigMap's data is then rewritten to what
    was built). Returns (object, created). A predecessor's object (a deleted run of the same
    name, not yet collected) is waited for (``kopf.TemporaryError``, at most
    :data:`MAX_PREDECESSOR_RETRIES` times); anything else under the name raises
    :class:`ChildConflict`."""
    meta = obj["metadata"]
    try:
        return kube.create(obj), True
    except KubeError as e:
        if e.code != 409:
            raise
    plural = plural_of(obj["apiVersion"], obj["kind"])
    existing = kube.get(obj["apiVersion"], plural, meta["name"], meta.get("namespace"))
    if existing is None:  # deleted in between: try once more
        return kube.create(obj), True
    why = _identity_of(existing, obj, owner)
    if why is None:
        if obj["kind"] == "ConfigMap" and existing.get("data") != obj.get("data"):
            existing = kube.merge_patch(
                obj["apiVersion"],
                plural,
                meta["name"],
                meta.get("namespace"),
                {"data": {**{k: None for k in existing.get("data") or {}}, **obj["data"]}},
            )
        return existing, False
    if _predecessor(existing, owner) and retry < MAX_PREDECESSOR_RETRIES:
        raise kopf.TemporaryError(
            f"{obj['kind']} {meta['name']} still belongs to a deleted run of the same name; "
            "waiting for the garbage collector",
            delay=5,
        )
    raise ChildConflict(existing, why)


def _owned_child(
    kube: Kube, api_version: str, plural: str, name: str, namespace: str, uid: str | None
) -> bool:
    """The child ``name`` exists and carries the run's owner reference (never patch another
    run's object that happens to have the name)."""
    obj = kube.get(api_version, plural, name, namespace)
    return obj is not None and uid is not None and _owned_by(obj, uid)


def run_name_of(child: Body) -> str | None:
    """The MoEFinetune a Job or Pod belongs to (annotation, owner reference or label)."""
    meta = child.get("metadata") or {}
    name = (meta.get("annotations") or {}).get(RUN_NAME_ANNOTATION)
    if name:
        return name
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "MoEFinetune":
            return ref.get("name")
    return (meta.get("labels") or {}).get(builders.RUN_LABEL)


def _pods_of(kube: Kube, job: Body, namespace: str, run: str) -> list[Body]:
    pods = kube.list(
        "v1", "pods", namespace, f"{builders.RUN_LABEL}={builders.run_label_value(run)}"
    )
    juid = _uid(job)
    jname = (job.get("metadata") or {}).get("name")
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        if meta.get("deletionTimestamp") and (p.get("status") or {}).get("phase") not in (
            "Failed",
            "Succeeded",
        ):
            continue  # being deleted (suspend, GC): not the run's current pod
        if meta.get("ownerReferences"):
            if _owned_by(p, juid):
                out.append(p)
        elif (meta.get("labels") or {}).get("job-name") == jname:
            out.append(p)
    return out


def reconcile_status(state: State, namespace: str, name: str) -> Body | None:
    """Recompute and write the operator's status subtree of run ``namespace/name``."""
    kube = state.kube
    with state.lock(namespace, name):
        mft = kube.get(API_VERSION, PLURAL, name, namespace)
        if mft is None or (mft.get("metadata") or {}).get("deletionTimestamp"):
            return None
        if not is_managed(mft):  # another controller's run (spec.managedBy): not ours to write
            return None
        job = kube.get("batch/v1", "jobs", builders.job_name(name), namespace)
        if job is not None and not _owned_by(job, _uid(mft)):
            job = None
        pods = _pods_of(kube, job, namespace, name) if job is not None else []
        old = mft.get("status") or {}
        if old.get("phase") in st.TERMINAL_PHASES and job is None:
            return old  # the Job was removed (ttlSecondsAfterFinished): keep the verdict
        precompiled = job is None or "compile" in old
        cjob = _compile_job(kube, mft, namespace, name) if precompiled else None
        if cjob is not None and job is None:  # precompiling: no training Job yet
            new = st.compute_compile_status(mft, cjob, _pods_of(kube, cjob, namespace, name))
        else:
            new = st.compute_status(mft, job, pods)
            if cjob is not None:  # the last word on the precompile Job (done = total)
                new["compile"] = st.compile_progress(cjob, st.now_iso())
        if old.get("phase") in st.TERMINAL_PHASES and new.get("phase") != old.get("phase"):
            return old
        if not st.status_changed(old, new):
            return old
        kube.merge_patch(API_VERSION, PLURAL, name, namespace, {"status": new}, sub="status")
        _post(mft, st.transition_events(old, new))
        return new


def _compile_job(kube: Kube, mft: Body, namespace: str, name: str) -> Body | None:
    """The run's own precompile Job (owner uid), or None."""
    cjob = kube.get("batch/v1", "jobs", precompile.precompile_job_name(name), namespace)
    if cjob is None or not _owned_by(cjob, _uid(mft)):
        return None
    return cjob


def _job_finished(job: Body) -> str | None:
    """``"Complete"`` or ``"Failed"`` from a Job's conditions, None while it runs."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Complete"
        if c.get("type") in ("Failed", "FailureTarget"):
            return "Failed"
    return None


def fail_run(state: State, namespace: str, name: str, reason: str, message: str) -> None:
    """Mark the run Failed without a Job (e.g. the server rejected the Job we built)."""
    kube = state.kube
    with state.lock(namespace, name):
        mft = kube.get(API_VERSION, PLURAL, name, namespace)
        if mft is None or not is_managed(mft):
            return
        old = mft.get("status") or {}
        message = bounded(message)
        obs = st.Observed("Failed", reason, message, "Failed")
        generation = (mft.get("metadata") or {}).get("generation")
        now = st.now_iso()
        new: Body = {
            "phase": "Failed",
            "conditions": st.set_conditions(old.get("conditions"), obs, now, generation),
            "message": message,
            "completionTime": now,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        kube.merge_patch(API_VERSION, PLURAL, name, namespace, {"status": new}, sub="status")
        _post(mft, st.transition_events(old, new))


def _stop_jobs(state: State, run: builders.Run, logger: logging.Logger) -> list[str]:
    """Suspend the run's own Jobs (training and precompile) that are neither finished nor
    suspended, so no pod of the run starts while its spec is refused (the pods are deleted; the
    checkpoint stays). Returns the Jobs suspended."""
    ns = run.namespace or "default"
    stopped = []
    for jname in (builders.job_name(run.name), precompile.precompile_job_name(run.name)):
        job = state.kube.get("batch/v1", "jobs", jname, ns)
        if job is None or run.uid is None or not _owned_by(job, run.uid):
            continue
        if _job_finished(job) is not None or (job.get("spec") or {}).get("suspend") is True:
            continue
        try:
            state.kube.merge_patch("batch/v1", "jobs", jname, ns, {"spec": {"suspend": True}})
        except KubeError as e:
            if e.code != 404:
                raise
            continue
        logger.warning("run %s: Job %s suspended (its spec is refused)", run.name, jname)
        stopped.append(jname)
    return stopped


def admit(
    state: State,
    run: builders.Run,
    children: list[Body],
    logger: logging.Logger,
    phase: str | None = None,
) -> None:
    """The admission policy (:mod:`.policy`) on the run's spec *as it is now*, before any child
    is created or changed, on every path (create, resume after a restart, a retry, a spec
    change, an un-suspend, the precompile Job's completion). There is no waiver: a run whose
    Job exists already (admitted earlier, then edited while suspended, or a stricter policy
    after an upgrade) is refused like a new one. A violation suspends the run's own unfinished
    Jobs (:func:`_stop_jobs`), fails the run (reason ``PolicyViolation``, a Warning Event, the
    fields named; a run already ``Succeeded``/``Failed`` keeps its verdict) and raises
    ``kopf.PermanentError``: the caller creates and patches nothing."""
    cfg = state.config
    extra = [k for k, _ in cfg.extra_env]
    violations = policy.check(run.spec, children, cfg.policy, cfg.worker_image, extra)
    if not violations:
        return
    msg = policy.describe(violations)
    ns = run.namespace or "default"
    _stop_jobs(state, run, logger)
    if phase in st.TERMINAL_PHASES:
        logger.warning("run %s (%s): spec change refused: %s", run.name, phase, msg)
    else:
        fail_run(state, ns, run.name, policy.REASON, msg)
    raise kopf.PermanentError(bounded(msg))


def _admit_body(state: State, raw: Body, logger: logging.Logger) -> builders.Run:
    """:func:`admit` on a MoEFinetune body's spec (a spec the models refuse fails the run
    ``InvalidSpec``, as in :func:`ensure_run`). Returns the run."""
    meta = raw.get("metadata") or {}
    name, ns = meta.get("name") or "", meta.get("namespace") or "default"
    phase = (raw.get("status") or {}).get("phase")
    try:
        run = builders.Run.from_body(raw)
    except ValueError as e:  # the server's schema should have refused it
        msg = bounded(f"invalid spec: {e}")
        if phase not in st.TERMINAL_PHASES:
            fail_run(state, ns, name, "InvalidSpec", msg)
        raise kopf.PermanentError(msg) from e
    admit(state, run, [], logger, phase)
    return run


# ---------------------------------------------------------------------------------------------
# MoEFinetune


@kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry, when=managed_here)
@kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, when=managed_here)
@prom.instrumented("ensure_run")
def ensure_run(
    body: kopf.Body,
    name: str,
    namespace: str,
    logger: logging.Logger,
    memo: kopf.Memo,
    retry: int = 0,
    **_: Any,
) -> None:
    """Create (or adopt) the ConfigMap, the per-run RBAC and the Job."""
    state: State = memo.state
    raw: Body = dict(body)
    status = raw.get("status") or {}
    if status.get("phase") in st.TERMINAL_PHASES:
        logger.info("run %s already %s; nothing to create", name, status["phase"])
        return
    try:
        run = builders.Run.from_body(raw)
    except ValueError as e:  # the server's schema should have refused it (CRD not up to date?)
        msg = bounded(f"invalid spec: {e}")
        fail_run(state, namespace, name, "InvalidSpec", msg)
        raise kopf.PermanentError(msg) from e
    admit(state, run, [], logger)  # the spec first: a refused run costs no memory estimate
    children, total = precompile.run_children(run, state.config)
    if precompile.wants_precompile(run) and total is None:
        logger.warning("run %s: the compile plan cannot be sized here; not precompiled", name)
    admit(state, run, children, logger)
    created = []
    job = builders.job_name(name)
    for child in children:
        is_job = child["kind"] == "Job" and child["metadata"]["name"] == job
        if total and is_job and not _precompiled(state, run, raw):
            logger.info("run %s: compiling device graphs before the training Job", name)
            return
        try:
            _, was_created = ensure_object(state.kube, child, run, retry)
        except ChildConflict as e:
            fail_run(state, namespace, name, CONFLICT_REASON, str(e))
            raise kopf.PermanentError(bounded(str(e))) from e
        except KubeError as e:
            if e.code in (400, 422):  # the server rejects what we built: retrying cannot help
                msg = f"cannot create {child['kind']} {child['metadata']['name']}: {e.message}"
                fail_run(state, namespace, name, "InvalidSpec", msg)
                raise kopf.PermanentError(msg) from e
            raise
        if was_created:
            created.append(f"{child['kind']}/{child['metadata']['name']}")
            if child["metadata"]["name"] != job and child["kind"] == "Job":
                _post(
                    raw,
                    [("Normal", "CompileJobCreated", f"created Job {child['metadata']['name']}")],
                )
    if created:
        logger.info("created %s", ", ".join(created))
    if f"Job/{job}" in created:
        prom.job_created(raw.get("kind") or "MoEFinetune")
        _post(raw, [("Normal", "JobCreated", f"created Job {job}")])
    else:
        prom.job_adopted(raw.get("kind") or "MoEFinetune")
        _post(raw, [("Normal", "JobAdopted", f"adopted existing Job {job}")])
    reconcile_status(state, namespace, name)


def _precompiled(state: State, run: builders.Run, raw: Body) -> bool:
    """Before the training Job of a precompiled run: whether it may be created now (the
    precompile Job completed, or the training Job exists already: an operator restarted mid-run
    adopts it). False while the graphs compile (phase ``Compiling``; the precompile Job's
    completion event creates the training Job, :func:`job_event`); ``kopf.PermanentError``
    when a graph failed to compile (``Failed``, reason ``CompileFailed``)."""
    ns, name = run.namespace or "default", run.name
    kube = state.kube
    train = kube.get("batch/v1", "jobs", builders.job_name(name), ns)
    if train is not None and _owned_by(train, run.uid):
        return True
    cjob = _compile_job(kube, raw, ns, name)
    if cjob is not None and _job_finished(cjob) == "Complete":
        return True
    new = reconcile_status(state, ns, name) or {}
    if cjob is not None and _job_finished(cjob) == "Failed":
        raise kopf.PermanentError(bounded(new.get("message") or "a device graph failed to compile"))
    return False


@kopf.on.field(GROUP, VERSION, PLURAL, field="spec.suspend", registry=registry, when=managed_here)
@prom.instrumented("suspend_changed")
def suspend_changed(
    old: Any,
    new: Any,
    body: kopf.Body,
    spec: kopf.Spec,
    name: str,
    namespace: str,
    logger: logging.Logger,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    state: State = memo.state
    if old is None:  # creation: the Job is built with it
        return
    suspend = bool(new)
    if not suspend:
        if ((body.get("status") or {}).get("phase")) in st.TERMINAL_PHASES:
            logger.info("run %s is finished; its Job stays as it is", name)
            return
        # a resumed Job starts pods: the spec as it is now must pass the policy
        _admit_body(state, dict(body), logger)
    if not suspend and spec.get("queueName"):
        # Kueue owns un-suspending queued Jobs (on admission); leave the Job to it
        _post(dict(body), [("Normal", "Resumed", "resume left to Kueue admission")])
        reconcile_status(state, namespace, name)
        return
    uid = (body.get("metadata") or {}).get("uid")
    if not _owned_child(state.kube, "batch/v1", "jobs", builders.job_name(name), namespace, uid):
        logger.info("no Job of this run to %s", "suspend" if suspend else "resume")
        return
    try:
        state.kube.merge_patch(
            "batch/v1", "jobs", builders.job_name(name), namespace, {"spec": {"suspend": suspend}}
        )
    except KubeError as e:
        if e.code == 404:
            logger.info("no Job to %s yet", "suspend" if suspend else "resume")
            return
        raise
    verb = "Suspended" if suspend else "Resumed"
    _post(dict(body), [("Normal", verb, f"{verb.lower()} Job {builders.job_name(name)}")])
    reconcile_status(state, namespace, name)


#: copied to the Job (``suspend`` has its own handler: Kueue un-suspends queued Jobs)
_JOB_MUTABLE = tuple(f for f in api.spec_fields(api.OnUpdate.JOB) if f != "suspend")
_CONFIG_FIELDS = api.spec_fields(api.OnUpdate.WORKER_CONFIG)
_NEW_RUN_ONLY = api.spec_fields(api.OnUpdate.NEW_RUN)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry, when=managed_here)
@prom.instrumented("spec_changed")
def spec_changed(
    diff: kopf.Diff,
    body: kopf.Body,
    name: str,
    namespace: str,
    logger: logging.Logger,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    state: State = memo.state
    raw: Body = dict(body)
    spec = raw.get("spec") or {}
    changed = {str(d[1][0]) for d in diff if d[1]}  # field paths are relative to `spec`
    # nothing of the run changes unless the spec as it is now passes the policy
    _admit_body(state, raw, logger)
    kube = state.kube
    uid = (raw.get("metadata") or {}).get("uid")
    job_patch = {k: spec.get(k) for k in _JOB_MUTABLE if k in changed}
    if job_patch and not _owned_child(
        kube, "batch/v1", "jobs", builders.job_name(name), namespace, uid
    ):
        job_patch = {}  # no Job of this run (yet, or its name is another run's)
    if job_patch:
        try:
            kube.merge_patch(
                "batch/v1", "jobs", builders.job_name(name), namespace, {"spec": job_patch}
            )
            _post(raw, [("Normal", "JobUpdated", f"Job updated: {', '.join(sorted(job_patch))}")])
        except KubeError as e:
            if e.code != 404:
                raise
    if changed & set(_CONFIG_FIELDS):
        try:
            cm = builders.build_configmap(builders.Run.from_body(raw))
        except ValueError as e:  # the server's schema should have refused it
            raise kopf.PermanentError(bounded(f"invalid spec: {e}")) from e
        cm_name = cm["metadata"]["name"]
        if not _owned_child(kube, "v1", "configmaps", cm_name, namespace, uid):
            changed -= set(_CONFIG_FIELDS)  # not this run's ConfigMap: never rewrite it
    if changed & set(_CONFIG_FIELDS):
        try:
            kube.merge_patch(
                "v1", "configmaps", cm["metadata"]["name"], namespace, {"data": cm["data"]}
            )
            _post(
                raw,
                [
                    (
                        "Normal",
                        "ConfigUpdated",
                        f"worker config updated ({', '.join(sorted(changed & set(_CONFIG_FIELDS)))}); "
                        "takes effect with the next worker pod",
                    )
                ],
            )
        except KubeError as e:
            if e.code != 404:
                raise
    ignored = sorted(changed & set(_NEW_RUN_ONLY))
    if ignored:
        msg = (
            f"spec.{', spec.'.join(ignored)} changed but cannot change the existing Job; "
            "delete and re-create the run to apply"
        )
        logger.warning(msg)
        _post(raw, [("Warning", "ChangeNotApplied", msg)])
    reconcile_status(state, namespace, name)


# ---------------------------------------------------------------------------------------------
# Jobs and Pods of runs


@kopf.on.event("batch", "v1", "jobs", labels={builders.RUN_LABEL: kopf.PRESENT}, registry=registry)
@prom.instrumented("job_event")
def job_event(
    body: kopf.Body, namespace: str, memo: kopf.Memo, logger: logging.Logger, **_: Any
) -> None:
    raw: Body = dict(body)
    run = run_name_of(raw)
    if not run:
        return
    if _refused_job_running(memo.state, raw, namespace, run, logger):
        return
    if _is_completed_precompile(memo.state, raw, namespace, run):
        mft = memo.state.kube.get(API_VERSION, PLURAL, run, namespace)
        if mft is not None and _owned_by(raw, _uid(mft)):
            ensure_run(body=mft, name=run, namespace=namespace, logger=logger, memo=memo)
            return
    reconcile_status(memo.state, namespace, run)


def _refused_job_running(
    state: State, job: Body, namespace: str, run: str, logger: logging.Logger
) -> bool:
    """A Job of a run failed by the policy that runs again (un-suspended by someone else, e.g.
    Kueue re-admitting its workload): suspended again. True when it was."""
    if (job.get("spec") or {}).get("suspend") is True or _job_finished(job) is not None:
        return False
    mft = state.kube.get(API_VERSION, PLURAL, run, namespace)
    if mft is None or not _owned_by(job, _uid(mft)):
        return False
    conds = (mft.get("status") or {}).get("conditions") or []
    if not any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") == policy.REASON
        for c in conds
    ):
        return False
    try:
        owner = builders.Run.from_body(mft)
    except ValueError:
        return False
    return bool(_stop_jobs(state, owner, logger))


def _is_completed_precompile(state: State, job: Body, namespace: str, run: str) -> bool:
    """A run's precompile Job that completed while the run has no training Job yet."""
    meta = job.get("metadata") or {}
    if meta.get("name") != precompile.precompile_job_name(run):
        return False
    if (meta.get("labels") or {}).get("app.kubernetes.io/component") != precompile.COMPONENT:
        return False
    if _job_finished(job) != "Complete":
        return False
    return state.kube.get("batch/v1", "jobs", builders.job_name(run), namespace) is None


@kopf.on.event("", "v1", "pods", labels={builders.RUN_LABEL: kopf.PRESENT}, registry=registry)
@prom.instrumented("pod_event")
def pod_event(body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    run = run_name_of(dict(body))
    if run:
        reconcile_status(memo.state, namespace, run)


@kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
def run_event(event: kopf.RawEvent, body: kopf.Body, name: str, namespace: str, **_: Any) -> None:
    """Keep the metrics' view of the run (phase, the worker's last step) up to date."""
    kind = body.get("kind") or "MoEFinetune"
    if event.get("type") == "DELETED":
        prom.RUNS.forget(kind, namespace, name)
    else:
        prom.RUNS.observe(kind, namespace, name, dict(body.get("status") or {}))
