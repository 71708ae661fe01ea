"""Issue 12 items 1/2 (security) re-run as written, against ``npu-lora sandbox``'s parts.

Usage: python experiments/hardening/run_security_cases.py [OUT.md]
Starts the sandbox (emulator over HTTPS, kubelet, the operator in a thread as its own
ServiceAccount), applies a suspended run ``victim`` and a short run ``worker-a`` with the user's
(admin) kubeconfig, then runs each case with the real ``kubectl`` (worker-a's pod kubeconfig) and
``curl``, and the admission-policy cases; records exit code / HTTP status and the message.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from e2e_harness import manifest  # noqa: E402
from npu_lora_sandbox.command import start_sandbox, stop_sandbox  # noqa: E402


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="i12sec-"))
    parts = start_sandbox(tmp / "root")
    emu, kubelet, kc = parts["emulator"], parts["kubelet"], parts["kubeconfig"]
    rows: list[tuple[str, str, str]] = []

    def kubectl(config: Path, *args: str, input: str | None = None) -> tuple[int, str, str]:
        r = subprocess.run(
            ["kubectl", f"--kubeconfig={config}", f"--cache-dir={tmp / 'cache'}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        err = [x for x in r.stderr.splitlines() if not x.startswith(("E1", "W1", "I1"))]
        return r.returncode, r.stdout.strip(), (err[-1] if err else "")

    def status(name: str) -> dict:
        obj = emu.get("npu-lora.io/v1alpha1", "MoEFinetune", name, namespace="default") or {}
        return obj.get("status") or {}

    def wait(name: str, phases: tuple[str, ...], timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = status(name)
            if st.get("phase") in phases:
                return st
            time.sleep(0.5)
        raise SystemExit(f"{name}: not {phases} within {timeout}s: {status(name)}")

    try:
        kubectl(kc, "create", "secret", "generic", "db-password", "--from-literal=p=hunter2")
        for obj in (manifest("victim", steps=4, suspend=True), manifest("worker-a", steps=4)):
            kubectl(kc, "apply", "-f", "-", input=yaml.safe_dump(obj))
        wait("victim", ("Suspended",))
        wait("worker-a", ("Succeeded", "Failed"))
        pod = emu.list("v1", "Pod", namespace="default", label_selector="npu-lora.io/run=worker-a")
        wk = kubelet.pod_dir("default", pod[0]["metadata"]["name"]) / "kubeconfig"
        job = emu.get("batch/v1", "Job", "worker-a", namespace="default")
        res = job["spec"]["template"]["spec"]["containers"][0].get("resources")
        rows.append(("worker Job resources (spec sets none)", "-", json.dumps(res)))
        forged = '{"status":{"phase":"Succeeded"}}'
        cases = [
            ("worker kubeconfig: kubectl get mft victim", ("get", "mft", "victim")),
            ("worker kubeconfig: kubectl get mft (list)", ("get", "mft")),
            ("worker kubeconfig: kubectl get secrets", ("get", "secrets")),
            ("worker kubeconfig: kubectl get secret db-password", ("get", "secret", "db-password")),
            (
                "worker kubeconfig: patch victim spec.suspend=false",
                ("patch", "mft", "victim", "--type", "merge", "-p", '{"spec":{"suspend":false}}'),
            ),
            (
                "worker kubeconfig: forge victim status phase Succeeded",
                ("patch", "mft", "victim", "--subresource=status", "--type", "merge", "-p", forged),
            ),
            (
                "worker kubeconfig: kubectl --as=system:admin get secrets",
                ("get", "secrets", "--as=system:admin"),
            ),
            (
                "worker kubeconfig: kubectl get mft worker-a (its own run)",
                ("get", "mft", "worker-a", "-o", "name"),
            ),
        ]
        for title, args in cases:
            code, out, err = kubectl(wk, *args)
            rows.append((title, str(code), err or out))
        bogus = tmp / "bogus"
        cfg = yaml.safe_load(wk.read_text())
        cfg["users"][0]["user"]["token"] = "sandbox-sa-" + "x" * 43
        bogus.write_text(yaml.safe_dump(cfg))
        code, out, err = kubectl(bogus, "get", "mft", "worker-a")
        rows.append(("bogus token: kubectl get mft worker-a", str(code), err))
        st = status("victim")
        rows.append(("victim afterwards", "-", f"phase {st.get('phase')}, spec.suspend still true"))

        curl = shutil.which("curl")
        token = yaml.safe_load(wk.read_text())["users"][0]["user"]["token"]
        for title, path, tok in (
            ("curl no token /version", "/version", None),
            ("curl no token /healthz", "/healthz", None),
            ("curl no token /api", "/api", None),
            ("curl no token secrets", "/api/v1/namespaces/default/secrets", None),
            (
                "curl no token mft victim",
                "/apis/npu-lora.io/v1alpha1/namespaces/default/moefinetunes/victim",
                None,
            ),
            ("curl bogus token /version", "/version", "bogus"),
            ("curl bogus token secrets", "/api/v1/namespaces/default/secrets", "bogus"),
            ("curl worker token /apis", "/apis", token),
            ("curl worker token secrets", "/api/v1/namespaces/default/secrets", token),
            ("curl admin token secrets", "/api/v1/namespaces/default/secrets", emu.admin_token),
            (
                "curl PATCH victim/status phase Succeeded, worker token",
                "/apis/npu-lora.io/v1alpha1/namespaces/default/moefinetunes/victim/status",
                token,
            ),
            (
                "curl PATCH victim/status phase Succeeded, no token",
                "/apis/npu-lora.io/v1alpha1/namespaces/default/moefinetunes/victim/status",
                None,
            ),
        ):
            args = [
                curl or "curl",
                "-s",
                "--cacert",
                str(emu.tls.cert_file),
                "-w",
                "\n%{http_code}",
            ]
            if tok:
                args += ["-H", f"Authorization: Bearer {tok}"]
            if title.startswith("curl PATCH"):
                args += ["-X", "PATCH", "-H", "Content-Type: application/merge-patch+json"]
                args += ["--data", forged]
            out = subprocess.run([*args, emu.url + path], capture_output=True, text=True).stdout
            body, _, code = out.rpartition("\n")
            try:
                msg = json.loads(body).get("message") or json.loads(body).get("kind", "")
            except ValueError:
                msg = body[:60]
            rows.append((title, code, msg))

        policy_cases = [
            (
                "policy: spec.image docker.io/evil/miner",
                "p-image",
                {"image": "docker.io/evil/miner:latest"},
            ),
            (
                "policy: output.volume.hostPath /",
                "p-host",
                {"output": {"volume": {"hostPath": "/"}}},
            ),
            (
                "policy: podTemplate.serviceAccountName default",
                "p-sa",
                {"podTemplate": {"serviceAccountName": "default"}},
            ),
            (
                "policy: podTemplate.volumes hostPath /",
                "p-vol",
                {
                    "podTemplate": {
                        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
                        "volumeMounts": [{"name": "h", "mountPath": "/host"}],
                    }
                },
            ),
        ]
        for _, name, spec in policy_cases:
            kubectl(kc, "apply", "-f", "-", input=yaml.safe_dump(manifest(name, **spec)))
        for title, name, _ in policy_cases:
            st = wait(name, ("Failed", "Succeeded", "Running"), 60)
            jobs = emu.list(
                "batch/v1", "Job", namespace="default", label_selector=f"npu-lora.io/run={name}"
            )
            cond = next(c for c in st["conditions"] if c["status"] == "True")
            rows.append(
                (title, f"{st['phase']}/{cond['reason']}", f"{st['message']} (Jobs: {len(jobs)})")
            )
    finally:
        stop_sandbox(parts)
    table = ["| case | exit / HTTP / phase | message |", "|---|---|---|"]
    table += [f"| {t} | {c} | {m.replace('|', '/')} |" for t, c, m in rows]
    text = "\n".join(table) + "\n"
    print(text)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)


if __name__ == "__main__":
    main()
