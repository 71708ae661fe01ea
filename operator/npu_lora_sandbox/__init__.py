"""The local sandbox: an in-process Kubernetes API emulator and a local kubelet/Job controller.

- :class:`~.emulator.ApiEmulator` — a kmock-based API server on a free localhost port that the
  real ``kubectl``, the ``kubernetes`` client and kopf work against (see :mod:`.emulator`).
- :class:`~.kubelet.LocalKubelet` — runs the emulator's Jobs/Pods as local subprocesses and writes
  their Job/Pod status (see :mod:`.kubelet`).

Helpers: :mod:`.schema` (structural schema + CEL), :mod:`.table` (Table output),
:mod:`.jsonpath`, :mod:`.patching`. Nothing here imports torch.
"""

from .emulator import ApiEmulator, ApiError, ResourceType
from .kubelet import LocalKubelet

__all__ = ["ApiEmulator", "ApiError", "LocalKubelet", "ResourceType"]
