"""Operator configuration: what the Job builder needs that is not in the MoEFinetune, and the
operator process's own settings.

Read from the command line of ``npu-lora operator`` and, as defaults, from the environment
(the Helm chart sets ``NPU_LORA_WORKER_IMAGE``). This module is the one place that reads them:

==============================  ===========================================================
``NPU_LORA_WORKER_IMAGE``        worker image when ``spec.image`` is unset
``NPU_LORA_WORKER_COMMAND``      the worker's executable, JSON list or shell words
                                 (default ``npu-lora``); ``run CONFIG --out DIR`` is appended
``NPU_LORA_IMAGE_PULL_POLICY``   ``IfNotPresent`` (default), ``Always`` or ``Never``
``NPU_LORA_NAMESPACES``          comma-separated namespaces to watch (empty: all)
``NPU_LORA_LIVENESS``            kopf's liveness endpoint, e.g. ``http://0.0.0.0:8080/healthz``
``NPU_LORA_LOG_LEVEL``           ``DEBUG``, ``INFO`` (default), ``WARNING`` or ``ERROR``
``NPU_LORA_METRICS_PORT``        port of the Prometheus ``/metrics`` endpoint (unset or 0: off)
``NPU_LORA_POLICY``              the admission policy for worker pods, JSON (the chart's
                                 ``policy`` values; see :mod:`.policy`); unset: its defaults
==============================  ===========================================================
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from npu_lora import __version__

from npu_lora_operator.policy import PodPolicy

DEFAULT_WORKER_IMAGE = f"ghcr.io/npu-lora/npu-lora-worker:{__version__}"

ENV_WORKER_IMAGE = "NPU_LORA_WORKER_IMAGE"
ENV_WORKER_COMMAND = "NPU_LORA_WORKER_COMMAND"
ENV_IMAGE_PULL_POLICY = "NPU_LORA_IMAGE_PULL_POLICY"
ENV_NAMESPACES = "NPU_LORA_NAMESPACES"
ENV_LIVENESS = "NPU_LORA_LIVENESS"
ENV_LOG_LEVEL = "NPU_LORA_LOG_LEVEL"
ENV_METRICS_PORT = "NPU_LORA_METRICS_PORT"
ENV_POLICY = "NPU_LORA_POLICY"


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def watched_namespaces(
    namespaces: list[str] | None = None,
    *,
    all_namespaces: bool = False,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The namespaces to watch (``[]``: all): none with ``all_namespaces``, else ``namespaces``
    (each item may be comma-separated), else ``$NPU_LORA_NAMESPACES`` (comma-separated)."""
    if all_namespaces:
        return []
    if namespaces:
        return [n for item in namespaces for n in item.split(",") if n.strip()]
    value = _env(env).get(ENV_NAMESPACES, "")
    return [n.strip() for n in value.split(",") if n.strip()]


def default_liveness(env: Mapping[str, str] | None = None) -> str | None:
    """``$NPU_LORA_LIVENESS`` (None when unset or empty)."""
    return _env(env).get(ENV_LIVENESS) or None


def default_log_level(env: Mapping[str, str] | None = None) -> str:
    """``$NPU_LORA_LOG_LEVEL`` (default ``INFO``)."""
    return _env(env).get(ENV_LOG_LEVEL, "INFO")


def default_metrics_port(env: Mapping[str, str] | None = None) -> int:
    """``$NPU_LORA_METRICS_PORT`` (0: no metrics endpoint)."""
    value = _env(env).get(ENV_METRICS_PORT, "").strip()
    if not value:
        return 0
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{ENV_METRICS_PORT}: expected a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{ENV_METRICS_PORT}: port out of range 0-65535: {port}")
    return port


def parse_command(text: str | None) -> list[str]:
    """``'["python","-m","npu_lora.cli"]'`` or ``'python -m npu_lora.cli'`` → list of words."""
    if not text:
        return ["npu-lora"]
    text = text.strip()
    if text.startswith("["):
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value) or not value:
            raise ValueError(f"worker command: expected a JSON list of strings, got {text!r}")
        return value
    words = shlex.split(text)
    if not words:
        raise ValueError("worker command: empty")
    return words


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings used by the builders (pure data, hashable)."""

    worker_image: str = DEFAULT_WORKER_IMAGE
    worker_command: tuple[str, ...] = ("npu-lora",)
    image_pull_policy: str = "IfNotPresent"
    #: uid/gid of the worker (the worker image's non-root user)
    run_as_user: int = 1000
    #: size limit of the /tmp emptyDir (the root filesystem is read-only)
    tmp_size_limit: str = "8Gi"
    #: extra environment for every worker (e.g. the sandbox's PYTHONPATH); name -> value
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: what a MoEFinetune may put into its pod, and the default resources (see .policy)
    policy: PodPolicy = field(default_factory=PodPolicy)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> OperatorConfig:
        env = dict(_env(env))
        kwargs: dict[str, object] = {}
        if env.get(ENV_WORKER_IMAGE):
            kwargs["worker_image"] = env[ENV_WORKER_IMAGE]
        if env.get(ENV_WORKER_COMMAND):
            kwargs["worker_command"] = tuple(parse_command(env[ENV_WORKER_COMMAND]))
        if env.get(ENV_IMAGE_PULL_POLICY):
            kwargs["image_pull_policy"] = env[ENV_IMAGE_PULL_POLICY]
        if env.get(ENV_POLICY):
            kwargs["policy"] = PodPolicy.from_json(env[ENV_POLICY])
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        if "worker_command" in kwargs:
            kwargs["worker_command"] = tuple(kwargs["worker_command"])  # type: ignore[arg-type]
        return cls(**kwargs)  # type: ignore[arg-type]
