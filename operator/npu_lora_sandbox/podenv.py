"""A pod's local environment for the sandbox kubelet (see :class:`PodEnvironment`)."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npu_lora.machine import kernel_cache_root

from .runtime import Launch

NODE_NAME = "sandbox-node"


SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"

#: where a container runtime (``host_paths`` False) mounts the pod's kubeconfig
POD_KUBECONFIG = "/var/run/secrets/npu-lora-sandbox/kubeconfig"


PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR", "SYSTEMROOT")


class _StartError(Exception):
    pass


_VOLUME_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _volume_dir(pdir: Path, vm: dict[str, Any]) -> Path:
    """The pod's own directory of the volume a mount names: the name is a DNS-1123 label (the
    API server refuses others; checked again here, as ``../x`` would leave the pod)."""
    name = vm.get("name")
    if not isinstance(name, str) or len(name) > 63 or not _VOLUME_NAME.fullmatch(name):
        raise _StartError(
            f"sandbox kubelet: volume name {str(name)[:64]!r} is not a DNS-1123 label"
        )
    return pdir / "volumes" / name


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion, as the kubelet does it: ``$$`` is a literal ``$`` (before
    anything), ``$(NAME)`` the variable's value (unknown: left as written), any other ``$`` kept."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 == n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(" and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(env.get(name, f"$({name})"))
            i = end + 1
        else:
            out.append("$" + nxt if nxt != "(" else "$(")
            i += 2
    return "".join(out)


def _field_ref(pod: dict[str, Any], path: str) -> str:
    meta = pod["metadata"]
    m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": NODE_NAME,
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", "default"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    return str(simple.get(path) or "")


def _rewriter(mapping: Mapping[str, Path]) -> Any:
    """Replace container paths (whole path components, longest first) with local paths."""
    items = sorted(
        ((k, str(v)) for k, v in mapping.items() if k and k != "/"), key=lambda kv: -len(kv[0])
    )
    if not items:
        return lambda s: s
    pattern = re.compile(
        "|".join(rf"(?<![\w.\-/]){re.escape(k)}(?=/|$|[^\w.\-])" for k, _ in items)
    )
    table = dict(items)

    def rewrite(text: str) -> str:
        return pattern.sub(lambda m: table[m.group(0)], text)

    return rewrite


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` readable by its owner only (0600, also when it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


class PodEnvironment:
    """The pod environment: volumes as local directories, materialised configMaps and
    secrets, the service account, the container's environment and path rewriting.

    A mixin of :class:`~npu_lora_sandbox.kubelet.LocalKubelet` (its state lives there).
    """

    def _mounts(
        self, pod: dict[str, Any], container: dict[str, Any], pdir: Path
    ) -> dict[str, Path]:
        volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
        ns = pod["metadata"]["namespace"]
        mapping: dict[str, Path] = {}
        for vm in container.get("volumeMounts") or []:
            vol = volumes.get(vm.get("name"), {})
            if "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"].get("claimName", vm.get("name"))
                try:
                    local = self.pvc_dir(claim, ns)
                except ValueError as e:
                    raise _StartError(f"sandbox kubelet: volume {vm.get('name')!r}: {e}") from None
            elif "hostPath" in vol:
                local = Path(vol["hostPath"].get("path", "/"))
                self._check_host_path(local, vm)
            else:
                local = _volume_dir(pdir, vm)
            sub = vm.get("subPath")
            if sub:
                # the kubelet refuses a subPath that is absolute or climbs out of its volume
                if str(sub).startswith("/") or ".." in str(sub).split("/"):
                    raise _StartError(
                        f"sandbox kubelet: volumeMount {vm.get('name')!r}: subPath must be a "
                        "relative path without '..'"
                    )
                local = local / sub
            if "hostPath" not in vol:
                local.mkdir(parents=True, exist_ok=True)
            mapping[str(vm.get("mountPath", "")).rstrip("/") or "/"] = local
        return mapping

    def _check_host_path(self, local: Path, vm: dict[str, Any]) -> None:
        """A hostPath may not reach the sandbox's own state (its root holds the admin
        kubeconfig, the tokens and every pod's files)."""
        try:
            path = local.resolve()
            root = Path(self.root).resolve()
        except OSError:
            return
        private = [root, *(Path(p).resolve() for p in getattr(self, "private_paths", ()))]
        for q in private:
            if path == q or q.is_relative_to(path) or path.is_relative_to(q):
                raise _StartError(
                    f"sandbox kubelet: volumeMount {vm.get('name')!r}: a hostPath may not reach "
                    "the sandbox's private state (its root, the admin kubeconfig)"
                )

    def _materialise(
        self, pod: dict[str, Any], container: dict[str, Any], pdir: Path, rewrite: Any
    ) -> None:
        ns = pod["metadata"]["namespace"]
        volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
        for vm in container.get("volumeMounts") or []:
            vol = volumes.get(vm.get("name"), {})
            src: dict[str, bytes] = {}
            items = None
            if "configMap" in vol:
                cm = self.emu.get("v1", "ConfigMap", vol["configMap"].get("name", ""), ns) or {}
                src = {k: rewrite(v).encode() for k, v in (cm.get("data") or {}).items()}
                src.update(
                    {k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()}
                )
                items = vol["configMap"].get("items")
            elif "secret" in vol:
                sec = self.emu.get("v1", "Secret", vol["secret"].get("secretName", ""), ns) or {}
                src = {k: base64.b64decode(v) for k, v in (sec.get("data") or {}).items()}
                src.update({k: str(v).encode() for k, v in (sec.get("stringData") or {}).items()})
                items = vol["secret"].get("items")
            else:
                continue
            target = _volume_dir(pdir, vm)
            target.mkdir(parents=True, exist_ok=True)
            files = (
                {i["key"]: i.get("path", i["key"]) for i in items} if items else {k: k for k in src}
            )
            for key, rel in files.items():
                # a key or an item path names a file inside the volume (the API server refuses
                # others; checked again here: `../x` or `/x` would write outside the pod)
                parts = str(rel).split("/")
                if not rel or str(rel).startswith("/") or ".." in parts or "\x00" in str(rel):
                    raise _StartError(
                        f"sandbox kubelet: volume {vm.get('name')!r}: {str(rel)[:64]!r} is not a "
                        "relative file name inside the volume"
                    )
                if key in src:
                    dest = target / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(src[key])

    def _env(
        self, pod: dict[str, Any], container: dict[str, Any], rewrite: Any, host: bool = True
    ) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {k: os.environ[k] for k in PASS_ENV if k in os.environ and host}
        if host:  # the worker image's ENV: its kernels are built once, not per pod
            env["NPU_LORA_KERNEL_CACHE"] = str(kernel_cache_root())
        env.update(self.extra_env)
        for src in container.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                cm = self.emu.get("v1", "ConfigMap", src["configMapRef"].get("name", ""), ns) or {}
                env.update({prefix + k: rewrite(str(v)) for k, v in (cm.get("data") or {}).items()})
            if "secretRef" in src:
                sec = self.emu.get("v1", "Secret", src["secretRef"].get("name", ""), ns) or {}
                env.update(
                    {
                        prefix + k: base64.b64decode(v).decode(errors="replace")
                        for k, v in (sec.get("data") or {}).items()
                    }
                )
        for item in container.get("env") or []:
            name = item.get("name")
            if not name:
                continue
            if "value" in item:
                env[name] = rewrite(_expand(str(item["value"]), env))
                continue
            vf = item.get("valueFrom") or {}
            value: str | None = None
            if "fieldRef" in vf:
                value = _field_ref(pod, vf["fieldRef"].get("fieldPath", ""))
            elif "configMapKeyRef" in vf:
                ref = vf["configMapKeyRef"]
                cm = self.emu.get("v1", "ConfigMap", ref.get("name", ""), ns) or {}
                raw = (cm.get("data") or {}).get(ref.get("key", ""))
                value = rewrite(raw) if raw is not None else None
            elif "secretKeyRef" in vf:
                ref = vf["secretKeyRef"]
                sec = self.emu.get("v1", "Secret", ref.get("name", ""), ns) or {}
                raw = (sec.get("data") or {}).get(ref.get("key", ""))
                value = base64.b64decode(raw).decode(errors="replace") if raw is not None else None
            elif "resourceFieldRef" in vf:
                value = "1"
            if value is not None:
                env[name] = value
        self._resolve_pod_names(pod, env)
        return env

    def _resolve_pod_names(self, pod: dict[str, Any], env: dict[str, str]) -> None:
        """Pod DNS names in the environment → ``127.0.0.1``: every sandbox pod runs on this
        machine (``status.podIP`` is 127.0.0.1), so the stable name a headless Service gives a
        pod (``<hostname>.<subdomain>[.<namespace>[.svc[.cluster.local]]]``, e.g. the
        ``MASTER_ADDR`` of a data-parallel run) is loopback. Only names under the pod's own
        ``spec.subdomain`` and only when that Service exists (without it, cluster DNS would not
        resolve the name either). No /etc/hosts, no DNS server."""
        sub = (pod.get("spec") or {}).get("subdomain")
        ns = pod["metadata"]["namespace"]
        if not sub or self.emu.get("v1", "Service", sub, ns) is None:
            return
        name = re.compile(
            r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\."
            + re.escape(sub)
            + rf"(\.{re.escape(ns)}(\.svc(\.cluster\.local)?)?)?$"
        )
        for key, value in env.items():
            if name.match(value):
                env[key] = "127.0.0.1"

    def _prepare(
        self, pod: dict[str, Any], container: dict[str, Any], pdir: Path, log_path: Path
    ) -> tuple[Launch, Path]:
        """The container's :class:`~npu_lora_sandbox.runtime.Launch` and its local
        termination-message file. Raises :class:`_StartError` when it has no command.

        With a runtime whose ``host_paths`` is False (a real container runtime) nothing is
        rewritten and nothing of this process's environment is passed: argv, env and workingDir
        keep container paths, the kubeconfig is mounted at :data:`POD_KUBECONFIG` and an empty
        command means the image's entrypoint."""
        name = pod["metadata"]["name"]
        host = bool(getattr(self.runtime, "host_paths", True))
        mapping = self._mounts(pod, container, pdir)
        tm_path = str(container.get("terminationMessagePath") or "/dev/termination-log")
        tm_local = pdir / "termination-log"
        tm_local.touch()
        mapping[tm_path] = tm_local
        kubeconfig, sa_dir = self._service_account(pod, pdir)
        mapping.setdefault(SA_PATH, sa_dir)
        rewrite = _rewriter(mapping) if host else str
        self._materialise(pod, container, pdir, rewrite)
        env = self._env(pod, container, rewrite, host)
        if host:
            py_bin = str(Path(self.python_executable).parent)
            env["PATH"] = os.pathsep.join([py_bin, env.get("PATH", os.defpath)])
            env["KUBECONFIG"] = str(kubeconfig)
            env["NPU_LORA_PATH_MAP"] = json.dumps({k: str(v) for k, v in mapping.items()})
            env["NPU_LORA_TERMINATION_MESSAGE_PATH"] = str(tm_local)
        else:
            mapping[POD_KUBECONFIG] = Path(kubeconfig)
            env["KUBECONFIG"] = POD_KUBECONFIG
        env["NPU_LORA_SANDBOX"] = "1"
        env.setdefault("HOSTNAME", name)
        self._check_private_env(env)
        argv = self._argv(container, env, rewrite, host)
        workdir = rewrite(str(container.get("workingDir") or ""))
        if host:
            workdir = workdir or str(pdir)
            Path(workdir).mkdir(parents=True, exist_ok=True)
        image = str(container.get("image", ""))
        launch = Launch(
            argv, env, workdir, log_path, image=image, mounts=mapping, pod=pod, container=container
        )
        return launch, tm_local

    def _check_private_env(self, env: Mapping[str, str]) -> None:
        """A pod's environment never names the sandbox's private state (the admin kubeconfig's
        directory or path) nor carries the admin token, whatever put it there (the pod spec,
        ``extra_env``, this process's environment). ``pod_identity=False`` is exempt: it gives
        pods the admin kubeconfig on purpose (tests only)."""
        if not getattr(self, "pod_identity", True):
            return
        needles = {self.emu.admin_token}
        for p in getattr(self, "private_paths", ()):
            needles |= {str(p), str(Path(p).resolve())}
        for key, value in env.items():
            if any(n and n in value for n in needles):
                raise _StartError(
                    f"sandbox kubelet: env {key!r} names the sandbox's private state (the admin "
                    "kubeconfig or its token); a pod gets only its own kubeconfig and token"
                )

    def _service_account(self, pod: dict[str, Any], pdir: Path) -> tuple[Path, Path]:
        """The pod's kubeconfig (its ServiceAccount's identity, or the admin's without
        ``pod_identity``) and its service-account directory (namespace, token, ca.crt)."""
        ns = pod["metadata"]["namespace"]
        sa_name = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
        if self.pod_identity:
            kubeconfig = self.emu.write_kubeconfig(
                pdir / "kubeconfig", namespace=ns, service_account=(ns, sa_name)
            )
            token = self.emu.service_account_token(ns, sa_name)
        else:
            kubeconfig, token = self.kubeconfig, "sandbox"
        sa_dir = pdir / "serviceaccount"
        sa_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(sa_dir, 0o700)
        (sa_dir / "namespace").write_text(ns)
        _write_private(sa_dir / "token", token.encode())
        (sa_dir / "ca.crt").write_bytes(self.emu.tls.cert_pem)
        if self.pod_identity:
            os.chmod(kubeconfig, 0o600)
        return Path(kubeconfig), sa_dir

    def _argv(
        self, container: dict[str, Any], env: dict[str, str], rewrite: Any, host: bool = True
    ) -> list[str]:
        """``command`` (or the image's configured entrypoint) + ``args``, expanded and rewritten;
        ``python``/``python3`` become ``python_executable``. Without ``host``: ``command`` +
        ``args`` expanded only (no command: the image's entrypoint runs the args)."""
        image = str(container.get("image", ""))
        command = list(container.get("command") or [])
        if not host:
            return [_expand(str(a), env) for a in command + list(container.get("args") or [])]
        if not command:
            for prefix, entry in self.entrypoints.items():
                if image.startswith(prefix):
                    command = list(entry)
                    break
        if not command:
            cname = container.get("name", "main")
            raise _StartError(
                f"sandbox kubelet: container {cname!r} has no command (image {image!r}); set one or configure entrypoints"
            )
        argv = [rewrite(_expand(str(a), env)) for a in command + list(container.get("args") or [])]
        if argv[0] in ("python", "python3"):
            argv[0] = self.python_executable
        return argv
