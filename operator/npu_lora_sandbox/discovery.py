"""The API emulator's discovery and OpenAPI documents (see :class:`Discovery`)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

import aiohttp.web

from .resources import (
    VERBS,
    ApiError,
    ResourceType,
    _version_priority,
)

_OPENAPI_PARAMS = [
    {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
]
_PATCH_CONTENT = {
    t: {"schema": {"type": "object"}}
    for t in (
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    )
}


def _openapi_paths(rt: ResourceType, prefix: str, schema_name: str) -> dict[str, Any]:
    """The OpenAPI v3 paths of one resource: collection, object, and status when it has one.
    Each write declares ``fieldValidation`` (so ``kubectl apply`` validates on the server)."""
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}}

    def op(action: str, with_body: bool, patch: bool = False) -> dict[str, Any]:
        o: dict[str, Any] = {
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": _OPENAPI_PARAMS if with_body else [],
            "responses": {"200": {"description": "OK", "content": content}},
        }
        if with_body:
            o["requestBody"] = {"content": _PATCH_CONTENT if patch else content}
        return o

    base = (
        f"{prefix}/namespaces/{{namespace}}/{rt.plural}"
        if rt.namespaced
        else f"{prefix}/{rt.plural}"
    )
    paths = {
        base: {"get": op("list", False), "post": op("post", True)},
        f"{base}/{{name}}": {
            "get": op("get", False),
            "put": op("put", True),
            "patch": op("patch", True, True),
            "delete": op("delete", False),
        },
    }
    if rt.has_status:
        paths[f"{base}/{{name}}/status"] = {
            "get": op("get", False),
            "put": op("put", True),
            "patch": op("patch", True, True),
        }
    return paths


class Discovery:
    """Discovery (``/api``, ``/apis``, per group/version) and ``/openapi/v3``.

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

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
            schema_name = f"{rev_group}.{version}.{rt.kind}"
            body_schema = (
                copy.deepcopy(rt.schema)
                if rt.schema
                else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            )
            body_schema["x-kubernetes-group-version-kind"] = [
                {"group": group, "version": version, "kind": rt.kind}
            ]
            schemas[schema_name] = body_schema
            paths.update(_openapi_paths(rt, prefix, schema_name))
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (npu-lora sandbox)", "version": "v1.32.0"},
            "paths": paths,
            "components": {"schemas": schemas},
        }
