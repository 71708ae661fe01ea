"""Just enough Kubernetes protobuf decoding for kubectl's typed ``create`` requests.

``kubectl create namespace|configmap|secret|serviceaccount`` and ``kubectl auth can-i`` send
``application/vnd.kubernetes.protobuf`` bodies (``k8s\\0`` + ``runtime.Unknown``). This module
decodes those kinds (and the SubjectAccessReviews) into JSON-shaped dicts; anything else raises :class:`Unsupported`
(the emulator answers 415, and ``kubectl apply`` — always JSON — is the way around it).
"""

from __future__ import annotations

import base64
from typing import Any

__all__ = ["MAGIC", "Unsupported", "decode"]

MAGIC = b"k8s\x00"


class Unsupported(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, pos = _varint(data, pos)
        elif wire == 2:
            n, pos = _varint(data, pos)
            val = data[pos : pos + n]
            pos += n
        elif wire == 1:
            val = data[pos : pos + 8]
            pos += 8
        elif wire == 5:
            val = data[pos : pos + 4]
            pos += 4
        else:
            raise Unsupported(f"protobuf wire type {wire}")
        out.append((num, wire, val))
    return out


def _map(entries: list[bytes], as_bytes: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in entries:
        k = v = b""
        for num, _w, val in _fields(entry):
            if num == 1:
                k = val
            elif num == 2:
                v = val
        out[k.decode()] = base64.b64encode(v).decode() if as_bytes else v.decode()
    return out


def _group(fields: list[tuple[int, int, Any]]) -> dict[int, list[Any]]:
    grouped: dict[int, list[Any]] = {}
    for num, _w, val in fields:
        grouped.setdefault(num, []).append(val)
    return grouped


def _meta(data: bytes) -> dict[str, Any]:
    g = _group(_fields(data))
    meta: dict[str, Any] = {}
    for num, key in ((1, "name"), (2, "generateName"), (3, "namespace")):
        if num in g and g[num][-1]:
            meta[key] = g[num][-1].decode()
    if 11 in g:
        meta["labels"] = _map(g[11])
    if 12 in g:
        meta["annotations"] = _map(g[12])
    if 14 in g:
        meta["finalizers"] = [v.decode() for v in g[14]]
    return meta


_RESOURCE_ATTRS = ("namespace", "verb", "group", "version", "resource", "subresource", "name")


def _strings(data: bytes, names: tuple[str, ...]) -> dict[str, str]:
    g = _group(_fields(data))
    return {key: g[i + 1][-1].decode() for i, key in enumerate(names) if g.get(i + 1, [b""])[-1]}


def _review_spec(data: bytes, *, self_review: bool) -> dict[str, Any]:
    g = _group(_fields(data))
    spec: dict[str, Any] = {}
    if 1 in g:
        spec["resourceAttributes"] = _strings(g[1][-1], _RESOURCE_ATTRS)
    if 2 in g:
        spec["nonResourceAttributes"] = _strings(g[2][-1], ("path", "verb"))
    if not self_review:
        if 3 in g:
            spec["user"] = g[3][-1].decode()
        if 4 in g:
            spec["groups"] = [v.decode() for v in g[4]]
    return spec


def decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise Unsupported("not a Kubernetes protobuf envelope")
    g = _group(_fields(body[len(MAGIC) :]))
    tm = _group(_fields(g.get(1, [b""])[-1]))
    api_version = tm.get(1, [b""])[-1].decode()
    kind = tm.get(2, [b""])[-1].decode()
    raw = _group(_fields(g.get(2, [b""])[-1]))
    obj: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": _meta(raw.get(1, [b""])[-1]),
    }
    if (api_version, kind) == ("v1", "Namespace"):
        if 2 in raw:
            spec = _group(_fields(raw[2][-1]))
            if 1 in spec:
                obj["spec"] = {"finalizers": [v.decode() for v in spec[1]]}
    elif (api_version, kind) == ("v1", "ConfigMap"):
        if 2 in raw:
            obj["data"] = _map(raw[2])
        if 3 in raw:
            obj["binaryData"] = _map(raw[3], as_bytes=True)
        if 4 in raw:
            obj["immutable"] = bool(raw[4][-1])
    elif (api_version, kind) == ("v1", "Secret"):
        if 2 in raw:
            obj["data"] = _map(raw[2], as_bytes=True)
        if 3 in raw:
            obj["type"] = raw[3][-1].decode()
        if 4 in raw:
            obj["stringData"] = _map(raw[4])
        if 5 in raw:
            obj["immutable"] = bool(raw[5][-1])
    elif (api_version, kind) == ("v1", "ServiceAccount"):
        if 4 in raw:
            obj["automountServiceAccountToken"] = bool(raw[4][-1])
    elif api_version == "authorization.k8s.io/v1" and kind.endswith("SubjectAccessReview"):
        obj["spec"] = _review_spec(
            raw.get(2, [b""])[-1], self_review=kind == "SelfSubjectAccessReview"
        )
    else:
        raise Unsupported(f"protobuf bodies of {api_version} {kind}")
    return obj
