"""Authentication and impersonation of the API emulator (npu_lora_sandbox.auth), over HTTPS."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from npu_lora_sandbox.emulator import ApiEmulator

SECRETS = "/api/v1/namespaces/default/secrets"


def get(emu: ApiEmulator, path: str, token: str | None = None, **headers: str) -> tuple[int, Any]:
    h = dict(headers)
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(emu.url + path, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=10, context=emu.tls.client_context()) as r:
            body = r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        body, code = e.read(), e.code
    try:
        return code, json.loads(body)
    except ValueError:
        return code, body.decode()


def sa(emu: ApiEmulator, name: str, ns: str = "default") -> dict[str, Any]:
    return emu.create(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}
    )


def test_tokens_are_required_and_unknown_ones_get_401(emulator: ApiEmulator) -> None:
    assert get(emulator, SECRETS, emulator.admin_token)[0] == 200
    for token in ("sandbox", "", "sandbox-sa-default:default", emulator.admin_token[:-1]):
        for path in (SECRETS, "/version", "/api", "/healthz"):
            code, body = get(emulator, path, token)
            assert code == 401, (token, path, body)
            assert body == {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "Unauthorized",
                "reason": "Unauthorized",
                "code": 401,
            }
    code, _ = get(emulator, SECRETS, Authorization="Basic YWRtaW46YWRtaW4=")
    assert code == 401
    # a fresh emulator has a fresh admin token
    with ApiEmulator() as other:
        assert other.admin_token != emulator.admin_token
        assert get(other, SECRETS, emulator.admin_token)[0] == 401


def test_anonymous_gets_public_info_only(emulator: ApiEmulator) -> None:
    assert get(emulator, "/version")[0] == 200
    assert get(emulator, "/healthz") == (200, "ok")
    for path in ("/api", "/apis", "/openapi/v3", "/api/v1", SECRETS, "/api/v1/namespaces"):
        code, body = get(emulator, path)
        assert code == 403, (path, body)
        assert 'User "system:anonymous"' in body["message"]
    # the defaults are real RBAC objects, as on a cluster
    crb = emulator.get("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "system:discovery")
    assert crb is not None
    assert crb["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}
    ]


def test_service_account_tokens_are_random_stored_and_revoked(emulator: ApiEmulator) -> None:
    sa(emulator, "w")
    token = emulator.service_account_token("default", "w")
    assert token == emulator.service_account_token("default", "w")  # stored
    # random (not derived from the name as the old "sandbox-sa:<ns>:<name>" was)
    assert "default:w" not in token and len(token) > 40
    sa(emulator, "v")
    assert emulator.service_account_token("default", "v") != token
    assert get(emulator, "/api", token)[0] == 200  # authenticated: discovery
    code, body = get(emulator, SECRETS, token)
    assert code == 403
    assert body["message"] == (
        'secrets is forbidden: User "system:serviceaccount:default:w" cannot list resource '
        '"secrets" in API group "" in the namespace "default"'
    )
    # deleting the ServiceAccount revokes its token; a new one of the same name gets a new token
    emulator.delete("v1", "ServiceAccount", "w", namespace="default")
    assert get(emulator, "/api", token)[0] == 401
    sa(emulator, "w")
    assert get(emulator, "/api", token)[0] == 401
    fresh = emulator.service_account_token("default", "w")
    assert fresh != token and get(emulator, "/api", fresh)[0] == 200


def test_impersonation_needs_the_impersonate_verb(emulator: ApiEmulator) -> None:
    sa(emulator, "w")
    token = emulator.service_account_token("default", "w")
    admin = emulator.admin_token
    # the admin may impersonate: RBAC then applies to the impersonated user
    assert get(emulator, SECRETS, admin, **{"Impersonate-User": "alice"})[0] == 403
    code, body = get(emulator, SECRETS, token, **{"Impersonate-User": "system:admin"})
    assert code == 403
    assert body["message"] == (
        'users "system:admin" is forbidden: User "system:serviceaccount:default:w" cannot '
        'impersonate resource "users" in API group "" at the cluster scope'
    )
    code, _ = get(emulator, SECRETS, **{"Impersonate-User": "system:admin"})
    assert code == 403  # anonymous neither
    code, _ = get(emulator, SECRETS, admin, **{"Impersonate-Group": "system:masters"})
    assert code == 400  # a group without a user
    # granted impersonate on one user: that user only
    rbac = "rbac.authorization.k8s.io/v1"
    emulator.create(
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": "imp"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["users"],
                    "verbs": ["impersonate"],
                    "resourceNames": ["bob"],
                }
            ],
        }
    )
    emulator.create(
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "imp"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "imp",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "w", "namespace": "default"}],
        }
    )
    code, body = get(emulator, "/api/v1/namespaces", token, **{"Impersonate-User": "bob"})
    assert code == 403 and 'User "bob" cannot list' in body["message"]
    assert get(emulator, SECRETS, token, **{"Impersonate-User": "carol"})[0] == 403
    code, body = get(
        emulator, SECRETS, token, **{"Impersonate-User": "bob", "Impersonate-Group": "ops"}
    )
    assert code == 403 and 'impersonate resource "groups"' in body["message"]


@pytest.mark.parametrize("with_sa", [True, False])
def test_written_kubeconfigs_carry_the_tokens(
    emulator: ApiEmulator, tmp_path: Any, with_sa: bool
) -> None:
    import yaml

    if with_sa:
        sa(emulator, "w")
        path = emulator.write_kubeconfig(tmp_path / "kc", service_account=("default", "w"))
        expected = emulator.service_account_token("default", "w")
    else:
        path = emulator.write_kubeconfig(tmp_path / "kc")
        expected = emulator.admin_token
    cfg = yaml.safe_load(path.read_text())
    assert cfg["users"][0]["user"]["token"] == expected
    assert cfg["clusters"][0]["cluster"]["server"].startswith("https://")
    assert cfg["clusters"][0]["cluster"]["certificate-authority-data"]
    assert path.stat().st_mode & 0o077 == 0
