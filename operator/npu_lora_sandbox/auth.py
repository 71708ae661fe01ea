"""The API emulator's authentication and authorization (see :class:`Authorizer`).

Authentication is one function, :func:`authenticate` (request headers -> identity); RBAC is
:meth:`Authorizer.authorize` over the stored (Cluster)Role(Binding)s. Every decision on an HTTP
request is recorded as a :class:`Decision` (:meth:`Authorizer.authorization_log`), so tests can
see which permissions a client really used and which it was denied.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp.web

from .resources import SA_TOKEN_PREFIX, ApiError, ResourceType, _ParsedPath
from .selectors import _truthy

RBAC = "rbac.authorization.k8s.io"
#: recorded decisions kept (oldest dropped first)
DECISIONS_KEPT = 100_000

#: ``(user, groups)``; ``None`` is the sandbox admin, whose requests RBAC does not check
Identity = tuple[str, list[str]] | None


def authenticate(headers: Any) -> Identity:
    """Who is asking: impersonation headers (``kubectl --as``), else a ServiceAccount token
    (``Bearer sandbox-sa:<ns>:<name>``, see ``ApiEmulator.service_account_token``), else the
    sandbox admin (``None``: a request without a token, or with any other token, is the admin).

    ``headers`` is the request's multi-dict. This is the one place a real bearer-token
    authentication (token -> user, unknown tokens -> 401) would go.
    """
    user = headers.get("Impersonate-User")
    if user:
        return user, list(headers.getall("Impersonate-Group", []))
    auth = headers.get("Authorization", "")
    if auth.startswith(f"Bearer {SA_TOKEN_PREFIX}"):
        ns, _, name = auth[len("Bearer ") + len(SA_TOKEN_PREFIX) :].partition(":")
        return f"system:serviceaccount:{ns}:{name}", []
    return None


@dataclass(frozen=True)
class Decision:
    """One authorization decision on an HTTP request by a non-admin identity."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    allowed: bool

    @property
    def permission(self) -> tuple[str, str, str]:
        """``(apiGroup, resource[/subresource], verb)``, as an RBAC rule names it."""
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return self.group, res, self.verb


def request_verb(method: str, pp: _ParsedPath, q: Any) -> str:
    """The RBAC verb of an HTTP request."""
    if method == "GET":
        watching = pp.watch_prefix or _truthy(q.get("watch"))
        return "watch" if watching else ("get" if pp.name else "list")
    if method == "DELETE":
        return "delete" if pp.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")


def _all_groups(user: str, groups: list[str]) -> list[str]:
    """The groups every authenticated user (and every ServiceAccount) is in."""
    groups = [*groups, "system:authenticated"]
    if user.startswith("system:serviceaccount:"):
        sa_ns = user.split(":")[2]
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}"]
    return groups


def _subject_matches(subj: dict[str, Any], binding_ns: str, user: str, groups: list[str]) -> bool:
    kind = subj.get("kind")
    if kind == "ServiceAccount":
        sns = subj.get("namespace") or binding_ns
        return user == f"system:serviceaccount:{sns}:{subj.get('name')}"
    if kind == "User":
        return subj.get("name") == user
    if kind == "Group":
        return subj.get("name") in groups
    return False


def _non_resource_rule_matches(rule: dict[str, Any], non_resource: dict[str, Any]) -> bool:
    urls = rule.get("nonResourceURLs") or []
    path = non_resource.get("path", "")
    return (
        non_resource.get("verb") in rule.get("verbs", []) or "*" in rule.get("verbs", [])
    ) and any(u == path or u == "*" or (u.endswith("*") and path.startswith(u[:-1])) for u in urls)


def _rule_matches(
    rule: dict[str, Any], attrs: dict[str, Any], non_resource: dict[str, Any] | None
) -> bool:
    if non_resource is not None:
        return _non_resource_rule_matches(rule, non_resource)
    verb = attrs.get("verb", "")
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


class Authorizer:
    """Authentication (who is asking) and RBAC authorization against the stored Roles and
    bindings; (Self|Local)SubjectAccessReviews; the log of decisions.

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

    @staticmethod
    def _identity(raw: aiohttp.web.BaseRequest) -> Identity:
        """``None`` for the sandbox admin; else ``(user, groups)`` (see :func:`authenticate`)."""
        return authenticate(raw.headers)

    def authorization_log(self) -> list[Decision]:
        """The decisions on HTTP requests of non-admin identities so far, oldest first."""
        return list(self._decisions)

    def _record(self, decision: Decision) -> None:
        self._decisions.append(decision)

    def _enforce(
        self,
        identity: tuple[str, list[str]],
        rt: ResourceType,
        method: str,
        q: Any,
        pp: _ParsedPath,
    ) -> None:
        verb = request_verb(method, pp, q)
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
        self._record(Decision(user=user, allowed=allowed, **attrs))
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
        groups = _all_groups(user, groups)
        for name, _bns, rules in self._bound_rules(user, groups, ""):
            if any(_rule_matches(r, attrs, non_resource) for r in rules):
                return True, f'RBAC: allowed by ClusterRoleBinding "{name}"'
        ns = attrs.get("namespace") or ""
        if ns and non_resource is None:
            for name, bns, rules in self._bound_rules(user, groups, ns):
                if any(_rule_matches(r, attrs, non_resource) for r in rules):
                    return True, f'RBAC: allowed by RoleBinding "{name}/{bns}"'
        return False, ""

    def _bound_rules(
        self, user: str, groups: list[str], namespace: str
    ) -> Iterable[tuple[str, str, list[dict[str, Any]]]]:
        """``(binding name, binding namespace, rules)`` of the bindings naming the subject:
        ClusterRoleBindings when ``namespace`` is "", else that namespace's RoleBindings."""
        if namespace:
            bindings = [
                (name, bns, rb)
                for (bns, name), rb in self._store[(RBAC, "rolebindings")].items()
                if bns == namespace
            ]
        else:
            bindings = [
                (name, "", crb)
                for (_, name), crb in self._store[(RBAC, "clusterrolebindings")].items()
            ]
        for name, bns, binding in bindings:
            if any(_subject_matches(s, bns, user, groups) for s in binding.get("subjects") or []):
                yield name, bns, self._role_rules(binding.get("roleRef") or {}, bns)

    def _role_rules(self, ref: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            role = self._store[(RBAC, "clusterroles")].get(("", ref.get("name", "")))
        else:
            role = self._store[(RBAC, "roles")].get((ns, ref.get("name", "")))
        return list((role or {}).get("rules") or [])
