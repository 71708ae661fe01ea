"""The local sandbox: an in-process Kubernetes API emulator and a local kubelet/Job controller.

A package of its own beside the operator (the ``sandbox`` extra; the operator image does not
contain it). Nothing here imports torch.

- :class:`~.emulator.ApiEmulator` — a kmock-based API server on a free localhost port that the
  real ``kubectl``, the ``kubernetes`` client and kopf work against, assembled from one module per
  concept: :mod:`.store` (objects, resourceVersions, CRUD semantics), :mod:`.admission`
  (defaulting, schema, CEL, built-in validation), :mod:`.garbage` (finalizers, ownerReference
  cascades), :mod:`.auth` (authentication, RBAC, the log of authorization decisions),
  :mod:`.discovery` (discovery, OpenAPI), :mod:`.http_api` (HTTP requests), :mod:`.watch`
  (watches); :mod:`.resources` (resource types, errors), :mod:`.selectors`.
- :class:`~.kubelet.LocalKubelet` — runs the emulator's Jobs/Pods and writes their status:
  :mod:`.jobs` (the Job controller), :mod:`.pods` (the pod runner), :mod:`.podenv` (a pod's
  volumes, environment and path rewriting), :mod:`.runtime` (the :class:`~.runtime.PodRuntime`
  seam; :class:`~.runtime.HostRuntime` runs containers as local subprocesses,
  :class:`~.podman.PodmanRuntime` as podman containers from their images).
- :mod:`.command` — ``npu-lora sandbox`` (emulator + kubelet + operator in one process;
  ``--runtime podman``: pods and the operator from their images).

Helpers: :mod:`.schema` (structural schema + CEL), :mod:`.table` (Table output),
:mod:`.jsonpath`, :mod:`.patching`, :mod:`.protobuf`.
"""

from .emulator import ApiEmulator, ApiError, ResourceType
from .kubelet import LocalKubelet

__all__ = ["ApiEmulator", "ApiError", "LocalKubelet", "ResourceType"]
