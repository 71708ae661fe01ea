"""The API emulator's authentication and authorization (see :class:`Authorizer`).

Authentication, as a real API server does it (:meth:`Authorizer._identity`):

- ``Authorization: Bearer <token>``: the sandbox admin's token (``ApiEmulator.admin_token``,
  random per emulator, in the kubeconfig ``write_kubeconfig`` writes) is the admin, whose
  requests RBAC does not check; a ServiceAccount token (``ApiEmulator.service_account_token``:
  random, issued once per ServiceAccount and stored, bound to the ServiceAccount's uid, so it
  stops working when the ServiceAccount is deleted) is ``system:serviceaccount:<ns>:<name>``;
  any other token, or any other credential, is answered ``401 Unauthorized`` (a Status), on
  every path, discovery included;
- no credentials: ``system:anonymous`` in the group ``system:unauthenticated``.

Impersonation headers (``kubectl --as``/``--as-group``) are honoured only for an identity allowed
to ``impersonate`` them (the admin; anyone else needs an RBAC rule with that verb on ``users``,
``groups`` or ``serviceaccounts``), else 403.

Authorization is RBAC (:meth:`Authorizer.authorize`) over the stored (Cluster)Role(Binding)s,
for resource requests and for non-resource paths (discovery, ``/version``, ``/healthz``,
``/openapi``) alike. The emulator starts with a real cluster's default bindings
(:data:`DEFAULT_RBAC`): ``system:public-info-viewer`` (``/healthz``, ``/livez``, ``/readyz``,
``/version``) for everyone, anonymous included; ``system:discovery`` (``/api``, ``/apis``,
``/openapi``, ...) and ``system:basic-user`` (SelfSubjectAccessReviews) for authenticated users
only. Every decision on a resource request of a non-admin identity is recorded as a
:class:`Decision` (:meth:`Authorizer.authorization_log`), so tests can see which permissions a
client really used and which it was denied.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import secrets
from collections.abc import Iterable, Iterator
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
#: who is writing (the store's RBAC escalation check reads it; None: the admin, in-process calls)
_ACTOR: contextvars.ContextVar[Identity] = contextvars.ContextVar("sandbox_actor", default=None)

ANONYMOUS = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
AUTHENTICATED = "system:authenticated"
#: where a request's identity is kept (aiohttp < 3.12 has no RequestKey: a plain string)
_IDENTITY_KEY: Any = (
    aiohttp.web.RequestKey("npu_lora_sandbox.identity", object)
    if hasattr(aiohttp.web, "RequestKey")
    else "npu_lora_sandbox.identity"
)

_PUBLIC_INFO = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
_DISCOVERY = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
]


def _default_role(
    name: str, rules: list[dict[str, Any]], groups: list[str]
) -> list[dict[str, Any]]:
    meta = {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}
    return [
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules},
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": copy.deepcopy(meta),
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": g} for g in groups],
        },
    ]


#: a real cluster's default ClusterRoles and bindings for discovery and self-reviews
DEFAULT_RBAC: list[dict[str, Any]] = [
    *_default_role(
        "system:public-info-viewer",
        [{"nonResourceURLs": _PUBLIC_INFO, "verbs": ["get"]}],
        [AUTHENTICATED, UNAUTHENTICATED],
    ),
    *_default_role(
        "system:discovery", [{"nonResourceURLs": _DISCOVERY, "verbs": ["get"]}], [AUTHENTICATED]
    ),
    *_default_role(
        "system:basic-user",
        [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            }
        ],
        [AUTHENTICATED],
    ),
]


def unauthorized() -> ApiError:
    """The apiserver's answer to a credential it does not accept."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def new_token(prefix: str) -> str:
    """A random bearer token (unguessable: 256 bits)."""
    return f"{prefix}{secrets.token_urlsafe(32)}"


def _forbidden_impersonation(user: str, kind: str, name: str, ns: str = "") -> ApiError:
    where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
    return ApiError(
        403,
        "Forbidden",
        f'{kind} "{name}" is forbidden: User "{user}" cannot impersonate resource "{kind}" '
        f'in API group ""{where}',
        {"name": name, "kind": kind},
    )


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
    """The groups every authenticated user (and every ServiceAccount) is in; the anonymous
    user is in ``system:unauthenticated`` only."""
    if user == ANONYMOUS:
        return [*groups, UNAUTHENTICATED] if UNAUTHENTICATED not in groups else list(groups)
    groups = [*groups, AUTHENTICATED]
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


def _simple_rules(rule: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A rule broken into single (group, resource, verb, name) or (url, verb) rules."""
    verbs = rule.get("verbs") or []
    for url in rule.get("nonResourceURLs") or []:
        for verb in verbs:
            yield {"nonResourceURLs": [url], "verbs": [verb]}
    for group in rule.get("apiGroups") or ([""] if rule.get("resources") else []):
        for res in rule.get("resources") or []:
            for verb in verbs:
                for rname in rule.get("resourceNames") or [None]:
                    out = {"apiGroups": [group], "resources": [res], "verbs": [verb]}
                    if rname is not None:
                        out["resourceNames"] = [rname]
                    yield out


def _covers(held: dict[str, Any], want: dict[str, Any]) -> bool:
    verbs = held.get("verbs") or []
    if want["verbs"][0] not in verbs and "*" not in verbs:
        return False
    if "nonResourceURLs" in want:
        url = want["nonResourceURLs"][0]
        return any(
            u == url or u == "*" or (u.endswith("*") and url.startswith(u[:-1]))
            for u in held.get("nonResourceURLs") or []
        )
    groups, resources = held.get("apiGroups") or [], held.get("resources") or []
    group, res = want["apiGroups"][0], want["resources"][0]
    if group not in groups and "*" not in groups:
        return False
    sub = res.split("/", 1)[1] if "/" in res else ""
    if res not in resources and "*" not in resources and not (sub and f"*/{sub}" in resources):
        return False
    names = held.get("resourceNames") or []
    return not names or (want.get("resourceNames") or [None])[0] in names


def _not_covered(wanted: list[dict[str, Any]], held: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The single rules of ``wanted`` that no rule of ``held`` covers."""
    return [
        w
        for rule in wanted
        if isinstance(rule, dict)
        for w in _simple_rules(rule)
        if not any(_covers(h, w) for h in held if isinstance(h, dict))
    ]


def _rule_text(rule: dict[str, Any]) -> str:
    parts = []
    for key in ("apiGroups", "resources", "resourceNames", "nonResourceURLs", "verbs"):
        if rule.get(key):
            parts.append(f"{key[0].upper()}{key[1:]}:{rule[key]}")
    return "{" + ", ".join(parts) + "}"


class Authorizer:
    """Authentication (who is asking) and RBAC authorization against the stored Roles and
    bindings; (Self|Local)SubjectAccessReviews; the log of decisions.

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

    def _identity(self, raw: aiohttp.web.BaseRequest) -> Identity:
        """Who is asking (see the module docstring): ``None`` for the sandbox admin, else
        ``(user, groups)``. Raises ``ApiError`` 401 for a credential it does not accept, 403
        for impersonation the caller may not do. Computed once per request."""
        if _IDENTITY_KEY not in raw:
            raw[_IDENTITY_KEY] = self._impersonate(self._authenticate(raw.headers), raw.headers)
        return raw[_IDENTITY_KEY]  # type: ignore[no-any-return]

    def _authenticate(self, headers: Any) -> Identity:
        auth = headers.get("Authorization")
        if auth is None:
            return ANONYMOUS, [UNAUTHENTICATED]
        scheme, _, token = auth.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized()
        if secrets.compare_digest(token, self.admin_token):
            return None
        sa = self._service_account_of_token(token)
        if sa is None:
            raise unauthorized()
        return f"system:serviceaccount:{sa[0]}:{sa[1]}", []

    def _service_account_of_token(self, token: str) -> tuple[str, str] | None:
        """``(namespace, name)`` of a ServiceAccount token still valid (its ServiceAccount
        exists with the uid it was issued for), else None."""
        with self._tlock:
            issued = self._sa_tokens.get(token)
            if issued is None:
                return None
            ns, name, uid = issued
            sa = self._store[("", "serviceaccounts")].get((ns, name))
        if uid and ((sa or {}).get("metadata") or {}).get("uid") != uid:
            return None  # the ServiceAccount was deleted (and maybe re-created)
        return ns, name

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token that authenticates as ``system:serviceaccount:<namespace>:<name>``:
        random, issued once per ServiceAccount (and uid) and stored. Bound to the
        ServiceAccount's uid when it exists, so deleting the ServiceAccount revokes it (a token
        issued before the ServiceAccount exists stays valid: the sandbox kubelet does not refuse
        pods whose ServiceAccount is missing)."""
        with self._tlock:
            sa = self._store[("", "serviceaccounts")].get((namespace, name))
            uid = str(((sa or {}).get("metadata") or {}).get("uid") or "")
            key = (namespace, name, uid)
            token = self._sa_token_of.get(key)
            if token is None:
                token = new_token(SA_TOKEN_PREFIX)
                self._sa_token_of[key] = token
                self._sa_tokens[token] = key
            return token

    def _impersonate(self, identity: Identity, headers: Any) -> Identity:
        """Apply ``Impersonate-User``/``Impersonate-Group`` when ``identity`` may (403 else)."""
        user = headers.get("Impersonate-User")
        groups = list(headers.getall("Impersonate-Group", []))
        if not user:
            if groups:
                raise ApiError(
                    400, "BadRequest", "requested group impersonation without impersonating a user"
                )
            return identity
        if identity is not None:
            who, who_groups = identity
            if user.startswith("system:serviceaccount:") and user.count(":") == 3:
                ns, name = user.split(":")[2:]
                targets = [("serviceaccounts", name, ns)]
            else:
                targets = [("users", user, "")]
            targets += [("groups", g, "") for g in groups]
            for kind, name, ns in targets:
                attrs = {
                    "verb": "impersonate",
                    "group": "",
                    "resource": kind,
                    "subresource": "",
                    "name": name,
                    "namespace": ns,
                }
                allowed, _ = self.authorize(who, who_groups, attrs)
                self._record(Decision(user=who, allowed=allowed, **attrs))
                if not allowed:
                    raise _forbidden_impersonation(who, kind, name, ns)
        return user, groups

    def _authorize_path(self, identity: Identity, method: str, path: str) -> None:
        """RBAC on a non-resource path (discovery, /version, /healthz, /openapi): 403 if denied."""
        if identity is None:
            return
        verb = {"GET": "get", "HEAD": "head", "POST": "post", "PUT": "put"}.get(method, method)
        verb = verb.lower()
        user, groups = identity
        allowed, _ = self.authorize(user, groups, {}, {"path": path, "verb": verb})
        if not allowed:
            raise ApiError(
                403, "Forbidden", f'forbidden: User "{user}" cannot {verb} path "{path}"', {}
            )

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

    @contextlib.contextmanager
    def acting_as(self, identity: Identity) -> Iterator[None]:
        """Writes to the store within are ``identity``'s (for :meth:`_check_escalation`)."""
        token = _ACTOR.set(identity)
        try:
            yield
        finally:
            _ACTOR.reset(token)

    def _held_rules(self, user: str, groups: list[str], namespace: str) -> list[dict[str, Any]]:
        """The rules ``user`` holds in ``namespace`` (cluster-wide ones only for "")."""
        groups = _all_groups(user, groups)
        rules = [r for _n, _b, rs in self._bound_rules(user, groups, "") for r in rs]
        if namespace:
            rules += [r for _n, _b, rs in self._bound_rules(user, groups, namespace) for r in rs]
        return rules

    def _check_escalation(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """RBAC escalation prevention, as the API server applies it to a non-admin writer:
        a Role/ClusterRole only with rules the writer holds (in the Role's namespace; cluster-
        wide for a ClusterRole) or with the ``escalate`` verb on it; a RoleBinding/
        ClusterRoleBinding only with the ``bind`` verb on the referenced role or holding all of
        its rules. 403 Forbidden naming the rules not held."""
        actor = _ACTOR.get()
        if actor is None or rt.group != RBAC:
            return
        user, groups = actor
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        if rt.plural in ("roles", "clusterroles"):
            verb, target, wanted = "escalate", (rt.plural, name), obj.get("rules") or []
        elif rt.plural in ("rolebindings", "clusterrolebindings"):
            ref = obj.get("roleRef") or {}
            plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            verb, target = "bind", (plural, str(ref.get("name") or ""))
            role = self._store[(RBAC, plural)].get(
                ("" if plural == "clusterroles" else ns, target[1])
            )
            wanted = None if role is None else list(role.get("rules") or [])
        else:
            return
        attrs = {
            "verb": verb,
            "group": RBAC,
            "resource": target[0],
            "subresource": "",
            "name": target[1],
            "namespace": ns,
        }
        if self.authorize(user, groups, attrs)[0]:
            return
        if wanted is None:
            raise ApiError(
                403,
                "Forbidden",
                f'{rt.qualified} "{name}" is forbidden: user "{user}" cannot bind '
                f'{target[0]} "{target[1]}": it does not exist and the user has no "bind" on it',
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        missing = _not_covered(wanted, self._held_rules(user, groups, ns))
        if not missing:
            return
        lines = "\n".join(_rule_text(r) for r in missing[:20])
        more = f"\n... and {len(missing) - 20} more" if len(missing) > 20 else ""
        raise ApiError(
            403,
            "Forbidden",
            f'{rt.qualified} "{name}" is forbidden: user "{user}" (groups={_all_groups(user, groups)}) '
            f"is attempting to grant RBAC permissions not currently held:\n{lines}{more}",
            {"name": name, "group": rt.group, "kind": rt.plural},
        )

    def _role_rules(self, ref: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            role = self._store[(RBAC, "clusterroles")].get(("", ref.get("name", "")))
        else:
            role = self._store[(RBAC, "roles")].get((ns, ref.get("name", "")))
        return list((role or {}).get("rules") or [])
