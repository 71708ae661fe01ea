"""settings.py owns the operator's environment: namespaces, liveness, log level, worker config."""

from __future__ import annotations

from npu_lora_operator import settings as s


def test_watched_namespaces() -> None:
    env = {"NPU_LORA_NAMESPACES": " a, b ,,"}
    assert s.watched_namespaces(env=env) == ["a", "b"]
    assert s.watched_namespaces(["x,y", "z"], env=env) == ["x", "y", "z"]
    assert s.watched_namespaces(["x"], all_namespaces=True, env=env) == []
    assert s.watched_namespaces(env={}) == []


def test_process_defaults_from_env() -> None:
    assert s.default_liveness({"NPU_LORA_LIVENESS": ""}) is None
    assert s.default_liveness({"NPU_LORA_LIVENESS": "http://0.0.0.0:8080/h"}) == (
        "http://0.0.0.0:8080/h"
    )
    assert s.default_log_level({}) == "INFO"
    assert s.default_log_level({"NPU_LORA_LOG_LEVEL": "DEBUG"}) == "DEBUG"
    cfg = s.OperatorConfig.from_env({"NPU_LORA_WORKER_COMMAND": "python -m npu_lora.cli"})
    assert cfg.worker_command == ("python", "-m", "npu_lora.cli")
