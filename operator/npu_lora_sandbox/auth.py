"""The API emulator's authentication and authorization (see :class:`Authorizer`)."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp.web

from .resources import (
    SA_TOKEN_PREFIX,
    ApiError,
    ResourceType,
    _ParsedPath,
)
from .selectors import _truthy


class Authorizer:
    """Authentication (who is asking) and RBAC authorization against the stored Roles and
    bindings; (Self|Local)SubjectAccessReviews.

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

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
