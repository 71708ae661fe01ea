"""Constants, name rules, the shared model base, CEL helpers and volume references of the
``v1alpha1`` API (imported by every other module of the package)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic.alias_generators import to_camel

GROUP = "npu-lora.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MoEFinetune"
PLURAL = "moefinetunes"
SINGULAR = "moefinetune"
SHORT_NAME = "mft"
#: ``training.steps`` when neither ``steps`` nor ``epochs`` is set.
DEFAULT_STEPS = 100

#: Exit code of the worker for an invalid configuration or input (not retried: the Job's
#: podFailurePolicy fails the Job at once).
EXIT_CONFIG_ERROR = 2
#: Exit code of the worker when the loss became non-finite (not retried either).
EXIT_NONFINITE_LOSS = 3
#: Exit code of a data-parallel worker whose ranks did not all join the process group within
#: ``spec.distributed.rendezvousTimeoutSeconds`` (the Job fails at once: condition reason
#: ``RendezvousTimeout``).
EXIT_RENDEZVOUS_TIMEOUT = 4

#: The worker container's environment naming the MoEFinetune it runs for: set by the operator's
#: Job builder, read by the worker's status reporter.
ENV_NAME = "NPU_LORA_RESOURCE_NAME"
ENV_NAMESPACE = "NPU_LORA_RESOURCE_NAMESPACE"
ENV_UID = "NPU_LORA_RESOURCE_UID"
#: Content type of the JSON merge patches that the operator and the worker send to the API
#: (each owns a disjoint subtree of ``status``).
MERGE_PATCH = "application/merge-patch+json"

#: ``metadata.name`` (and ``namespace``): a DNS-1123 label, because the name becomes the Job's,
#: and ``<name>-worker`` / ``<name>-config`` the ServiceAccount's and ConfigMap's.
NAME_MAX_LENGTH = 63
NAME_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE_MESSAGE = (
    "must be a DNS-1123 label: at most 63 characters, only lowercase letters, digits and '-', "
    "starting and ending with a letter or digit (it names the run's Job)"
)
_NAME_RE = re.compile(NAME_PATTERN)


def is_dns_label(name: str) -> bool:
    """``name`` is a valid run name (:data:`NAME_PATTERN`, at most :data:`NAME_MAX_LENGTH`)."""
    return len(name) <= NAME_MAX_LENGTH and _NAME_RE.fullmatch(name) is not None


def dns_label_name(text: str) -> str:
    """A valid run name made from ``text`` (a file stem): lowercased, other characters → ``-``."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:NAME_MAX_LENGTH].strip("-")
    return name or "run"


class OnUpdate(StrEnum):
    """What changing a :class:`MoEFinetuneSpec` field does to a created run (one tag a field)."""

    #: rejected by the server (CEL transition rule on ``spec``); also what a run directory must
    #: match to be resumed (:mod:`npu_lora.train.rundir`)
    IMMUTABLE = "immutable"
    #: applied to the run's existing Job by the operator
    JOB = "job"
    #: rewrites the worker ConfigMap: takes effect with the next worker pod (a retry, a resume)
    WORKER_CONFIG = "worker-config"
    #: cannot change the created Job (its pod template is immutable): the operator warns; takes
    #: effect only in a new run (delete and re-create)
    NEW_RUN = "new-run"


class _ClusterOnly:
    """Tag of a spec field that only shapes the Kubernetes Job: ``npu-lora run`` ignores it, so
    the operator leaves it out of the worker config."""

    def __repr__(self) -> str:
        return "CLUSTER_ONLY"


CLUSTER_ONLY = _ClusterOnly()


def cel(rule: str, message: str, *, reason: str | None = None, field_path: str | None = None):
    """One ``x-kubernetes-validations`` entry."""
    out: dict[str, Any] = {"rule": rule, "message": message}
    if reason:
        out["reason"] = reason
    if field_path:
        out["fieldPath"] = field_path
    return out


#: CEL rules at the root of the CRD schema (only there can a rule see ``self.metadata.name``).
#: The apiserver already holds a custom resource's name to a DNS-1123 subdomain
#: (``customresource/validator.go``: ``NameIsDNSSubdomain``), so a label is one without a dot
#: and at most 63 characters: ``contains`` costs a tenth of ``matches`` on a string CEL must
#: assume as long as a request (``metadata.name`` has no ``maxLength`` it can see).
METADATA_CEL_RULES = [
    cel(
        "!has(self.metadata.name) || (size(self.metadata.name) <= 63 && "
        "!self.metadata.name.contains('.'))",
        f"metadata.name {NAME_RULE_MESSAGE}",
    )
]


#: ``spec.managedBy``'s default: the runs this operator reconciles (another value, e.g. Kueue's
#: ``kueue.x-k8s.io/multikueue``, hands the run to that controller: ours leaves it alone)
MANAGED_BY = f"{GROUP}/operator"
#: a ``managedBy`` value: a domain-prefixed path, as batch/v1 Job's ``spec.managedBy``
MANAGED_BY_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

#: DNS-1123 subdomain (names of PersistentVolumeClaims, ConfigMaps, ServiceAccounts, classes)
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: a Kubernetes label value (``queueName`` becomes one)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: a relative path that never climbs: no leading ``/``, no ``..`` component (RE2: no lookahead)
_COMPONENT = r"(\.|\.\.[^/]+|\.?[^./][^/]*)"
RELATIVE_PATH_PATTERN = rf"^{_COMPONENT}(/{_COMPONENT})*/?$"
#: a non-negative Kubernetes resource quantity (``8``, ``500m``, ``64Gi``, ``1.5``, ``1e3``)
RESOURCE_QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE]\+?[0-9]+))?$"
)
#: an image reference: no whitespace, no control characters
IMAGE_PATTERN = r"^[^\s]+$"
#: longest free path string (PATH_MAX)
MAX_PATH = 4096


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        allow_inf_nan=False,
    )

    def to_api(self) -> dict[str, Any]:
        """camelCase dict as it appears in YAML/JSON, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class VolumeRef(_Model):
    """Where a directory comes from inside the cluster. Exactly one of claimName / hostPath."""

    claim_name: str | None = Field(
        None,
        description="Name of a PersistentVolumeClaim in the run's namespace to mount.",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    host_path: str | None = Field(
        None,
        description="A directory on the node (hostPath volume); for single-node or dev clusters.",
        min_length=1,
        max_length=MAX_PATH,
        pattern="^/",
    )
    sub_path: str | None = Field(
        None,
        description="Sub-directory of the volume to mount instead of its root (relative, no `..`).",
        max_length=MAX_PATH,
        pattern=RELATIVE_PATH_PATTERN,
    )
    read_only: bool | None = Field(
        None,
        description="Mount read-only (default: true for model and data, false for output and cache).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> VolumeRef:
        if (self.claim_name is None) == (self.host_path is None):
            raise ValueError("set exactly one of claimName or hostPath")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.claimName) != has(self.hostPath)",
                    "set exactly one of claimName or hostPath",
                )
            ]
        }
    )


#: A Kubernetes quantity of bytes (``12Gi``, ``512Mi``, ``1.5G``, ``2000000000``).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_QUANTITY_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    **{u: 1024 ** (i + 1) for i, u in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def quantity_bytes(text: str) -> int:
    """``12Gi`` → 12884901888 (binary and decimal suffixes; no milli, no exponent)."""
    m = _QUANTITY_RE.fullmatch(str(text).strip())
    if m is None:
        raise ValueError(
            f"{text!r} is not a quantity of bytes: use digits with an optional suffix Ki, Mi, "
            "Gi, Ti, Pi, Ei (powers of 1024) or k, M, G, T, P, E (powers of 1000), e.g. 12Gi"
        )
    unit = m.group(2) or ""
    return int(
        float(str(text).strip()[: len(str(text).strip()) - len(unit)]) * _QUANTITY_UNITS[unit]
    )
