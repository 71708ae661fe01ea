"""The API emulator's object store (see :class:`ObjectStore`)."""

from __future__ import annotations

import contextlib
import copy
import secrets
import string
import uuid
from typing import Any

import kmock

from . import patching, schema
from .resources import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    VERBS,
    ApiError,
    ResourceType,
    _ns,
    now_iso,
)
from .selectors import (
    parse_field_selector,
    parse_label_selector,
)

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


def _check_identity_unchanged(
    rt: ResourceType, current: dict[str, Any], patched: dict[str, Any], name: str
) -> None:
    """A patch may not change what identifies the object: ``metadata.uid``, ``.name``,
    ``.namespace``, ``kind``, ``apiVersion`` (422, the field named: the API server refuses
    such a patch instead of ignoring it)."""
    cmeta, pmeta = current.get("metadata") or {}, patched.get("metadata")
    if not isinstance(pmeta, dict):
        raise _immutable(rt, name, "metadata", "metadata must be an object")
    fields = ["uid", "name"] + (["namespace"] if rt.namespaced else [])
    for f in fields:
        # left out or emptied: the stored value is kept (an update without a uid gets the
        # existing one, as on a cluster); another value is refused
        if pmeta.get(f) not in (None, "", cmeta.get(f)):
            raise _immutable(rt, name, f"metadata.{f}", "field is immutable")
    for f in ("kind", "apiVersion"):
        if f in patched and patched[f] != current.get(f):
            raise _immutable(rt, name, f, "field is immutable")


def _check_body_type(rt: ResourceType, body: dict[str, Any]) -> None:
    """A body whose ``kind``/``apiVersion`` (when given) is another type's is a 400, as the API
    server's decoder answers (a Secret posted to the configmaps URL is never stored as one)."""
    kind, version = body.get("kind"), body.get("apiVersion")
    if (kind and kind != rt.kind) or (version and version != rt.api_version):
        raise ApiError(
            400,
            "BadRequest",
            f"{str(kind)[:64]} in version {str(version)[:64]!r} cannot be handled as a "
            f"{rt.kind}: the body's kind and apiVersion must be {rt.kind} {rt.api_version}",
        )


def _immutable(rt: ResourceType, name: str, field: str, why: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{rt.kind} "{name}" is invalid: {field}: Invalid value: {why}',
        {
            "name": name,
            "group": rt.group,
            "kind": rt.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}],
        },
    )


_MISSING = object()


def _value_at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _remove_path(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)


class ObjectStore:
    """The object store: typed resources, resourceVersions, the change history and the
    create / read / update / patch / delete semantics (in-process API and HTTP alike).

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

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

    @property
    def resource_version(self) -> int:
        return self._rv

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
        _check_body_type(rt, body)
        obj = copy.deepcopy(body)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        ns = self._create_namespace(rt, namespace, meta)
        name = self._create_name(rt, ns, meta)
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
        self._check_escalation(rt, obj)
        self._check_workload(rt, obj)
        self._check_builtin(rt, obj)
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

    def _create_namespace(
        self, rt: ResourceType, namespace: str | None, meta: dict[str, Any]
    ) -> str:
        """The new object's namespace (URL and body must agree; it must exist); "" when
        cluster-scoped."""
        if not rt.namespaced:
            meta.pop("namespace", None)
            return ""
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
        return ns

    def _create_name(self, rt: ResourceType, ns: str, meta: dict[str, Any]) -> str:
        """The new object's name (``generateName`` honoured), validated (422)."""
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
        elif rt.group == "rbac.authorization.k8s.io":  # path-segment names ("system:...")
            if name in (".", "..") or "/" in name or "%" in name:
                causes.append(
                    schema._invalid(
                        "metadata.name",
                        name,
                        'may not be "." or ".." and may not contain "/" or "%"',
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
        return name

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
        _check_body_type(rt, body)
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
        self._check_builtin(rt, new)
        if rt.plural in ("rolebindings", "clusterrolebindings") and new.get("roleRef") != old.get(
            "roleRef"
        ):
            raise _immutable(rt, ometa["name"], "roleRef", "cannot change roleRef")
        self._check_escalation(rt, new)
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
        force: bool = False,
    ) -> dict[str, Any]:
        key = self._key(rt, namespace, name)
        old = self._store[rt.storage_key].get(key)
        manager = field_manager or "unknown"
        applied_paths = _apply_paths(patch) if patch_type == "apply" else set()
        if old is None:
            if patch_type == "apply" and subresource is None:
                created = self._apply_create(
                    rt, namespace, name, patch, dry_run, field_validation, warnings
                )
                if not dry_run:
                    self._applied[(created["metadata"]["uid"], manager, "")] = applied_paths
                return created
            raise self._not_found(rt, name)
        owner = (old["metadata"]["uid"], manager, subresource or "")
        current = self._out(rt, old)
        if patch_type == "apply":
            self._apply_conflicts(rt, name, owner, current, patch, applied_paths, force)
        patched = self._patched(rt, current, patch, patch_type, owner, applied_paths)
        _check_identity_unchanged(rt, current, patched, name)
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
            self._applied[owner] = applied_paths
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

    def _apply_conflicts(
        self,
        rt: ResourceType,
        name: str,
        owner: tuple[str, str, str],
        current: dict[str, Any],
        patch: Any,
        applied_paths: set[tuple[str, ...]],
        force: bool,
    ) -> None:
        """Server-side apply's conflicts: a field another manager applied, which this apply
        sets to a different value, is a 409 Conflict naming the manager and the field, unless
        ``force=true``; then the field changes hands (the other manager no longer owns it)."""
        uid, manager, sub = owner
        conflicts: list[tuple[str, tuple[str, ...]]] = []
        taken: dict[tuple[str, str, str], set[tuple[str, ...]]] = {}
        for other, paths in self._applied.items():
            if other[0] != uid or other[2] != sub or other[1] == manager:
                continue
            for path in applied_paths - {("metadata",)}:
                for theirs in paths - {("metadata",)}:
                    n = min(len(path), len(theirs))
                    if path[:n] != theirs[:n]:
                        continue
                    if _value_at(patch, path) == _value_at(current, path):
                        continue  # the same value: shared ownership, no conflict
                    conflicts.append((other[1], path))
                    taken.setdefault(other, set()).add(theirs)
        if not conflicts:
            return
        if force:
            for other, paths in taken.items():
                self._applied[other] = self._applied[other] - paths
            return
        fields = sorted({(m, "." + ".".join(p)) for m, p in conflicts})
        text = "\n".join(f'conflict with "{m}": {f}' for m, f in fields[:20])
        raise ApiError(
            409,
            "Conflict",
            f"Apply failed with {len(fields)} conflict{'s' if len(fields) > 1 else ''}: {text}",
            {
                "name": name,
                "group": rt.group,
                "kind": rt.kind,
                "causes": [
                    {
                        "reason": "FieldManagerConflict",
                        "message": f'conflict with "{m}"',
                        "field": f,
                    }
                    for m, f in fields[:20]
                ],
            },
        )

    def _apply_create(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        dry_run: bool,
        field_validation: str | None,
        warnings: list[str] | None,
    ) -> dict[str, Any]:
        """Server-side apply of an absent object creates it (the URL's name wins)."""
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
        return self._create(
            rt,
            namespace,
            patch,
            dry_run=dry_run,
            field_validation=field_validation,
            warnings=warnings,
        )

    def _patched(
        self,
        rt: ResourceType,
        current: dict[str, Any],
        patch: Any,
        patch_type: str,
        owner: tuple[str, str, str],
        applied_paths: set[tuple[str, ...]],
    ) -> dict[str, Any]:
        """``current`` with the patch applied (merge, JSON, strategic merge or apply)."""
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
                    prev = self._applied.get(owner, set())
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
        return patched

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

    def _type_for_storage(self, skey: tuple[str, str]) -> ResourceType | None:
        for rt in self._types.values():
            if rt.storage_key == skey:
                return rt
        return None
