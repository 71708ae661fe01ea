"""The API emulator's garbage collector (see :class:`GarbageCollector`)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from .resources import (
    ApiError,
    ResourceType,
)


class GarbageCollector:
    """Garbage collection: finalizers, ownerReference cascades, orphaning, namespace contents.

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

    def _orphan_dependents(self, uid: str) -> None:
        for skey, objs in list(self._store.items()):
            for obj in list(objs.values()):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    rt = self._type_for_storage(skey)
                    if rt is None:
                        continue
                    new = copy.deepcopy(obj)
                    new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                    self._commit(rt, obj, new)

    def _existing_uids(self) -> set[str]:
        return {o["metadata"]["uid"] for objs in self._store.values() for o in objs.values()}

    def _after_write(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        if rt.kind == "CustomResourceDefinition":
            self._register_crd(obj)
        elif rt.kind == "Namespace" and rt.group == "" and old is None:
            ns = obj["metadata"]["name"]
            sa = self.resource_for("v1", "serviceaccounts")
            if (ns, "default") not in self._store[sa.storage_key]:
                with contextlib.suppress(ApiError):
                    self._create(sa, ns, {"metadata": {"name": "default"}})

    def _after_delete(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Cascade: dependents (ownerReferences), CRD instances, namespace contents."""
        if rt.kind == "CustomResourceDefinition":
            names = (obj.get("spec") or {}).get("names") or {}
            skey = ((obj.get("spec") or {}).get("group", ""), names.get("plural", ""))
            crt = self._type_for_storage(skey)
            if crt is not None:
                for ns, name in list(self._store[skey]):
                    with contextlib.suppress(ApiError):
                        self._force_delete(crt, ns, name)
            self._unregister_crd(obj["metadata"]["name"])
        if rt.kind == "Namespace" and rt.group == "":
            ns = obj["metadata"]["name"]
            for skey, objs in list(self._store.items()):
                nrt = self._type_for_storage(skey)
                if nrt is None or not nrt.namespaced:
                    continue
                for ons, oname in list(objs):
                    if ons == ns:
                        with contextlib.suppress(ApiError):
                            self._force_delete(nrt, ons, oname)
        self._collect_garbage(obj["metadata"]["uid"])

    def _force_delete(self, rt: ResourceType, ns: str, name: str) -> None:
        key = (ns, name)
        obj = self._store[rt.storage_key].get(key)
        if obj is None:
            return
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        del self._store[rt.storage_key][key]
        self._emit(rt, "DELETED", gone, obj)
        self._collect_garbage(gone["metadata"]["uid"])

    def _collect_garbage(self, owner_uid: str) -> None:
        """Background deletion of the dependents of a deleted owner (transitively)."""
        existing = None
        for skey, objs in list(self._store.items()):
            rt = self._type_for_storage(skey)
            if rt is None:
                continue
            for (ns, name), obj in list(objs.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == owner_uid for r in refs):
                    continue
                if existing is None:
                    existing = self._existing_uids()
                others = [r for r in refs if r.get("uid") != owner_uid and r.get("uid") in existing]
                if others:
                    new = copy.deepcopy(obj)
                    new["metadata"]["ownerReferences"] = [
                        r for r in refs if r.get("uid") != owner_uid
                    ]
                    self._commit(rt, obj, new)
                    continue
                with contextlib.suppress(ApiError):
                    self._delete(rt, ns or None, name)
