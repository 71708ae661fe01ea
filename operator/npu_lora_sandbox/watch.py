"""The API emulator's watches (see :class:`WatchHub`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp.web

from .resources import (
    ApiError,
    ResourceType,
)
from .selectors import (
    _truthy,
    parse_field_selector,
    parse_label_selector,
)


@dataclass
class _Watcher:
    storage_key: tuple[str, str] | None  # None: everything (internal subscribers)
    queue: asyncio.Queue[tuple[int, str, dict[str, Any], dict[str, Any] | None]]


class WatchHub:
    """Watches: in-process subscribers and HTTP watch streams over the change history.

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

    def subscribe(
        self, storage_keys: Iterable[tuple[str, str]] | None = None
    ) -> asyncio.Queue[Any]:
        """(Loop thread only.) A queue receiving ``(rv, type, obj, old)`` for every change."""
        q: asyncio.Queue[Any] = asyncio.Queue()
        keys = list(storage_keys) if storage_keys is not None else [None]
        for key in keys:
            w = _Watcher(key, q)
            self._watcher_objs[id(w)] = w
        return q

    def unsubscribe(self, q: asyncio.Queue[Any]) -> None:
        for wid, w in list(self._watcher_objs.items()):
            if w.queue is q:
                del self._watcher_objs[wid]

    async def _serve_watch(
        self,
        raw: aiohttp.web.BaseRequest,
        rt: ResourceType,
        namespace: str | None,
        q: Any,
        accept: str,
    ) -> aiohttp.web.StreamResponse:
        matches = self._watch_matcher(rt, namespace, q)
        initial, gone = self._watch_backlog(rt, q, matches)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        w = _Watcher(rt.storage_key, queue)
        self._watcher_objs[id(w)] = w
        resp = aiohttp.web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"}
        )
        resp.enable_chunked_encoding()
        encode = self._watch_encoder(rt, q, "as=Table" in accept)
        try:
            await resp.prepare(raw)
            if gone:
                rv_param = q.get("resourceVersion") or ""
                expired = ApiError(
                    410,
                    "Expired",
                    f"too old resource version: {rv_param} ({self._history[0][0]})",
                )
                await resp.write(encode("ERROR", expired.status))
                return resp
            for etype, obj in initial:
                await resp.write(encode(etype, obj))
            if _truthy(q.get("sendInitialEvents")) and _truthy(q.get("allowWatchBookmarks")):
                await resp.write(encode("BOOKMARK", self._initial_events_end(rt)))
            await self._stream_events(resp, queue, q, matches, encode)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self._watcher_objs.pop(id(w), None)
        return resp

    @staticmethod
    def _watch_matcher(
        rt: ResourceType, namespace: str | None, q: Any
    ) -> Callable[[dict[str, Any] | None], bool]:
        """Whether an object is in the watch (namespace, label and field selectors)."""
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(q.get("fieldSelector"))

        def matches(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            if namespace and rt.namespaced and obj["metadata"].get("namespace") != namespace:
                return False
            return lsel(obj["metadata"].get("labels") or {}) and fsel(obj)

        return matches

    def _watch_backlog(
        self, rt: ResourceType, q: Any, matches: Callable[[dict[str, Any] | None], bool]
    ) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        """The events before the stream: synthetic ADDED (no/"0" resourceVersion, or
        sendInitialEvents), else the history since the resourceVersion; and whether that
        history is gone (410)."""
        rv_param = q.get("resourceVersion") or ""
        if _truthy(q.get("sendInitialEvents")) or rv_param in ("", "0"):
            return [("ADDED", o) for o in self._select(rt, None) if matches(o)], False
        try:
            since = int(rv_param)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid resource version {rv_param!r}") from exc
        gone = bool(
            self._history
            and self._history[0][0] > since + 1
            and len(self._history) == self._history.maxlen
        )
        initial: list[tuple[str, dict[str, Any]]] = []
        for erv, skey, etype, obj, old in self._history:
            if erv <= since or skey != rt.storage_key:
                continue
            ev = self._filter_event(etype, obj, old, matches)
            if ev is not None:
                initial.append(ev)
        return initial, gone

    def _watch_encoder(
        self, rt: ResourceType, q: Any, as_table: bool
    ) -> Callable[[str, dict[str, Any]], bytes]:
        """One JSON line per event (Table rows: the column definitions only in the first)."""
        first_table = [True]

        def encode(etype: str, obj: dict[str, Any]) -> bytes:
            if etype in ("BOOKMARK", "ERROR"):
                payload = obj
            elif as_table:
                payload = self._table(rt, [obj], q, with_columns=first_table[0])
                first_table[0] = False
            else:
                payload = self._out(rt, obj)
            return (
                json.dumps({"type": etype, "object": payload}, separators=(",", ":")).encode()
                + b"\n"
            )

        return encode

    def _initial_events_end(self, rt: ResourceType) -> dict[str, Any]:
        return {
            "kind": rt.kind,
            "apiVersion": rt.api_version,
            "metadata": {
                "resourceVersion": str(self._rv),
                "annotations": {"k8s.io/initial-events-end": "true"},
            },
        }

    async def _stream_events(
        self,
        resp: aiohttp.web.StreamResponse,
        queue: asyncio.Queue[Any],
        q: Any,
        matches: Callable[[dict[str, Any] | None], bool],
        encode: Callable[[str, dict[str, Any]], bytes],
    ) -> None:
        """Write the watcher's queued changes until ``timeoutSeconds`` or STOP."""
        timeout = float(q.get("timeoutSeconds") or 0) or None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        while True:
            wait = None if deadline is None else deadline - loop.time()
            if wait is not None and wait <= 0:
                break
            try:
                _rv, etype, obj, old = await asyncio.wait_for(queue.get(), timeout=wait)
            except TimeoutError:
                break
            if etype == "STOP":
                break
            ev = self._filter_event(etype, obj, old, matches)
            if ev is not None:
                await resp.write(encode(*ev))

    @staticmethod
    def _filter_event(
        etype: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        matches: Callable[[dict[str, Any] | None], bool],
    ) -> tuple[str, dict[str, Any]] | None:
        if matches(obj):
            if etype == "MODIFIED" and old is not None and not matches(old):
                return ("ADDED", obj)
            return (etype, obj)
        if etype == "MODIFIED" and matches(old):
            return ("DELETED", obj)
        return None
