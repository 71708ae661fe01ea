"""Resource types, API errors and shared constants of the API emulator."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from npu_lora.api.timefmt import rfc3339

log = logging.getLogger(__name__)


T = TypeVar("T")


VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


HISTORY = 50_000  # watch events kept for resourceVersion-based resumption


SA_TOKEN_PREFIX = "sandbox-sa-"  # + 43 random characters: a ServiceAccount token (see .auth)


def now_iso() -> str:
    return rfc3339()


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


@dataclass
class _ParsedPath:
    group: str
    version: str
    rtype: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch_prefix: bool = False
