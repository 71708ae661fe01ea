"""The API emulator's HTTP front (see :class:`HttpApi`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp.web
import yaml

from . import protobuf, table
from .resources import (
    ApiError,
    ResourceType,
    _ParsedPath,
    log,
)
from .selectors import (
    FIELD_LABELS,
    _truthy,
    check_field_labels,
    check_list_query,
    check_write_query,
)

#: YAML bodies: at most this many nodes once aliases are expanded (an apiserver refuses alias
#: bombs too), and this many aliases
MAX_YAML_NODES = 100_000
MAX_YAML_ALIASES = 100


def _load_yaml(
    text: str, field_validation: str | None = None, warnings: list[str] | None = None
) -> Any:
    """``yaml.safe_load`` after a scan of the event stream that bounds alias expansion, the
    node count and the depth (no alias bomb, no RecursionError). A key twice in one mapping is
    handled as for a JSON body: an error under ``fieldValidation=Strict`` (and for a
    server-side apply, ``"Apply"``, whose parser refuses it whatever the mode), a warning
    under ``Warn`` (the default), the last value under ``Ignore``."""
    from npu_lora.api.limits import (
        DuplicateKeyError,
        ManifestLimitError,
        _UniqueKeyLoader,
        check_yaml_events,
    )

    try:
        check_yaml_events(
            text, max_nodes=MAX_YAML_NODES, max_aliases=MAX_YAML_ALIASES, max_depth=100
        )
    except ManifestLimitError as e:
        raise yaml.YAMLError(str(e)) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except DuplicateKeyError as e:
        mode = field_validation or "Warn"
        if mode in ("Strict", "Apply"):
            raise ApiError(400, "BadRequest", f"strict decoding error: yaml: {e}") from None
        if mode == "Warn" and warnings is not None:
            warnings.append("duplicate field: yaml: " + str(e)[:160].replace('"', "'"))
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _pairs_hook(dups: list[str]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                dups.append(k)
            out[k] = v
        return out

    return hook


#: PATCH Content-Type -> patch type
PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+cbor": "apply",
}


def _is_resource_path(path: str) -> bool:
    """``/api/v1/...`` or ``/apis/<group>/<version>/...`` (the rest is non-resource)."""
    parts = [p for p in path.split("/") if p]
    return (parts[:1] == ["api"] and len(parts) >= 3) or (parts[:1] == ["apis"] and len(parts) >= 4)


def _method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


class HttpApi:
    """The HTTP front: routing, request decoding, resource requests, list/Table rendering, logs.

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

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
        identity = self._identity(raw)  # 401 for a credential the server does not accept
        if not _is_resource_path(path):
            # discovery, /version, /healthz, /openapi: RBAC on the path (nonResourceURLs)
            self._authorize_path(identity, method, path)
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

    async def _resource_request(
        self, raw: aiohttp.web.BaseRequest, method: str, q: Any, body: bytes, pp: _ParsedPath
    ) -> aiohttp.web.StreamResponse:
        rt = pp.rtype
        assert rt is not None
        identity = self._identity(raw)
        if identity is not None:
            self._enforce(identity, rt, method, q, pp)
        with self.acting_as(identity):  # the store's RBAC escalation check reads it
            return await self._resource_request_as(raw, method, q, body, pp, rt)

    async def _resource_request_as(
        self,
        raw: aiohttp.web.BaseRequest,
        method: str,
        q: Any,
        body: bytes,
        pp: _ParsedPath,
        rt: ResourceType,
    ) -> aiohttp.web.StreamResponse:
        if pp.subresource is not None and pp.subresource not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method in ("POST", "PUT", "PATCH", "DELETE"):
            check_write_query(q, method)  # before anything is written
        if pp.name is None:
            return await self._collection_request(raw, method, q, body, pp, rt)
        if pp.subresource == "log":
            return await self._serve_log(raw, pp.namespace or "", pp.name, q)
        if method == "GET":
            return await self._get_object(raw, q, pp, rt)
        warnings: list[str] = []
        if method == "PUT":
            obj = self._update(
                rt,
                pp.namespace,
                pp.name,
                self._decode(raw, body, q.get("fieldValidation"), warnings),
                pp.subresource,
                dry_run=q.get("dryRun") == "All",
                field_validation=q.get("fieldValidation"),
                warnings=warnings,
            )
            return self._json(obj, 200, self._warning_headers(warnings))
        if method == "PATCH":
            return self._patch_request(raw, q, body, pp, rt)
        if method == "DELETE":
            return self._delete_request(q, body, pp, rt)
        raise _method_not_allowed()

    async def _collection_request(
        self,
        raw: aiohttp.web.BaseRequest,
        method: str,
        q: Any,
        body: bytes,
        pp: _ParsedPath,
        rt: ResourceType,
    ) -> aiohttp.web.StreamResponse:
        """list / watch / create / deletecollection (and the access reviews' create)."""
        dry_run = q.get("dryRun") == "All"
        if method == "GET":
            check_list_query(q)  # 400 before a list or a watch stream starts
            check_field_labels(q.get("fieldSelector"), self._field_labels(rt), rt.plural)
            if pp.watch_prefix or _truthy(q.get("watch")):
                accept = raw.headers.get("Accept", "")
                return await self._serve_watch(raw, rt, pp.namespace, q, accept)
            objs = self._select(rt, pp.namespace, q.get("labelSelector"), q.get("fieldSelector"))
            return self._render_list(rt, objs, raw.headers.get("Accept", ""), q)
        if method == "POST" and rt.group == "authorization.k8s.io":
            return self._json(
                self._access_review(rt, pp.namespace, self._decode(raw, body), raw), 201
            )
        if method == "POST":
            warnings: list[str] = []
            obj = self._create(
                rt,
                pp.namespace,
                self._decode(raw, body, q.get("fieldValidation"), warnings),
                dry_run=dry_run,
                field_validation=q.get("fieldValidation"),
                warnings=warnings,
            )
            return self._json(obj, 201, self._warning_headers(warnings))
        if method == "DELETE":
            objs = self._select(rt, pp.namespace, q.get("labelSelector"), q.get("fieldSelector"))
            deleted = []
            for obj in list(objs):
                with contextlib.suppress(ApiError):
                    meta = obj["metadata"]
                    deleted.append(
                        self._delete(rt, meta.get("namespace"), meta["name"], dry_run=dry_run)
                    )
            return self._json(self._list_body(rt, deleted))
        raise _method_not_allowed()

    def _field_labels(self, rt: ResourceType) -> frozenset[str] | None:
        """The fields ``rt`` may select on beyond metadata.name/namespace: a built-in's (None:
        not known here, any), a custom resource's ``selectableFields``."""
        if rt.crd_name is None:
            return FIELD_LABELS.get(rt.storage_key)
        crd = self._store[("apiextensions.k8s.io", "customresourcedefinitions")].get(
            ("", rt.crd_name)
        )
        fields = set()
        for v in ((crd or {}).get("spec") or {}).get("versions") or []:
            if v.get("name") == rt.version:
                for f in v.get("selectableFields") or []:
                    fields.add(str(f.get("jsonPath", "")).lstrip("."))
        return frozenset(fields)

    async def _get_object(
        self, raw: aiohttp.web.BaseRequest, q: Any, pp: _ParsedPath, rt: ResourceType
    ) -> aiohttp.web.StreamResponse:
        """GET one object (also as Table / PartialObjectMetadata), or watch it."""
        assert pp.name is not None
        accept = raw.headers.get("Accept", "")
        if _truthy(q.get("watch")) or pp.watch_prefix:
            check_list_query(q)
            one = {**q, "fieldSelector": f"metadata.name={pp.name}"}
            return await self._serve_watch(raw, rt, pp.namespace, one, accept)
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

    def _patch_request(
        self,
        raw: aiohttp.web.BaseRequest,
        q: Any,
        body: bytes,
        pp: _ParsedPath,
        rt: ResourceType,
    ) -> aiohttp.web.StreamResponse:
        """PATCH by content type: merge, JSON, strategic merge, server-side apply."""
        assert pp.name is not None
        ctype = (raw.headers.get("Content-Type") or "").split(";")[0].strip()
        patch_type = PATCH_TYPES.get(ctype)
        if patch_type is None:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json ("{ctype}")',
            )
        warnings: list[str] = []
        if patch_type == "apply":
            try:
                data = _load_yaml(body.decode() or "{}", "Apply")
            except (yaml.YAMLError, UnicodeDecodeError) as exc:
                raise ApiError(400, "BadRequest", f"error decoding YAML: {exc}") from exc
        else:
            data = self._decode(raw, body, q.get("fieldValidation"), warnings)
        existed = self._key(rt, pp.namespace, pp.name) in self._store[rt.storage_key]
        obj = self._patch(
            rt,
            pp.namespace,
            pp.name,
            data,
            patch_type,
            pp.subresource,
            dry_run=q.get("dryRun") == "All",
            field_validation=q.get("fieldValidation"),
            warnings=warnings,
            field_manager=q.get("fieldManager"),
            force=_truthy(q.get("force")),
        )
        return self._json(obj, 200 if existed else 201, self._warning_headers(warnings))

    def _delete_request(
        self, q: Any, body: bytes, pp: _ParsedPath, rt: ResourceType
    ) -> aiohttp.web.StreamResponse:
        """DELETE one object with the query's or the body's DeleteOptions."""
        assert pp.name is not None
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
            dry_run=q.get("dryRun") == "All" or "All" in (opts.get("dryRun") or []),
        )
        return self._json(obj)

    @staticmethod
    def _warning_headers(warnings: list[str]) -> dict[str, str] | None:
        if not warnings:
            return None
        return {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)}

    @staticmethod
    def _decode(
        raw: aiohttp.web.BaseRequest,
        body: bytes,
        field_validation: str | None = None,
        warnings: list[str] | None = None,
    ) -> Any:
        if "protobuf" in (raw.headers.get("Content-Type") or ""):
            try:
                return protobuf.decode(body)
            except (protobuf.Unsupported, IndexError, UnicodeDecodeError) as exc:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the sandbox API emulator cannot decode this protobuf body ({exc}); use JSON (kubectl apply)",
                ) from exc
        dups: list[str] = []
        try:
            data = json.loads(body or b"null", object_pairs_hook=_pairs_hook(dups))
        except RecursionError as exc:
            raise ApiError(400, "BadRequest", "the JSON body is nested too deeply") from exc
        except ValueError:
            try:
                return _load_yaml(body.decode(), field_validation, warnings)
            except (yaml.YAMLError, UnicodeDecodeError) as exc:
                raise ApiError(
                    400, "BadRequest", f"the body of the request was in an unknown format: {exc}"
                ) from exc

        if dups:
            # the apiserver's strict JSON decoder: an error under Strict, a warning under Warn
            detail = ", ".join(f'json: duplicate field "{d[:80]}"' for d in dups[:5])
            if (field_validation or "") == "Strict":
                raise ApiError(400, "BadRequest", f"strict decoding error: {detail}")
            if (field_validation or "Warn") == "Warn" and warnings is not None:
                warnings.extend(f'duplicate field "{d[:80]}"' for d in dups[:5])
        return data

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

    def register_pod_log(self, namespace: str, name: str, path: Path) -> None:
        """Serve ``path`` as the log of pod ``namespace/name`` (``kubectl logs``)."""
        self._log_files[(namespace, name)] = Path(path)

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
