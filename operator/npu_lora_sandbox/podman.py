"""A container runtime for the sandbox kubelet: each pod's container runs in podman.

``npu-lora sandbox --runtime podman`` (or ``LocalKubelet(emu, root, runtime=PodmanRuntime())``).
The pod environment (:mod:`.podenv`) is the same as for the host runtime, except that nothing is
rewritten: the container sees its own paths, and :class:`PodmanRuntime` maps them
(:attr:`~.runtime.Launch.mounts`) to the sandbox's directories. What a pod's spec becomes
(:func:`podman_run_args`, a pure function):

- ``image`` → the image (``imagePullPolicy`` ``Never``: it must be present; otherwise a missing
  image is pulled once, and a failed pull fails the start);
- ``command`` → ``--entrypoint``, ``args`` after the image (no ``command``: the image's entrypoint);
  ``env`` (expanded by :mod:`.podenv`, plus ``KUBECONFIG`` at :data:`~.podenv.POD_KUBECONFIG`) →
  ``--env``; ``workingDir`` → ``--workdir``;
- ``securityContext`` (the container's over the pod's): ``runAsUser``/``runAsGroup`` →
  ``--user``; ``fsGroup``/``supplementalGroups`` → ``--group-add``; ``readOnlyRootFilesystem`` →
  ``--read-only`` (without podman's tmpfs on /tmp and /run: a kubelet mounts none either);
  ``capabilities.drop``/``add`` → ``--cap-drop``/``--cap-add``; ``allowPrivilegeEscalation:
  false`` → ``no-new-privileges``; ``privileged``; ``seccompProfile: Unconfined``;
  ``runAsNonRoot`` with ``runAsUser: 0`` → the container does not start;
- ``resources.limits``: ``memory`` → ``--memory`` (and the same ``--memory-swap``: no swap, as
  on a node), ``cpu`` → ``--cpus``;
- volumes: every mount is a bind mount (``readOnly`` mounts, configMaps, secrets, the service
  account and the kubeconfig read-only); like a kubelet, ``emptyDir`` directories are made
  world-writable, and with ``fsGroup`` PVC directories are given to that group (setgid,
  group-writable) so that a non-root container can write them; the termination-message file is
  writable by any user; the service-account token directory and the pod's kubeconfig belong to
  the container's ``runAsUser`` (else are group-readable by ``fsGroup``), as a kubelet projects a
  token, so the worker can report its status;
- the network is the host's (``--network=host``), so the pod reaches the emulator on 127.0.0.1
  through its kubeconfig.

The container's stdout+stderr go to the pod's log file (``kubectl logs``). On exit the runtime
reads podman's state: the exit code, an OOM kill (podman's ``OOMKilled``, or, where podman misses
it as on cgroup v1, the kernel's ``oom-kill`` record for the container's cgroup in ``/dev/kmsg``,
as cAdvisor reads it; reported as exit code 137 with reason ``OOMKilled``, as a kubelet does) and
a failure to start (reason ``StartError``, exit code 128); then it removes the container. Stopping is ``podman stop -t GRACE`` (SIGTERM, then SIGKILL).

podman settings: ``$CONTAINERS_CONF`` if set, else the project's ``scripts/containers.conf`` when
this is a checkout (runc, explicit ulimits; see the README's Images section).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from .pods import _quantity
from .runtime import Launch

__all__ = ["PodmanContainer", "PodmanRuntime", "podman_available", "podman_run_args"]

log = logging.getLogger(__name__)

PROJECT_CONF = Path(__file__).resolve().parents[2] / "scripts" / "containers.conf"

#: label on every container the sandbox starts (``podman ps -a --filter label=...``)
LABEL = "io.npu-lora.sandbox"


def podman_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the ``podman`` client: this one, with the project's containers.conf."""
    env = dict(os.environ if base is None else base)
    if "CONTAINERS_CONF" not in env and PROJECT_CONF.exists():
        env["CONTAINERS_CONF"] = str(PROJECT_CONF)
    return env


def podman_available(podman: str = "podman") -> str | None:
    """None when podman can run containers here, else why not."""
    exe = shutil.which(podman)
    if exe is None:
        return f"{podman} not found on PATH"
    try:
        res = subprocess.run(
            [exe, "info", "--format", "{{.Host.OCIRuntime.Name}}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=podman_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"podman info failed: {exc}"
    if res.returncode != 0:
        return f"podman info failed: {(res.stderr or res.stdout).strip()[-300:]}"
    return None


class _NotStartable(OSError):
    """The container cannot be created from this spec (the pod fails to start)."""


def _merged_security(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    psc = dict((pod.get("spec") or {}).get("securityContext") or {})
    csc = dict(container.get("securityContext") or {})
    return {**psc, **csc}


def _cpus(value: Any) -> str:
    cpus = _quantity(value)
    return f"{cpus:g}"


def _read_only_mounts(pod: dict[str, Any], container: dict[str, Any]) -> set[str]:
    """Container paths that a kubelet mounts read-only."""
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    ro: set[str] = set()
    for vm in container.get("volumeMounts") or []:
        vol = volumes.get(vm.get("name"), {})
        if (
            vm.get("readOnly")
            or "configMap" in vol
            or "secret" in vol
            or "projected" in vol
            or (vol.get("persistentVolumeClaim") or {}).get("readOnly")
        ):
            ro.add(str(vm.get("mountPath", "")).rstrip("/") or "/")
    return ro


def podman_run_args(
    launch: Launch, name: str, *, network: str = "host", extra: list[str] | None = None
) -> list[str]:
    """``podman run`` arguments (without the ``podman``) for a prepared pod container.

    Raises :class:`OSError` for a spec no kubelet would start (``runAsNonRoot`` with uid 0)."""
    from .podenv import POD_KUBECONFIG, SA_PATH

    pod, container = launch.pod, launch.container
    meta = pod.get("metadata") or {}
    sc = _merged_security(pod, container)
    args = [
        "run",
        "--name",
        name,
        "--hostname",
        str(meta.get("name") or name)[:63],
        f"--network={network}",
        "--pull=never",
        "--label",
        f"{LABEL}=1",
        "--label",
        f"io.kubernetes.pod.namespace={meta.get('namespace', '')}",
        "--label",
        f"io.kubernetes.pod.name={meta.get('name', '')}",
        "--label",
        f"io.kubernetes.pod.uid={meta.get('uid', '')}",
    ]
    uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
    if sc.get("runAsNonRoot") and uid is not None and int(uid) == 0:
        raise _NotStartable(
            "container's runAsUser breaks non-root policy (runAsNonRoot: true, runAsUser: 0)"
        )
    if uid is not None:
        args += ["--user", f"{int(uid)}:{int(gid)}" if gid is not None else str(int(uid))]
    groups = [sc["fsGroup"]] if sc.get("fsGroup") is not None else []
    groups += list(sc.get("supplementalGroups") or [])
    for g in dict.fromkeys(int(g) for g in groups):
        args += ["--group-add", str(g)]
    if sc.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("privileged"):
        args.append("--privileged")
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    caps = sc.get("capabilities") or {}
    for cap in caps.get("drop") or []:
        args += ["--cap-drop", str(cap).lower()]
    for cap in caps.get("add") or []:
        args += ["--cap-add", str(cap).lower()]
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    limits = (container.get("resources") or {}).get("limits") or {}
    if limits.get("memory") is not None:
        mem = int(_quantity(limits["memory"]))
        args += ["--memory", str(mem), "--memory-swap", str(mem)]
    if limits.get("cpu") is not None:
        args += ["--cpus", _cpus(limits["cpu"])]
    ro = _read_only_mounts(pod, container) | {SA_PATH, POD_KUBECONFIG}
    for cpath, local in sorted(launch.mounts.items()):
        spec = f"{local}:{cpath}"
        if cpath in ro:
            spec += ":ro"
        args += ["--volume", spec]
    for key, value in launch.env.items():
        args += ["--env", f"{key}={value}"]
    if launch.cwd:
        args += ["--workdir", launch.cwd]
    args += list(extra or [])
    command = list(container.get("command") or [])
    argv = list(launch.argv)
    if command:
        args += ["--entrypoint", json.dumps(argv[: len(command)]), launch.image]
        args += argv[len(command) :]
    else:
        args += [launch.image, *argv]
    return args


def _prepare_volumes(launch: Launch, tm_paths: set[str]) -> None:
    """What a kubelet does to volume directories before the container starts (see the module
    docstring). Best effort: without the right (not root), it is skipped."""
    pod, container = launch.pod, launch.container
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    fs_group = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    for vm in container.get("volumeMounts") or []:
        cpath = str(vm.get("mountPath", "")).rstrip("/") or "/"
        local = launch.mounts.get(cpath)
        vol = volumes.get(vm.get("name"), {})
        if local is None or "hostPath" in vol or not local.exists():
            continue
        with contextlib.suppress(OSError):
            if "persistentVolumeClaim" in vol:
                if fs_group is not None:
                    _give_to_group(local, int(fs_group))
            elif "configMap" in vol or "secret" in vol:
                for p in [local, *local.rglob("*")]:
                    p.chmod(0o755 if p.is_dir() else 0o644)
            else:  # emptyDir (and the kinds the sandbox maps like it)
                local.chmod(0o1777 if cpath == "/tmp" else 0o777)
    for cpath in tm_paths:
        local = launch.mounts.get(cpath)
        if local is not None and local.is_file():
            with contextlib.suppress(OSError):
                local.chmod(0o666)
    _project_credentials(launch)


def _project_credentials(launch: Launch) -> None:
    """The pod's ServiceAccount directory (token, ca.crt, namespace) and its kubeconfig, made
    readable by the container's user as a kubelet projects a token: owned by ``runAsUser``
    (files 0600, directory 0700); without one, group-readable by ``fsGroup`` (0640/0750).
    The sandbox writes them 0600 as itself (root for podman): unreadable to uid 1000 otherwise,
    and the worker could not report. Without the right to chown (not root) nothing changes."""
    from .podenv import POD_KUBECONFIG, SA_PATH

    sc = _merged_security(launch.pod, launch.container)
    uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
    fs_group = ((launch.pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    if uid is None and fs_group is None:
        return
    for cpath in (SA_PATH, POD_KUBECONFIG):
        local = launch.mounts.get(cpath)
        if local is None or not local.exists():
            continue
        for p in [local, *(local.rglob("*") if local.is_dir() else [])]:
            if p.is_symlink():
                continue
            group = fs_group if fs_group is not None else gid
            with contextlib.suppress(OSError):
                os.chown(p, -1 if uid is None else int(uid), -1 if group is None else int(group))
                if fs_group is None:
                    p.chmod(0o700 if p.is_dir() else 0o600)
                else:
                    p.chmod(0o750 if p.is_dir() else 0o640)


def _give_to_group(root: Path, gid: int) -> None:
    """fsGroup: the volume's files belong to the group, directories group-writable and setgid."""
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        os.chown(p, -1, gid)
        mode = p.stat().st_mode
        if p.is_dir():
            p.chmod((mode | 0o2070) & 0o7777)
        else:
            p.chmod((mode | 0o060) & 0o7777)


def _kernel_oom_killed(container_id: str) -> bool:
    """Whether the kernel log records an OOM kill in the container's memory cgroup.

    podman 4.3 with runc on cgroup v1 leaves ``State.OOMKilled`` false after a memory-limit
    kill; like cAdvisor (the kubelet's OOM watcher) read the kernel's ``oom-kill:`` records
    (``oom_memcg=.../libpod-<id>``) from ``/dev/kmsg`` (root only; False without it)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not rec:
                return False
            if b"oom-kill:" in rec and container_id.encode() in rec:
                return True
    finally:
        os.close(fd)


class PodmanContainer:
    """A pod container started with ``podman run`` (attached: its output goes to the log)."""

    def __init__(self, runtime: PodmanRuntime, name: str, proc: asyncio.subprocess.Process):
        self.runtime = runtime
        self.name = name
        self.proc = proc
        self.id = f"podman://{name}"
        #: ``state.terminated.reason`` when not plain Completed/Error (``OOMKilled``, ``StartError``)
        self.reason: str | None = None
        self._code: int | None = None
        self.stopping = False

    @property
    def running(self) -> bool:
        return self._code is None and self.proc.returncode is None

    async def _podman(self, *args: str, timeout: float = 60) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            self.runtime.podman,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=self.runtime.env,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return 124, "timeout"
        return proc.returncode or 0, out.decode(errors="replace").strip()

    async def wait(self) -> int:
        if self._code is not None:
            return self._code
        client = await self.proc.wait()
        code = 128 - client if client < 0 else client
        rc, out = await self._podman(
            "inspect",
            "--format",
            "{{.State.ExitCode}} {{.State.OOMKilled}} {{.State.StartedAt.IsZero}} {{.Id}}",
            self.name,
        )
        if rc == 0 and out:
            exit_code, oom, never_started, full_id = [*out.split(), "", "", "", ""][:4]
            with contextlib.suppress(ValueError):
                code = int(exit_code)
            if code == 137 and oom != "true" and full_id and not self.stopping:
                oom = "true" if await asyncio.to_thread(_kernel_oom_killed, full_id) else oom
            if oom == "true":
                self.reason, code = "OOMKilled", 137
            elif never_started == "true":
                self.reason, code = "StartError", 128
        elif client in (125, 126, 127):  # podman could not create the container
            self.reason, code = "StartError", 128
        if not self.runtime.keep_containers:
            await self._podman("rm", "--force", "--time", "0", self.name)
        self._code = code
        return code

    async def stop(self, grace: float) -> None:
        if not self.running:
            return
        self.stopping = True
        await self._podman("stop", "--time", str(max(0, round(grace))), self.name)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), 10)

    def kill(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [self.runtime.podman, "rm", "--force", "--time", "0", self.name],
                capture_output=True,
                timeout=30,
                env=self.runtime.env,
            )


class PodmanRuntime:
    """Runs each pod's container from its image with podman (see the module docstring)."""

    host_paths = False

    def __init__(
        self,
        podman: str = "podman",
        *,
        network: str = "host",
        extra_args: list[str] | None = None,
        keep_containers: bool = False,
        pull_timeout: float = 120,
    ) -> None:
        self.podman = shutil.which(podman) or podman
        self.network = network
        self.extra_args = list(extra_args or [])
        self.keep_containers = keep_containers
        self.pull_timeout = pull_timeout
        self.env = podman_env()

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.podman, *args], capture_output=True, text=True, timeout=timeout, env=self.env
        )

    async def _ensure_image(self, image: str, policy: str) -> None:
        exists = await asyncio.to_thread(self._run, "image", "exists", image)
        if exists.returncode == 0 and policy != "Always":
            return
        if policy == "Never":
            raise _NotStartable(
                f'ErrImageNeverPull: container image "{image}" is not present with pull policy of Never'
            )
        try:
            res = await asyncio.to_thread(self._run, "pull", "-q", image, timeout=self.pull_timeout)
        except subprocess.TimeoutExpired as exc:
            raise _NotStartable(f'failed to pull image "{image}": timed out') from exc
        if res.returncode != 0 and exists.returncode != 0:
            why = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
            raise _NotStartable(f'failed to pull image "{image}": {why[0]}')

    async def start(self, launch: Launch) -> PodmanContainer:
        meta = launch.pod.get("metadata") or {}
        name = f"sbx-{meta.get('namespace', 'default')}-{meta.get('name', 'pod')}"[:50]
        name = f"{name}-{uuid.uuid4().hex[:6]}"
        policy = str(launch.container.get("imagePullPolicy") or "IfNotPresent")
        await self._ensure_image(launch.image, policy)
        tm = str(launch.container.get("terminationMessagePath") or "/dev/termination-log")
        _prepare_volumes(launch, {tm})
        args = podman_run_args(launch, name, network=self.network, extra=self.extra_args)
        log.debug("sandbox kubelet: podman %s", " ".join(args))
        with launch.log_path.open("ab") as logf:
            proc = await asyncio.create_subprocess_exec(
                self.podman,
                *args,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                # an OOM kill left an empty `oom` file in the caller's working directory (a
                # checkout's root; conmon's marker, it seems): run it in the pod's directory
                cwd=str(launch.log_path.parent),
            )
        return PodmanContainer(self, name, proc)


class OperatorContainer:
    """``npu-lora operator`` from the operator image, against the sandbox's API over loopback.

    Runs like the chart's Deployment would run it: uid 1000, read-only root with a ``/tmp``
    tmpfs, all capabilities dropped, no privilege escalation; host network, the admin
    kubeconfig mounted read-only; stdout+stderr to ``log_path``. :meth:`start` returns once
    kopf's liveness endpoint answers."""

    def __init__(
        self,
        image: str,
        kubeconfig: Path,
        log_path: Path,
        *,
        worker_image: str,
        worker_command: str | None = None,
        image_pull_policy: str = "Never",
        namespaces: list[str] | None = None,
        podman: str = "podman",
    ) -> None:
        from .podenv import POD_KUBECONFIG

        self.image = image
        self.source_kubeconfig = Path(kubeconfig)
        self.log_path = Path(log_path)
        self.podman = shutil.which(podman) or podman
        self.env = podman_env()
        self.name = f"sbx-operator-{uuid.uuid4().hex[:6]}"
        #: the kubeconfig as the container's user may read it (see :meth:`_project_kubeconfig`)
        self.kubeconfig = self.log_path.parent / f"{self.name}-secret" / "kubeconfig"
        self.port = _free_port()
        self.error: str | None = None
        args = [
            "run",
            "--name",
            self.name,
            "--network=host",
            "--pull=never",
            "--label",
            f"{LABEL}=1",
            "--user",
            "1000:1000",
            "--read-only",
            "--read-only-tmpfs=false",
            "--tmpfs",
            "/tmp",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            "--volume",
            f"{self.kubeconfig}:{POD_KUBECONFIG}:ro",
            "--env",
            "PYTHONUNBUFFERED=1",
            image,
            "operator",
            "--kubeconfig",
            POD_KUBECONFIG,
            "--worker-image",
            worker_image,
            "--image-pull-policy",
            image_pull_policy,
            "--liveness",
            f"http://127.0.0.1:{self.port}/healthz",
        ]
        if worker_command:
            args += ["--worker-command", worker_command]
        for ns in namespaces or []:
            args += ["--namespace", ns]
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def _project_kubeconfig(self) -> None:
        """The kubeconfig (mode 0600, the sandbox's user) copied into a private directory owned
        by the container's uid 1000, as a kubelet projects a Secret for the pod's user; without
        the right to chown (not root) the copy is made world-readable instead."""
        d = self.kubeconfig.parent
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(self.source_kubeconfig, self.kubeconfig)
        self.kubeconfig.chmod(0o600)
        try:
            for p in (d, self.kubeconfig):
                os.chown(p, 1000, 1000)
        except OSError:
            d.chmod(0o755)
            self.kubeconfig.chmod(0o644)

    def start(self, timeout: float = 120) -> OperatorContainer:
        import time
        import urllib.request

        self._project_kubeconfig()

        exists = subprocess.run(
            [self.podman, "image", "exists", self.image], env=self.env, capture_output=True
        )
        if exists.returncode != 0:
            raise RuntimeError(
                f"the operator image {self.image} is not present (build it: scripts/build-images.sh)"
            )
        with self.log_path.open("ab") as logf:
            self.proc = subprocess.Popen(
                [self.podman, *self.args],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{self.port}/healthz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.error = f"exited with {self.proc.returncode}"
                raise RuntimeError(
                    f"the operator container exited ({self.proc.returncode}):\n"
                    + self.log_path.read_text(errors="replace")[-3000:]
                )
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the operator container was not live within {timeout:g} s")

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [self.podman, "rm", "--force", "--time", str(int(timeout)), self.name],
                capture_output=True,
                timeout=timeout + 30,
                env=self.env,
            )
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        shutil.rmtree(self.kubeconfig.parent, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
