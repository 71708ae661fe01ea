"""MoEFinetune ``npu-lora.io/v1alpha1``: spec and status models.

Rules for this package (the CRD generator and the docs test depend on them):
- every field has a ``description``; bounds and enums are expressed as pydantic constraints /
  ``Literal`` so they become OpenAPI ``minimum``/``maximum``/``enum``;
- cross-field rules are written twice, on purpose: as CEL (``x-kubernetes-validations`` in
  ``json_schema_extra``, enforced by the apiserver before the operator sees the object) and as
  pydantic ``model_validator`` (enforced by ``npu-lora run`` without a cluster); tests check
  both agree on examples;
- every field of :class:`MoEFinetuneSpec` is tagged with what a change does to a created run
  (``Annotated[T, OnUpdate.X]``, see :class:`OnUpdate`); the CEL immutability rule, the operator
  (which change it copies to the Job, to the worker config, or only warns about), the worker
  config and the run directory's resume check read those tags (:func:`spec_fields`);
- YAML keys are camelCase (``alias``), Python attributes snake_case.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from npu_lora.api.v1alpha1.base import (
    API_VERSION,
    CLUSTER_ONLY,
    DEFAULT_STEPS,
    DNS_SUBDOMAIN_PATTERN,
    ENV_NAME,
    ENV_NAMESPACE,
    ENV_UID,
    EXIT_CONFIG_ERROR,
    EXIT_NONFINITE_LOSS,
    EXIT_RENDEZVOUS_TIMEOUT,
    GROUP,
    IMAGE_PATTERN,
    KIND,
    LABEL_VALUE_PATTERN,
    MANAGED_BY,
    MANAGED_BY_PATTERN,
    MAX_PATH,
    MERGE_PATCH,
    METADATA_CEL_RULES,
    NAME_MAX_LENGTH,
    NAME_PATTERN,
    NAME_RULE_MESSAGE,
    PLURAL,
    QUANTITY_PATTERN,
    RELATIVE_PATH_PATTERN,
    RESOURCE_QUANTITY_PATTERN,
    SHORT_NAME,
    SINGULAR,
    VERSION,
    OnUpdate,
    VolumeRef,
    _Model,
    cel,
    dns_label_name,
    is_dns_label,
    quantity_bytes,
)
from npu_lora.api.v1alpha1.benchmark import (
    BENCHMARK_VARIANTS,
    VARIANT_PATTERN,
    BenchmarkSpec,
)
from npu_lora.api.v1alpha1.runtime import (
    CheckpointSpec,
    DeviceSpec,
    DistributedSpec,
    OutputSpec,
    PodTemplateSpec,
    ReportingSpec,
    ResourceQuantity,
    ResourceRequirements,
)
from npu_lora.api.v1alpha1.sections import (
    DataSpec,
    EvalSpec,
    LoraSpec,
    ModelSpec,
    MoESpec,
    TrainingSpec,
)
from npu_lora.api.v1alpha1.spec import (
    MoEFinetuneSpec,
    immutable_rule,
    managed_by_rule,
    spec_fields,
)
from npu_lora.api.v1alpha1.status import (
    BenchmarkCase,
    BenchmarkStatus,
    BenchmarkVariant,
    CheckpointStatus,
    CompileStatus,
    Condition,
    DistributedStatus,
    EvalBest,
    EvalStatus,
    HostStatus,
    HotStatus,
    MoEFinetuneStatus,
    PlacementStatus,
    Progress,
    StepRecord,
    TrainerMetric,
    TrainerStatus,
)

__all__ = [
    "API_VERSION",
    "BENCHMARK_VARIANTS",
    "CLUSTER_ONLY",
    "DEFAULT_STEPS",
    "DNS_SUBDOMAIN_PATTERN",
    "ENV_NAME",
    "ENV_NAMESPACE",
    "ENV_UID",
    "EXIT_CONFIG_ERROR",
    "EXIT_NONFINITE_LOSS",
    "EXIT_RENDEZVOUS_TIMEOUT",
    "GROUP",
    "IMAGE_PATTERN",
    "KIND",
    "LABEL_VALUE_PATTERN",
    "MANAGED_BY",
    "MANAGED_BY_PATTERN",
    "MAX_PATH",
    "MERGE_PATCH",
    "METADATA_CEL_RULES",
    "NAME_MAX_LENGTH",
    "NAME_PATTERN",
    "NAME_RULE_MESSAGE",
    "PLURAL",
    "QUANTITY_PATTERN",
    "RELATIVE_PATH_PATTERN",
    "RESOURCE_QUANTITY_PATTERN",
    "SHORT_NAME",
    "SINGULAR",
    "VARIANT_PATTERN",
    "VERSION",
    "BenchmarkCase",
    "BenchmarkSpec",
    "BenchmarkStatus",
    "BenchmarkVariant",
    "CheckpointSpec",
    "CheckpointStatus",
    "CompileStatus",
    "Condition",
    "DataSpec",
    "DeviceSpec",
    "DistributedSpec",
    "DistributedStatus",
    "EvalBest",
    "EvalSpec",
    "EvalStatus",
    "HostStatus",
    "HotStatus",
    "LoraSpec",
    "MoEFinetune",
    "MoEFinetuneSpec",
    "MoEFinetuneStatus",
    "MoESpec",
    "ModelSpec",
    "ObjectMeta",
    "OnUpdate",
    "OutputSpec",
    "PlacementStatus",
    "PodTemplateSpec",
    "Progress",
    "ReportingSpec",
    "ResourceQuantity",
    "ResourceRequirements",
    "StepRecord",
    "TrainerMetric",
    "TrainerStatus",
    "TrainingSpec",
    "VolumeRef",
    "cel",
    "dns_label_name",
    "immutable_rule",
    "is_dns_label",
    "managed_by_rule",
    "quantity_bytes",
    "spec_fields",
]


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None


class MoEFinetune(_Model):
    """The full object, as a manifest."""

    api_version: Literal["npu-lora.io/v1alpha1"] = Field(API_VERSION, description="API version.")
    kind: Literal["MoEFinetune"] = Field(KIND, description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: MoEFinetuneSpec = Field(..., description="Desired run.")
    status: MoEFinetuneStatus | None = Field(None, description="Observed state.")
