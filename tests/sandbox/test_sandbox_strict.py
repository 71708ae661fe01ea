"""The sandbox as strict as a real API server and kubelet (issue 28): bounded YAML alias
expansion, duplicate JSON keys refused under fieldValidation=Strict, claim directories per
namespace with validated names, private token files, no hostPath to the sandbox's own state,
and a bounded shutdown on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import ssl
import stat
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet
from npu_lora_sandbox.podenv import _StartError

CM = "/api/v1/namespaces/default/configmaps"


def _request(
    emu: ApiEmulator, method: str, path: str, body: bytes, ctype: str = "application/json"
) -> tuple[int, dict[str, Any], dict[str, str]]:
    ctx = ssl.create_default_context(cadata=emu.tls.cert_pem.decode())
    req = urllib.request.Request(
        emu.url + path,
        data=body,
        method=method,
        headers={"Authorization": f"Bearer {emu.admin_token}", "Content-Type": ctype},
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


def _cm(name: str) -> str:
    return f'{{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {{"name": "{name}"}}'


def test_duplicate_json_keys_are_refused_under_strict(emulator: ApiEmulator) -> None:
    body = (_cm("dup") + ', "data": {"a": "1", "a": "2"}}').encode()
    code, out, _ = _request(emulator, "POST", CM + "?fieldValidation=Strict", body)
    assert code == 400 and 'duplicate field "a"' in out["message"]
    assert emulator.get("v1", "ConfigMap", "dup", "default") is None
    # Warn: created, with a warning; Ignore: silently the last
    code, _, headers = _request(emulator, "POST", CM + "?fieldValidation=Warn", body)
    assert code == 201 and "duplicate field" in headers.get("Warning", "")
    body2 = (_cm("dup2") + ', "data": {"a": "1", "a": "2"}}').encode()
    code, out, _ = _request(emulator, "POST", CM + "?fieldValidation=Ignore", body2)
    assert code == 201 and out["data"] == {"a": "2"}


def test_duplicate_metadata_name_is_refused_under_strict(emulator: ApiEmulator) -> None:
    body = b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "name": "y"}}'
    code, out, _ = _request(emulator, "POST", CM + "?fieldValidation=Strict", body)
    assert code == 400 and 'duplicate field "name"' in out["message"]


def test_yaml_alias_bomb_is_refused_quickly(emulator: ApiEmulator) -> None:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
    bomb = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bomb}\nextra:\n" + "\n".join(
        "  " + x for x in lines
    )
    t0 = time.monotonic()
    code, out, _ = _request(
        emulator,
        "PATCH",
        CM + "/bomb?fieldManager=t",
        bomb.encode(),
        "application/apply-patch+yaml",
    )
    assert code == 400 and "alias" in out["message"]
    assert time.monotonic() - t0 < 5
    deep = ("[" * 200 + "]" * 200).encode()
    code, _, _ = _request(emulator, "POST", CM, deep, "application/yaml")
    assert code == 400


def test_deeply_nested_json_is_a_400_not_a_crash(emulator: ApiEmulator) -> None:
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    code, _, _ = _request(emulator, "POST", CM, deep)
    assert code == 400
    assert _request(emulator, "POST", CM, (_cm("after") + "}").encode())[0] == 201


def test_claim_directories_are_per_namespace_and_names_checked(kubelet: LocalKubelet) -> None:
    a, b = kubelet.pvc_dir("runs", "team-a"), kubelet.pvc_dir("runs", "team-b")
    assert a != b and a.parent.name == "team-a" and a.is_relative_to(kubelet.root)
    for bad in ("..", "../../etc", "a/b", "", "A", "x" * 254):
        with pytest.raises(ValueError, match="DNS-1123"):
            kubelet.pvc_dir(bad, "default")
    with pytest.raises(ValueError):
        kubelet.pvc_dir("runs", "../x")


def _pod(volumes: list[dict], mounts: list[dict], ns: str = "default") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": ns},
        "spec": {"volumes": volumes, "containers": [{"name": "c", "volumeMounts": mounts}]},
    }


@pytest.mark.parametrize(
    "volume,mount",
    [
        ({"persistentVolumeClaim": {"claimName": "../../escape"}}, {}),
        ({"persistentVolumeClaim": {"claimName": "runs"}}, {"subPath": "../../.."}),
        ({"persistentVolumeClaim": {"claimName": "runs"}}, {"subPath": "/etc"}),
        ({"hostPath": {"path": "/"}}, {}),  # above the sandbox root
    ],
)
def test_hostile_volumes_do_not_start_a_pod(
    kubelet: LocalKubelet, tmp_path: Path, volume: dict, mount: dict
) -> None:
    pod = _pod([{"name": "v", **volume}], [{"name": "v", "mountPath": "/x", **mount}])
    with pytest.raises(_StartError):
        kubelet._mounts(pod, pod["spec"]["containers"][0], tmp_path / "pod")
    assert not (tmp_path / "escape").exists()


def test_host_path_to_the_sandbox_state_is_refused(kubelet: LocalKubelet, tmp_path: Path) -> None:
    for path in (kubelet.root, kubelet.root / "pods", kubelet.kubeconfig):
        pod = _pod(
            [{"name": "v", "hostPath": {"path": str(path)}}], [{"name": "v", "mountPath": "/x"}]
        )
        with pytest.raises(_StartError, match="private state"):
            kubelet._mounts(pod, pod["spec"]["containers"][0], tmp_path / "pod")
    ok = tmp_path / "shared-data"
    ok.mkdir()
    pod = _pod([{"name": "v", "hostPath": {"path": str(ok)}}], [{"name": "v", "mountPath": "/x"}])
    assert kubelet._mounts(pod, pod["spec"]["containers"][0], tmp_path / "pod") == {"/x": ok}


def test_service_account_token_and_kubeconfig_are_private(
    kubelet: LocalKubelet, tmp_path: Path
) -> None:
    pdir = tmp_path / "pod"
    pdir.mkdir()
    kc, sa_dir = kubelet._service_account(_pod([], []), pdir)
    for p in (sa_dir / "token", kc):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(sa_dir.stat().st_mode) == 0o700


_WEDGED = textwrap.dedent(
    """
    import sys, time, threading
    from npu_lora_sandbox import command
    command.SHUTDOWN_GRACE = 2.0
    command.start_sandbox = lambda *a, **k: {"kubeconfig": "k", "root": "r", "runtime": "subprocess",
                                             "emulator": type("E", (), {"url": "u"})(),
                                             "worker_image": "w",
                                             "kubelet": type("K", (), {"pvc_dir": lambda self, c, n:
                                                 __import__("pathlib").Path(c, n)})()}
    command.stop_sandbox = lambda parts: time.sleep(3600)   # wedged
    import argparse
    args = argparse.Namespace(log_level="WARNING", root=sys.argv[1], kubeconfig=None, port=0,
        host="127.0.0.1", no_operator=True, runtime="subprocess", worker_image=None,
        operator_image=None, operator_in_process=False, node_label=[])
    command.run(args)
    """
)


def test_sigterm_stops_a_wedged_sandbox_within_the_grace(tmp_path: Path) -> None:
    env = {**os.environ}
    p = subprocess.Popen(
        [sys.executable, "-c", _WEDGED, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "npu-lora sandbox" in line
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=15)
        assert code == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 10
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_duplicate_yaml_keys_are_refused_under_strict(emulator: ApiEmulator) -> None:
    doc = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ydup}\ndata: {a: '1', a: '2'}\n"
    code, out, _ = _request(
        emulator,
        "PATCH",
        CM + "/ydup?fieldManager=t&fieldValidation=Strict",
        doc.encode(),
        "application/apply-patch+yaml",
    )
    assert code == 400 and "duplicate key 'a'" in out["message"]
    code, _, _ = _request(
        emulator, "POST", CM + "?fieldValidation=Strict", doc.encode(), "application/yaml"
    )
    assert code == 400
