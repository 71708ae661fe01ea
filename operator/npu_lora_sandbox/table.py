"""Server-side ``meta.k8s.io/v1`` Table rendering (what ``kubectl get`` prints).

Custom resources use their CRD's ``additionalPrinterColumns`` (NAME first, then the columns; with
no columns declared NAME and AGE, like the apiserver); ``date`` columns become ages (``5m``).
A few built-ins get their familiar kubectl columns (pods, jobs, namespaces, configmaps, nodes,
events, ...); any other kind gets NAME and AGE.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from . import jsonpath

__all__ = ["build_table", "human_duration"]

Column = dict[str, Any]


def parse_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """Go's ``k8s.io/apimachinery/pkg/util/duration.HumanDuration``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rem = s % 60
        return f"{minutes}m{rem}s" if rem else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rem = minutes % 60
        return f"{hours}h{rem}m" if rem else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rem = hours % 24
        return f"{hours // 24}d{rem}h" if rem else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rem = (hours // 24) % 365
        return f"{hours // 24 // 365}y{rem}d" if rem else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def age(value: Any) -> str:
    t = parse_time(value)
    if t is None:
        return "<unknown>"
    return human_duration((_now() - t).total_seconds())


def _col(
    name: str, typ: str = "string", priority: int = 0, fmt: str = "", desc: str = ""
) -> Column:
    return {
        "name": name,
        "type": typ,
        "format": fmt,
        "description": desc or name,
        "priority": priority,
    }


NAME_COL = _col("Name", fmt="name", desc="Name must be unique within a namespace.")
AGE_COL = _col(
    "Age",
    desc="CreationTimestamp is a timestamp representing the server time when this object was created.",
)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


# ---------------------------------------------------------------- custom resources


def _crd_cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
    try:
        values = jsonpath.find(obj, column.get("jsonPath", ""))
    except ValueError:
        return None
    if not values:
        return None
    value: Any = values[0] if len(values) == 1 else ",".join(str(v) for v in values)
    typ = column.get("type", "string")
    if typ == "date":
        t = parse_time(value)
        return human_duration((_now() - t).total_seconds()) if t else value
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, separators=(",", ":"))
    if typ == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def crd_columns(printer_columns: list[dict[str, Any]] | None) -> list[Column]:
    if not printer_columns:
        return [NAME_COL, AGE_COL]
    cols = [NAME_COL]
    for pc in printer_columns:
        typ = pc.get("type", "string")
        cols.append(
            _col(
                pc.get("name", ""),
                typ="string" if typ == "date" else typ,
                priority=int(pc.get("priority", 0)),
                fmt=pc.get("format", ""),
                desc=pc.get("description", ""),
            )
        )
    return cols


def crd_cells(obj: dict[str, Any], printer_columns: list[dict[str, Any]] | None) -> list[Any]:
    name = _meta(obj).get("name")
    if not printer_columns:
        return [name, age(_meta(obj).get("creationTimestamp"))]
    return [name] + [_crd_cell(obj, pc) for pc in printer_columns]


# ---------------------------------------------------------------- built-ins


def _pod_status(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated"):
            term = state["terminated"]
            reason = term.get("reason") or (
                f"ExitCode:{term.get('exitCode')}" if term.get("exitCode") else "Completed"
            )
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            reason = "Pending"
    if _meta(pod).get("deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def _pod_row(pod: dict[str, Any]) -> list[Any]:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount") or 0) for cs in statuses)
    return [
        _meta(pod).get("name"),
        f"{ready}/{len(containers)}",
        _pod_status(pod),
        restarts,
        age(_meta(pod).get("creationTimestamp")),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        "<none>",
        "<none>",
    ]


_POD_COLS = [
    NAME_COL,
    _col("Ready"),
    _col("Status"),
    _col("Restarts", "string"),
    AGE_COL,
    _col("IP", priority=1),
    _col("Node", priority=1),
    _col("Nominated Node", priority=1),
    _col("Readiness Gates", priority=1),
]


def _job_status(job: dict[str, Any]) -> str:
    conds = {
        c.get("type"): c
        for c in (job.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    for t in ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet", "Suspended"):
        if t in conds:
            return t
    if _meta(job).get("deletionTimestamp"):
        return "Terminating"
    return "Running"


def _job_row(job: dict[str, Any]) -> list[Any]:
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    completions = spec.get("completions")
    succeeded = status.get("succeeded") or 0
    comp = (
        f"{succeeded}/{completions}"
        if completions is not None
        else f"{succeeded}/1 of {spec.get('parallelism', 1)}"
    )
    start = parse_time(status.get("startTime"))
    end = parse_time(status.get("completionTime"))
    duration = ""
    if start is not None:
        duration = human_duration(((end or _now()) - start).total_seconds())
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    selector = ",".join(
        f"{k}={v}" for k, v in ((spec.get("selector") or {}).get("matchLabels") or {}).items()
    )
    return [
        _meta(job).get("name"),
        _job_status(job),
        comp,
        duration,
        age(_meta(job).get("creationTimestamp")),
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
        selector,
    ]


_JOB_COLS = [
    NAME_COL,
    _col("Status"),
    _col("Completions"),
    _col("Duration"),
    AGE_COL,
    _col("Containers", priority=1),
    _col("Images", priority=1),
    _col("Selector", priority=1),
]


def _node_row(node: dict[str, Any]) -> list[Any]:
    ready = "Unknown"
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            ready = "Ready" if c.get("status") == "True" else "NotReady"
    return [
        _meta(node).get("name"),
        ready,
        "<none>",
        age(_meta(node).get("creationTimestamp")),
        ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""),
    ]


def _event_row(ev: dict[str, Any]) -> list[Any]:
    inv = ev.get("involvedObject") or ev.get("regarding") or {}
    last = (
        ev.get("lastTimestamp")
        or ev.get("eventTime")
        or ev.get("deprecatedLastTimestamp")
        or _meta(ev).get("creationTimestamp")
    )
    return [
        age(last),
        ev.get("type", ""),
        ev.get("reason", ""),
        f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}",
        ev.get("message") or ev.get("note") or "",
    ]


_SIMPLE: dict[str, tuple[list[Column], Callable[[dict[str, Any]], list[Any]]]] = {
    "Pod": (_POD_COLS, _pod_row),
    "Job": (_JOB_COLS, _job_row),
    "Namespace": (
        [NAME_COL, _col("Status"), AGE_COL],
        lambda o: [
            _meta(o).get("name"),
            (o.get("status") or {}).get("phase", "Active"),
            age(_meta(o).get("creationTimestamp")),
        ],
    ),
    "ConfigMap": (
        [NAME_COL, _col("Data", "integer"), AGE_COL],
        lambda o: [
            _meta(o).get("name"),
            len(o.get("data") or {}) + len(o.get("binaryData") or {}),
            age(_meta(o).get("creationTimestamp")),
        ],
    ),
    "Secret": (
        [NAME_COL, _col("Type"), _col("Data", "integer"), AGE_COL],
        lambda o: [
            _meta(o).get("name"),
            o.get("type", "Opaque"),
            len(o.get("data") or {}),
            age(_meta(o).get("creationTimestamp")),
        ],
    ),
    "ServiceAccount": (
        [NAME_COL, _col("Secrets", "integer"), AGE_COL],
        lambda o: [
            _meta(o).get("name"),
            len(o.get("secrets") or []),
            age(_meta(o).get("creationTimestamp")),
        ],
    ),
    "Node": ([NAME_COL, _col("Status"), _col("Roles"), AGE_COL, _col("Version")], _node_row),
    "Event": (
        [_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")],
        _event_row,
    ),
    "CustomResourceDefinition": (
        [NAME_COL, _col("Created At", "date")],
        lambda o: [_meta(o).get("name"), _meta(o).get("creationTimestamp")],
    ),
    "RoleBinding": (
        [NAME_COL, _col("Role"), AGE_COL],
        lambda o: [
            _meta(o).get("name"),
            f"{(o.get('roleRef') or {}).get('kind')}/{(o.get('roleRef') or {}).get('name')}",
            age(_meta(o).get("creationTimestamp")),
        ],
    ),
    "Lease": (
        [NAME_COL, _col("Holder"), AGE_COL],
        lambda o: [
            _meta(o).get("name"),
            (o.get("spec") or {}).get("holderIdentity", ""),
            age(_meta(o).get("creationTimestamp")),
        ],
    ),
}
_SIMPLE["ClusterRoleBinding"] = _SIMPLE["RoleBinding"]


def _deployment_row(d: dict[str, Any]) -> list[Any]:
    spec, status = d.get("spec") or {}, d.get("status") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    return [
        _meta(d).get("name"),
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        age(_meta(d).get("creationTimestamp")),
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
        ",".join(f"{k}={v}" for k, v in selector.items()),
    ]


_SIMPLE["Deployment"] = (
    [
        NAME_COL,
        _col("Ready"),
        _col("Up-to-date", "integer"),
        _col("Available", "integer"),
        AGE_COL,
        _col("Containers", priority=1),
        _col("Images", priority=1),
        _col("Selector", priority=1),
    ],
    _deployment_row,
)


def columns_and_cells(
    kind: str, printer_columns: list[dict[str, Any]] | None, is_custom: bool
) -> tuple[list[Column], Callable[[dict[str, Any]], list[Any]]]:
    if is_custom:
        return crd_columns(printer_columns), lambda o: crd_cells(o, printer_columns)
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    return [NAME_COL, AGE_COL], lambda o: [
        _meta(o).get("name"),
        age(_meta(o).get("creationTimestamp")),
    ]


def row_object(obj: dict[str, Any], include_object: str) -> dict[str, Any] | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata") or {},
    }


def build_table(
    kind: str,
    objects: list[dict[str, Any]],
    *,
    printer_columns: list[dict[str, Any]] | None = None,
    is_custom: bool = False,
    include_object: str = "Metadata",
    resource_version: str = "",
    with_columns: bool = True,
) -> dict[str, Any]:
    cols, cells = columns_and_cells(kind, printer_columns, is_custom)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": cells(obj)}
        ro = row_object(obj, include_object)
        if ro is not None:
            row["object"] = ro
        rows.append(row)
    table: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": cols if with_columns else [],
        "rows": rows,
    }
    return table
