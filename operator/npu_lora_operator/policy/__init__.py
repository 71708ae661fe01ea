"""Admission policy: what a MoEFinetune may put into its worker pod, set by the cluster admin.

Anyone allowed to create a MoEFinetune makes the operator (which may create Jobs,
ServiceAccounts, Roles and RoleBindings) start a pod; without a policy that pod could run any
image, under any ServiceAccount of the namespace, with the node's filesystem mounted. The
policy (:class:`PodPolicy`; the chart's ``policy`` values, passed to the operator as JSON in
``NPU_LORA_POLICY``) says what is allowed, and the operator refuses a run that asks for more
before any of its children exists: the run ends ``Failed`` with the condition reason
``PolicyViolation``, a Warning Event and a message naming each field (:func:`check`).

===============================  ==============================================================
``allowedImages``                 ``spec.image`` patterns (``fnmatch``: ``reg.example.com/*``,
                                  ``*`` for any); empty: the operator's worker image only
``allowedServiceAccountNames``    ``spec.podTemplate.serviceAccountName`` patterns; empty: none
                                  (each run gets its own least-privilege ServiceAccount)
``allowedHostPaths``              path prefixes a hostPath volume may name (``model``/``data``/
                                  ``output``/``compileCache`` ``volume.hostPath``,
                                  ``podTemplate.volumes[].hostPath``); empty: no hostPath
``allowPrivileged``               privileged containers, added capabilities,
                                  ``allowPrivilegeEscalation``, running as uid 0 or
                                  ``runAsNonRoot: false``, ``hostNetwork``/``hostPID``/``hostIPC``
                                  in the built pod (the spec cannot ask for them today; this
                                  guards the builders and the operator's own configuration)
``allowedSecrets``                Secret names ``podTemplate.env[].valueFrom.secretKeyRef`` and
                                  ``envFrom[].secretRef`` may read; empty: none
``allowedConfigMaps``             ConfigMap names ``env[].valueFrom.configMapKeyRef``,
                                  ``envFrom[].configMapRef`` and ``volumes[].configMap`` may
                                  read; empty: none
``allowedTolerationKeys``         toleration keys (globs); default: accelerator keys only, never
                                  a control-plane key unless listed exactly
``allowedNodeSelectorKeys``       ``nodeSelector`` / node-affinity label keys (globs); default:
                                  accelerator, topology, arch/os keys
``allowedPriorityClasses``        ``priorityClassName`` globs; empty: none; ``system-*`` only
                                  when listed exactly
``allowedMountPaths``             where ``podTemplate.volumeMounts`` may mount (path prefixes);
                                  never over the operator's own mounts
``allowedImagePullSecrets``       ``podTemplate.imagePullSecrets[].name`` globs; empty: none
``maxEmptyDirSize``               the total ``sizeLimit`` of the podTemplate's disk emptyDirs
                                  (``sizeLimit`` required); default 32Gi
``maxMemoryEmptyDirSize``         the same for ``medium: Memory`` (tmpfs, charged to the pod's
                                  memory: added to ``auto`` memory); default 8Gi
``defaultResources``              requests/limits of the worker container for the keys the spec
                                  leaves unset; a memory of ``auto`` is the estimate below
``memoryWhenUnknown``             ``auto`` memory when the model's size is unknown to the
                                  operator (``model.path`` on a volume it does not mount)
===============================  ==============================================================

The ``auto`` memory estimate is the torch-free estimate the worker's pre-flight checks too
(:mod:`npu_lora.api.memory`: host-resident weights + LoRA optimizer state + activations of one
micro-batch of ``batchSize × seqLen`` tokens + the processes' measured runtime: the expected
peak RSS), from the model's config (a preset's packaged config.json; ``moe.hostDtype: auto``
sized as float32, the widest choice the worker's CPU can make), × 1.25, rounded up to a whole
GiB: :func:`auto_memory`. A run whose spec sets a memory
request but no limit gets a limit of at least its request; a spec limit without a request is
left to Kubernetes (the request then equals the limit).

Pure functions; no I/O except reading a preset's packaged config. Never imports torch.

Modules: :mod:`.config` (the values, :class:`Violation`), :mod:`.common` (matching helpers),
:mod:`.env` (:mod:`.reserved`: the names it may not set), :mod:`.volumes` (:mod:`.sources`:
each volume type), :mod:`.scheduling`, :mod:`.images` (image and pull secrets),
:mod:`.privileged` (the built pod), :mod:`.paths` (the spec's path fields: relative to their
volume, no ``..``), :mod:`.resources` (defaults and ``auto`` memory),
:mod:`.quantities` and :mod:`.checks` (a run's violations, from all of them).
"""

from npu_lora_operator.policy.checks import check, check_pod_template, check_spec
from npu_lora_operator.policy.common import CONTROL_PLANE_KEYS
from npu_lora_operator.policy.config import (
    AUTO,
    DEFAULT_MOUNT_PATHS,
    DEFAULT_NODE_SELECTOR_KEYS,
    DEFAULT_TOLERATION_KEYS,
    REASON,
    Body,
    PodPolicy,
    Violation,
    describe,
)
from npu_lora_operator.policy.privileged import check_pod_spec
from npu_lora_operator.policy.quantities import GiB
from npu_lora_operator.policy.reserved import (
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    reserved_env,
)
from npu_lora_operator.policy.resources import RUNTIME_BYTES, auto_memory, default_resources
from npu_lora_operator.policy.volumes import (
    ALLOWED_VOLUME_SOURCES,
    OPERATOR_MOUNTS,
    OPERATOR_VOLUMES,
)

__all__ = [
    "ALLOWED_VOLUME_SOURCES",
    "AUTO",
    "CONTROL_PLANE_KEYS",
    "DEFAULT_MOUNT_PATHS",
    "DEFAULT_NODE_SELECTOR_KEYS",
    "DEFAULT_TOLERATION_KEYS",
    "OPERATOR_MOUNTS",
    "OPERATOR_VOLUMES",
    "REASON",
    "RESERVED_ENV_NAMES",
    "RESERVED_ENV_PREFIXES",
    "RUNTIME_BYTES",
    "Body",
    "GiB",
    "PodPolicy",
    "Violation",
    "auto_memory",
    "check",
    "check_pod_spec",
    "check_pod_template",
    "check_spec",
    "default_resources",
    "describe",
    "reserved_env",
]
