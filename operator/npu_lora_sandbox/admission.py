"""The API emulator's admission (see :class:`Admission`)."""

from __future__ import annotations

import copy
import re
from typing import Any

from . import schema
from .resources import (
    ApiError,
    ResourceType,
    now_iso,
)


def _crd_status(obj: dict[str, Any]) -> None:
    """A CRD's status: accepted names, NamesAccepted/Established (kept if set), stored versions."""
    spec = obj.get("spec") or {}
    names = dict(spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    kept = (obj.get("status") or {}).get("conditions")
    obj["status"] = {
        "acceptedNames": names,
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now_iso(),
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now_iso(),
            },
        ],
        "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
    }
    if kept:
        obj["status"]["conditions"] = kept


#: Fields the apiserver requires where it applies no default, per built-in kind the operator
#: creates (and Pod), from the ``required`` lists of Kubernetes' published OpenAPI schemas
#: (v1.30-v1.37, the versions ``tests/ship/test_ship_conformance.py`` validates against; a test
#: checks every entry against them; a field the apiserver defaults, such as
#: ``onPodConditions[].status`` (required in the schemas up to 1.34), is defaulted in
#: :meth:`Admission._default_builtin` instead). Paths are dotted;
#: ``[]`` is every item of a list; a field is required only where its parent object exists.
_POD_SPEC_REQUIRED = (
    "containers",
    "containers[].name",
    "containers[].env[].name",
    "containers[].env[].valueFrom.configMapKeyRef.key",
    "containers[].env[].valueFrom.secretKeyRef.key",
    "containers[].env[].valueFrom.fieldRef.fieldPath",
    "containers[].env[].valueFrom.resourceFieldRef.resource",
    "containers[].ports[].containerPort",
    "containers[].volumeMounts[].name",
    "containers[].volumeMounts[].mountPath",
    "containers[].securityContext.seccompProfile.type",
    "initContainers[].name",
    "volumes[].name",
    "volumes[].persistentVolumeClaim.claimName",
    "volumes[].hostPath.path",
    "volumes[].configMap.items[].key",
    "volumes[].configMap.items[].path",
    "volumes[].secret.items[].key",
    "volumes[].secret.items[].path",
    "securityContext.seccompProfile.type",
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[]"
    ".matchExpressions[].key",
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[]"
    ".matchExpressions[].operator",
    "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[].weight",
    "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[].preference",
)
REQUIRED_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("rbac.authorization.k8s.io", "Role"): ("rules[].verbs",),
    ("rbac.authorization.k8s.io", "ClusterRole"): ("rules[].verbs",),
    ("rbac.authorization.k8s.io", "RoleBinding"): (
        "roleRef",  # roleRef.apiGroup: required up to 1.35 only
        "roleRef.kind",
        "roleRef.name",
        "subjects[].kind",
        "subjects[].name",
    ),
    ("", "Service"): ("spec.ports[].port",),
    ("batch", "Job"): (
        "spec.template",
        "spec.podFailurePolicy.rules",
        "spec.podFailurePolicy.rules[].action",
        "spec.podFailurePolicy.rules[].onExitCodes.operator",
        "spec.podFailurePolicy.rules[].onExitCodes.values",
        "spec.podFailurePolicy.rules[].onPodConditions[].type",
        *(f"spec.template.spec.{p}" for p in _POD_SPEC_REQUIRED),
    ),
    ("", "Pod"): tuple(f"spec.{p}" for p in _POD_SPEC_REQUIRED),
}
REQUIRED_FIELDS[("rbac.authorization.k8s.io", "ClusterRoleBinding")] = REQUIRED_FIELDS[
    ("rbac.authorization.k8s.io", "RoleBinding")
]


def missing_fields(obj: Any, pattern: str, path: str = "") -> list[str]:
    """The concrete paths of ``pattern`` (see :data:`REQUIRED_FIELDS`) absent from ``obj``."""
    head, _, rest = pattern.partition(".")
    many = head.endswith("[]")
    key = head[:-2] if many else head
    if not isinstance(obj, dict):
        return []
    here = f"{path}.{key}" if path else key
    if key not in obj or obj[key] is None:
        return [] if rest else [here]
    if not rest:
        return []
    value = obj[key]
    if many:
        return [
            m
            for i, item in enumerate(value if isinstance(value, list) else [])
            for m in missing_fields(item, rest, f"{here}[{i}]")
        ]
    return missing_fields(value, rest, here)


class Admission:
    """Admission: defaulting, the structural schema and CEL of custom resources, and the
    built-in validations (metadata, workloads, a Job's immutable fields).

    A mixin of :class:`~npu_lora_sandbox.emulator.ApiEmulator` (its state lives there).
    """

    def _default_builtin(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        meta = obj["metadata"]
        if rt.kind == "Namespace" and rt.group == "":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj.setdefault("status", {}).setdefault("phase", "Active")
        elif rt.kind == "Job" and rt.group == "batch" and old is None:
            self._default_job(obj)
        elif rt.kind == "Pod" and rt.group == "" and old is None:
            self._default_pod_spec(obj.setdefault("spec", {}))
            status = obj.setdefault("status", {})
            status.setdefault("phase", "Pending")
            status.setdefault("qosClass", "BestEffort")
        elif rt.kind == "CustomResourceDefinition":
            _crd_status(obj)
        elif rt.kind == "ServiceAccount" and rt.group == "":
            pass

    def _default_job(self, obj: dict[str, Any]) -> None:
        """A new Job's selector, pod-template labels and spec defaults (as the apiserver sets)."""
        meta = obj["metadata"]
        spec = obj.setdefault("spec", {})
        uid = meta["uid"]
        if not spec.get("manualSelector"):
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        tmpl_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        labels = tmpl_meta.setdefault("labels", {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": meta["name"],
                "controller-uid": uid,
                "job-name": meta["name"],
            }
        )
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completions", 1)
        spec.setdefault("parallelism", 1)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
            for pattern in (rule or {}).get("onPodConditions") or []:
                if isinstance(pattern, dict):  # SetDefaults_PodFailurePolicyOnPodConditionsPattern
                    pattern.setdefault("status", "True")
        self._default_pod_spec(spec["template"].setdefault("spec", {}))
        obj.setdefault("status", {})

    @staticmethod
    def _default_pod_spec(pspec: dict[str, Any]) -> None:
        pspec.setdefault("restartPolicy", "Always")
        pspec.setdefault("terminationGracePeriodSeconds", 30)
        pspec.setdefault("dnsPolicy", "ClusterFirst")
        pspec.setdefault("schedulerName", "default-scheduler")
        pspec.setdefault("serviceAccountName", pspec.get("serviceAccount") or "default")
        for c in pspec.get("containers") or []:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            image = str(c.get("image", ""))
            c.setdefault(
                "imagePullPolicy",
                "Always" if image.endswith(":latest") or ":" not in image else "IfNotPresent",
            )

    def _check_custom(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        field_validation: str | None,
        warnings: list[str] | None,
    ) -> None:
        if rt.schema is None:
            return
        sch = rt.schema
        removed = schema.prune(obj, sch)
        if removed:
            if (field_validation or "").lower() == "strict":
                msg = ", ".join(f'unknown field "{p}"' for p in removed)
                raise ApiError(
                    400,
                    "BadRequest",
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: {msg}',
                )
            if (field_validation or "").lower() == "warn" and warnings is not None:
                warnings.extend(f'unknown field "{p}"' for p in removed)
        schema.apply_defaults(obj, sch)

        def cel_view(o: dict[str, Any]) -> dict[str, Any]:
            # Root-level CEL rules see apiVersion, kind and metadata.name/generateName only.
            view = {k: v for k, v in o.items() if k != "metadata"}
            m = o.get("metadata") or {}
            view["metadata"] = {k: m[k] for k in ("name", "generateName") if k in m}
            return view

        body = cel_view(obj)
        old_body = cel_view(old) if old else None
        causes = schema.validate(body, sch, old=old_body, has_old=old is not None)
        if causes:
            raise self._invalid(rt, obj["metadata"].get("name", ""), causes)

    def _check_meta(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """ownerReferences need apiVersion, kind, name and uid; label keys are qualified names
        and values label values, annotation keys qualified names and values strings (as in the
        apiserver: a newline or a selector operator in a label never gets stored)."""
        causes = _label_causes(obj["metadata"])
        for i, ref in enumerate(obj["metadata"].get("ownerReferences") or []):
            for key in ("apiVersion", "kind", "name", "uid"):
                if not (ref or {}).get(key):
                    causes.append(
                        schema.Cause(
                            f"metadata.ownerReferences[{i}].{key}",
                            "FieldValueInvalid",
                            f'Invalid value: "": {key} must not be empty',
                        )
                    )
        if causes:
            raise self._invalid(rt, obj["metadata"].get("name", ""), causes)

    def _check_workload(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """A few of the apiserver's Pod/Job validations that catch builder bugs."""
        if rt.group not in ("", "batch") or rt.kind not in ("Pod", "Job"):
            return
        causes: list[schema.Cause] = []
        if rt.kind == "Job":
            spec = obj.get("spec") or {}
            pspec = (spec.get("template") or {}).get("spec") or {}
            prefix = "spec.template.spec"
            restart = pspec.get("restartPolicy")
            if restart not in ("OnFailure", "Never"):
                causes.append(
                    schema.Cause(
                        f"{prefix}.restartPolicy",
                        "FieldValueNotSupported",
                        f'Unsupported value: {schema.format_value(restart)}: supported values: "OnFailure", "Never"',
                    )
                )
            elif spec.get("podFailurePolicy") and restart != "Never":
                causes.append(
                    schema._invalid(
                        f"{prefix}.restartPolicy",
                        restart,
                        'only "Never" is supported when podFailurePolicy is specified',
                    )
                )
        else:
            pspec = obj.get("spec") or {}
            prefix = "spec"
        containers = pspec.get("containers") or []
        if not containers:
            causes.append(
                schema.Cause(f"{prefix}.containers", "FieldValueRequired", "Required value")
            )
        for i, c in enumerate(containers):
            for key in ("name", "image"):
                if not (c or {}).get(key):
                    causes.append(
                        schema.Cause(
                            f"{prefix}.containers[{i}].{key}",
                            "FieldValueRequired",
                            "Required value",
                        )
                    )
        if causes:
            raise self._invalid(rt, obj["metadata"].get("name", ""), causes)

    def _check_builtin(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """What the apiserver refuses of a built-in kind before storing it: a required field
        without a default (:data:`REQUIRED_FIELDS`), a CRD whose CEL rules exceed the cost
        budget (:func:`.celcost.crd_cost_errors`, the apiserver's static estimate)."""
        causes: list[schema.Cause] = _data_key_causes(rt, obj) + _item_path_causes(rt, obj)
        for pattern in REQUIRED_FIELDS.get((rt.group, rt.kind), ()):
            causes += [
                schema.Cause(path, "FieldValueRequired", "Required value")
                for path in missing_fields(obj, pattern)
            ]
        if rt.kind == "CustomResourceDefinition" and rt.group == "apiextensions.k8s.io":
            from .celcost import crd_cost_errors

            causes += [
                schema.Cause(path, "FieldValueForbidden", f"Forbidden: {message}")
                for path, message in crd_cost_errors(obj)
            ]
        if causes:
            raise self._invalid(rt, obj["metadata"].get("name", ""), causes)

    def _check_job_immutables(
        self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any]
    ) -> None:
        """Like the apiserver: a Job's pod template is immutable, except the scheduling
        directives of a suspended Job that never started; podFailurePolicy/completionMode too."""
        ospec, nspec = old.get("spec") or {}, new.get("spec") or {}
        causes = []
        otmpl, ntmpl = ospec.get("template") or {}, nspec.get("template") or {}
        if otmpl != ntmpl:
            never_started = ospec.get("suspend") and not (old.get("status") or {}).get("startTime")
            mutable = ("nodeSelector", "tolerations", "affinity", "schedulingGates")

            def strip(t: dict[str, Any]) -> dict[str, Any]:
                t = copy.deepcopy(t)
                for k in mutable:
                    (t.get("spec") or {}).pop(k, None)
                for k in ("labels", "annotations"):
                    (t.get("metadata") or {}).pop(k, None)
                return t

            if not never_started or strip(otmpl) != strip(ntmpl):
                causes.append(
                    schema.Cause(
                        "spec.template",
                        "FieldValueInvalid",
                        'Invalid value: "object": field is immutable',
                    )
                )
        for key in ("podFailurePolicy", "completionMode"):
            if key in ospec and ospec.get(key) != nspec.get(key):
                causes.append(
                    schema.Cause(
                        f"spec.{key}",
                        "FieldValueInvalid",
                        f"Invalid value: {schema.format_value(nspec.get(key))}: field is immutable",
                    )
                )
        if causes:
            raise self._invalid(rt, new["metadata"]["name"], causes)

    @staticmethod
    def _spec_part(obj: dict[str, Any], has_status: bool) -> dict[str, Any]:
        drop = (
            ("metadata", "status", "apiVersion", "kind")
            if has_status
            else ("metadata", "apiVersion", "kind")
        )
        return {k: v for k, v in obj.items() if k not in drop}


_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _qualified_name(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_PREFIX.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _NAME_PART.fullmatch(name) is not None


def _label_causes(meta: dict[str, Any]) -> list[schema.Cause]:
    causes: list[schema.Cause] = []
    for what in ("labels", "annotations"):
        items = meta.get(what)
        if items is None:
            continue
        if not isinstance(items, dict):
            causes.append(schema._invalid(f"metadata.{what}", items, "must be a map of strings"))
            continue
        for k, v in items.items():
            where = f"metadata.{what}"
            if not _qualified_name(k):
                causes.append(
                    schema._invalid(
                        where,
                        k,
                        "name part must consist of alphanumeric characters, '-', '_' or '.', "
                        "and must start and end with an alphanumeric character (at most 63), "
                        "with an optional DNS subdomain prefix and '/'",
                    )
                )
            elif not isinstance(v, str):
                causes.append(schema._invalid(f"{where}[{k}]", v, "must be a string"))
            elif what == "labels" and (len(v) > 63 or (v and not _NAME_PART.fullmatch(v))):
                causes.append(
                    schema._invalid(
                        f"{where}[{k}]",
                        v,
                        "a valid label must be an empty string or consist of alphanumeric "
                        "characters, '-', '_' or '.', and must start and end with an "
                        "alphanumeric character (at most 63)",
                    )
                )
    return causes


_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_VOLUME_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _data_key_causes(rt: ResourceType, obj: dict[str, Any]) -> list[schema.Cause]:
    """ConfigMap/Secret keys are file names (``[-._a-zA-Z0-9]+``, not ``.``/``..``, at most
    253) and ConfigMap ``data`` values strings, as the API server checks: a key is written as a
    file into every pod that mounts it."""
    if rt.group != "" or rt.kind not in ("ConfigMap", "Secret"):
        return []
    causes: list[schema.Cause] = []
    for field in ("data", "binaryData", "stringData"):
        items = obj.get(field)
        if items is None:
            continue
        if not isinstance(items, dict):
            causes.append(schema._invalid(field, items, "must be a map"))
            continue
        for k, v in items.items():
            if not (isinstance(k, str) and len(k) <= 253 and _CONFIG_KEY.fullmatch(k)) or k in (
                ".",
                "..",
            ):
                causes.append(
                    schema._invalid(
                        field,
                        k,
                        "a valid config key must consist of alphanumeric characters, '-', '_' "
                        "or '.' (not '.' or '..')",
                    )
                )
            elif not isinstance(v, str):
                causes.append(schema._invalid(f"{field}[{k}]", v, "must be a string"))
    return causes


def _item_path_causes(rt: ResourceType, obj: dict[str, Any]) -> list[schema.Cause]:
    """A Pod's (or a Job template's) configMap/secret volume ``items[].path`` is relative,
    without ``..`` (the API server's ``validateLocalDescendingPath``)."""
    if (rt.group, rt.kind) == ("", "Pod"):
        spec, prefix = obj.get("spec") or {}, "spec"
    elif (rt.group, rt.kind) == ("batch", "Job"):
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        prefix = "spec.template.spec"
    else:
        return []
    causes: list[schema.Cause] = []
    names = [
        (f"{prefix}.volumes[{i}].name", (v or {}).get("name"))
        for i, v in enumerate(spec.get("volumes") or [])
    ]
    for kind in ("containers", "initContainers"):
        for ci, c in enumerate(spec.get(kind) or []):
            for mi, m in enumerate((c or {}).get("volumeMounts") or []):
                names.append(
                    (f"{prefix}.{kind}[{ci}].volumeMounts[{mi}].name", (m or {}).get("name"))
                )
    for where, name in names:  # a DNS-1123 label: the kubelet makes a directory of it
        if not isinstance(name, str) or len(name) > 63 or not _VOLUME_NAME.fullmatch(name):
            causes.append(schema._invalid(where, name, "must be a DNS-1123 label"))
    for i, vol in enumerate(spec.get("volumes") or []):
        for src in ("configMap", "secret"):
            for j, item in enumerate(((vol or {}).get(src) or {}).get("items") or []):
                path = (item or {}).get("path")
                if not isinstance(path, str) or (
                    path.startswith("/") or ".." in path.split("/") or not path
                ):
                    causes.append(
                        schema._invalid(
                            f"{prefix}.volumes[{i}].{src}.items[{j}].path",
                            path,
                            "must be a relative path without '..'",
                        )
                    )
    return causes
