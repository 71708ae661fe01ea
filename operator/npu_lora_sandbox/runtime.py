"""The pod runner's runtime seam: how a prepared container becomes a running process.

:class:`PodRuntime` is what :class:`~npu_lora_sandbox.pods.PodRunner` needs from a container
runtime: start a :class:`Launch` (argv, environment, working directory, log file, and the image and
volume mounts a real container runtime would use) and hand back a :class:`Container` to wait for
and stop. :class:`HostRuntime` (the default) runs the argv as a local subprocess in its own session
(the image is not used; mounts are honoured by rewriting paths, see :mod:`~npu_lora_sandbox.podenv`);
:class:`~npu_lora_sandbox.podman.PodmanRuntime` runs the pod's image as a real container (its
``host_paths`` is False: the pod environment then keeps container paths and the runtime mounts them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Container", "HostContainer", "HostRuntime", "Launch", "PodRuntime"]


@dataclass
class Launch:
    """A container, ready to start."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: Path  # stdout + stderr
    image: str = ""
    #: container path -> local path (the pod's volumes, service account, termination log)
    mounts: dict[str, Path] = field(default_factory=dict)
    #: the pod and its container as the API has them (securityContext, resources, volumes)
    pod: dict[str, Any] = field(default_factory=dict)
    container: dict[str, Any] = field(default_factory=dict)


class Container(Protocol):
    """A started container."""

    #: ``containerStatuses[].containerID``
    id: str

    @property
    def running(self) -> bool: ...

    async def wait(self) -> int:
        """The exit code once it exits (killed by signal N: 128 + N). A container may then
        carry a ``reason`` attribute (e.g. ``OOMKilled``) for ``state.terminated.reason``."""
        ...

    async def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once it is gone."""
        ...

    def kill(self) -> None:
        """Kill it at once, from any thread (the event loop may be gone)."""
        ...


class PodRuntime(Protocol):
    #: True: the container runs on this machine's filesystem, so the pod environment rewrites
    #: container paths to local ones (:class:`HostRuntime`); False: the runtime mounts
    #: :attr:`Launch.mounts` and the argv/env keep container paths.
    host_paths: bool

    async def start(self, launch: Launch) -> Container:
        """Start the container; raise :class:`OSError` when it cannot start."""
        ...


class HostContainer:
    """A local process group (the process leads its own session)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.id = f"sandbox://{proc.pid}"

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def wait(self) -> int:
        code = await self.proc.wait()
        return 128 - code if code < 0 else code

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def stop(self, grace: float) -> None:
        proc = self.proc
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
        except TimeoutError:
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
        # Reap any children left in the group.
        self._signal_group(signal.SIGKILL)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)


class HostRuntime:
    """Runs each container's argv as a local subprocess (this machine's Python, no image)."""

    host_paths = True

    async def start(self, launch: Launch) -> HostContainer:
        with launch.log_path.open("ab") as logf:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env=launch.env,
                cwd=launch.cwd,
                start_new_session=True,
            )
        return HostContainer(proc)
