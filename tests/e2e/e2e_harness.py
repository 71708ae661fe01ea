"""Helpers of the e2e tests (imported by conftest.py and the tests): manifests, the operator
subprocess, the cluster handle."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sandbox_fixtures
import yaml
from testkit import free_port

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "npu-lora.io_moefinetunes.yaml"

wait_until = sandbox_fixtures.wait_for


def manifest(name: str, *, steps: int = 8, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:nsmc-mini", "format": "nsmc"},
        "lora": {"r": 4, "targetModules": ["q_proj", "v_proj"]},
        "moe": {"placement": "hot", "hotFraction": 0.25, "warmupSteps": 2, "hostThreads": 1},
        "training": {"steps": steps, "seqLen": 32, "batchSize": 1, "learningRate": 0.001},
        "device": {"backend": "cpu", "cards": 0},
        "output": {"volume": {"claimName": "runs"}},
        "checkpoint": {"everySteps": 2},
        "reporting": {"everySteps": 1, "minIntervalSeconds": 0},
        "backoffLimit": 0,
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": name},
        "spec": body,
    }


def to_yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=False)


class OperatorProcess:
    """``npu-lora operator`` against the emulator, as a real subprocess."""

    def __init__(self, kubeconfig: Path, logdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.logdir = logdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    metrics_url: str = ""

    def start(self, timeout: float = 60) -> OperatorProcess:
        port = free_port()
        metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.starts += 1
        log = open(self.logdir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "npu_lora.cli",
                "operator",
                "--kubeconfig",
                str(self.kubeconfig),
                "--namespace",
                "default",
                "--worker-image",
                "npu-lora-worker:e2e",
                "--worker-command",
                "python -m npu_lora.cli",
                "--image-pull-policy",
                "Never",
                "--liveness",
                f"http://127.0.0.1:{port}/healthz",
                "--metrics-port",
                str(metrics_port),
                "--metrics-address",
                "127.0.0.1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        url = f"http://127.0.0.1:{port}/healthz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited early:\n{self.log()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return self
            time.sleep(0.2)
        raise AssertionError(f"operator not live within {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL, like a crashed or evicted operator pod."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-6000:]
            for p in sorted(self.logdir.glob("operator-*.log"))
        )

    def wait(self, pred: Any, timeout: float, what: str) -> Any:
        """:func:`wait_until` ``pred``; on a time-out the error carries this operator's log."""
        try:
            return wait_until(pred, timeout=timeout, interval=0.3)
        except AssertionError:
            raise AssertionError(
                f"timed out waiting for {what}\noperator log:\n{self.log()}"
            ) from None


@dataclass
class Cluster:
    emulator: Any
    kubelet: Any
    kubeconfig: Path
    kubectl: Any

    def apply(self, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.kubectl("apply", "-f", "-", input=to_yaml(obj), check=check)

    def mft(self, name: str) -> dict[str, Any] | None:
        return self.emulator.get("npu-lora.io/v1alpha1", "MoEFinetune", name, namespace="default")

    def status(self, name: str) -> dict[str, Any]:
        return (self.mft(name) or {}).get("status") or {}

    def jobs(self, name: str) -> list[dict[str, Any]]:
        return self.emulator.list(
            "batch/v1", "Job", namespace="default", label_selector=f"npu-lora.io/run={name}"
        )

    def pods(self, name: str) -> list[dict[str, Any]]:
        return self.emulator.list(
            "v1", "Pod", namespace="default", label_selector=f"npu-lora.io/run={name}"
        )

    def row(self, name: str, *extra: str) -> dict[str, str]:
        """``kubectl get mft NAME`` as {COLUMN: value}."""
        out = self.kubectl("get", "mft", name, *extra).stdout.splitlines()
        header, line = out[0], out[1]
        starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
        cols = {}
        for k, s in enumerate(starts):
            e = starts[k + 1] if k + 1 < len(starts) else None
            cols[header[s:e].strip()] = line[s:e].strip()
        return cols
