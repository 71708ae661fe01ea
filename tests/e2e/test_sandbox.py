"""``npu-lora sandbox``: emulator + kubelet + operator (in a thread) in one process; the example
manifest trains to Succeeded through the real kubectl."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e_harness import ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]


def test_sandbox_runs_the_example(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    kc = tmp_path / "kc"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "npu_lora.cli",
            "sandbox",
            "--root",
            str(tmp_path / "root"),
            "--kubeconfig",
            str(kc),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    banner = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            banner.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(banner)
        assert f"export KUBECONFIG={kc}" in text, text
        assert "kubectl apply -f" in text and "kubectl get mft -w" in text

        def k(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            r = subprocess.run(
                [kubectl, f"--kubeconfig={kc}", *args], capture_output=True, text=True, timeout=30
            )
            if check:
                assert r.returncode == 0, r.stderr
            return r

        # the example as shipped, shortened to keep the test fast
        example = yaml.safe_load((ROOT / "examples" / "tiny-sandbox.yaml").read_text())
        example["spec"]["training"]["steps"] = 12
        r = subprocess.run(
            [kubectl, f"--kubeconfig={kc}", "apply", "-f", "-"],
            input=yaml.safe_dump(example),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 300
        phase = ""
        while time.monotonic() < deadline:
            out = k("get", "mft", "tiny-sandbox", "-o", "json").stdout
            phase = (json.loads(out).get("status") or {}).get("phase", "")
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        table = k("get", "mft").stdout
        assert phase == "Succeeded", table
        header, row = table.splitlines()[:2]
        assert header.split()[:10] == [
            "NAME",
            "PHASE",
            "PROGRESS",
            "STEP",
            "LOSS",
            "S/STEP",
            "ATTN",
            "HOST-FWD",
            "HOST-BWD",
            "HOT",
        ]
        # PROGRESS: Kubeflow Trainer's trainerStatus.progressPercentage
        assert row.split()[1:4] == ["Succeeded", "100", "12"]
        run_dir = tmp_path / "root" / "pvc" / "default" / "runs" / "tiny-sandbox"
        assert (run_dir / "summary.json").exists() and (run_dir / "adapter").is_dir()
        # the operator ran as its own ServiceAccount (the chart's ClusterRole), not as the admin
        token = yaml.safe_load(kc.read_text())["users"][0]["user"]["token"]
        op_kc = yaml.safe_load((tmp_path / "root" / "admin" / "operator-kubeconfig").read_text())
        assert op_kc["users"][0]["user"]["token"] != token
        op = "--as=system:serviceaccount:npu-lora-system:npu-lora-operator"
        assert k("auth", "can-i", "create", "jobs.batch", op).stdout.strip() == "yes"
        assert k("auth", "can-i", "get", "secrets", op, check=False).stdout.strip() == "no"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
