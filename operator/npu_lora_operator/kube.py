"""A thin JSON-in/JSON-out layer over the ``kubernetes`` client's REST machinery.

The operator works on plain dicts (as the apiserver sends them), not on the generated typed
models: the builders are pure dict functions, and raw JSON never loses unknown fields.
Authentication and TLS come from the client's configuration (in-cluster or kubeconfig).
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import quote

import kubernetes
from kubernetes.client.exceptions import ApiException
from npu_lora.api.v1alpha1 import MERGE_PATCH

Body = dict[str, Any]

#: apiVersion → (path prefix, plural) of the kinds the operator touches
_KINDS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("batch/v1", "Job"): "jobs",
}


class KubeError(Exception):
    """An API error: ``code`` (HTTP status), ``reason``, ``message`` from the metav1.Status."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


def load_config(kubeconfig: str | None = None, context: str | None = None) -> None:
    """In-cluster config when running in a pod (and no kubeconfig is named), else kubeconfig."""
    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config()
            return
        except kubernetes.config.ConfigException:
            pass
    kubernetes.config.load_kube_config(config_file=kubeconfig, context=context)


def collection_path(api_version: str, plural: str, namespace: str | None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace:
        return f"{base}/namespaces/{quote(namespace)}/{plural}"
    return f"{base}/{plural}"


def object_path(
    api_version: str, plural: str, namespace: str | None, name: str, sub: str | None = None
) -> str:
    p = f"{collection_path(api_version, plural, namespace)}/{quote(name)}"
    return f"{p}/{sub}" if sub else p


def plural_of(api_version: str, kind: str) -> str:
    try:
        return _KINDS[(api_version, kind)]
    except KeyError:
        return kind.lower() + "s"


class Kube:
    """Raw JSON requests with the default (or a given) ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: kubernetes.client.ApiClient | None = None, timeout: float = 30):
        self._api = api_client
        self._lock = threading.Lock()
        self.timeout = timeout

    @property
    def api(self) -> kubernetes.client.ApiClient:
        with self._lock:
            if self._api is None:
                self._api = kubernetes.client.ApiClient()
            return self._api

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Body:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        m, url, hdrs, data, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(
                m, url, header_params=hdrs, body=data, _request_timeout=self.timeout
            )
            raw = resp.read()
            status = resp.status
        except ApiException as e:  # pragma: no cover - depends on client version
            raw, status = (e.body or b""), e.status or 0
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")
        try:
            payload = json.loads(text) if text else {}
        except ValueError:
            payload = {"message": text}
        if not 200 <= status <= 299:
            raise KubeError(status, payload.get("reason", ""), payload.get("message", text))
        return payload

    # convenience -----------------------------------------------------------------------------

    def get(self, api_version: str, plural: str, name: str, namespace: str | None) -> Body | None:
        try:
            return self.request("GET", object_path(api_version, plural, namespace, name))
        except KubeError as e:
            if e.code == 404:
                return None
            raise

    def list(
        self, api_version: str, plural: str, namespace: str | None, label_selector: str = ""
    ) -> list[Body]:
        q = {"labelSelector": label_selector} if label_selector else None
        out = self.request("GET", collection_path(api_version, plural, namespace), query=q)
        return list(out.get("items") or [])

    def create(self, obj: Body) -> Body:
        ns = (obj.get("metadata") or {}).get("namespace")
        plural = plural_of(obj["apiVersion"], obj["kind"])
        return self.request("POST", collection_path(obj["apiVersion"], plural, ns), obj)

    def merge_patch(
        self,
        api_version: str,
        plural: str,
        name: str,
        namespace: str | None,
        patch: Body,
        sub: str | None = None,
    ) -> Body:
        path = object_path(api_version, plural, namespace, name, sub)
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None) -> None:
        try:
            self.request(
                "DELETE",
                object_path(api_version, plural, namespace, name),
                {"propagationPolicy": "Background"},
            )
        except KubeError as e:
            if e.code != 404:
                raise
