"""npu-lora's Kubernetes operator (kopf): MoEFinetune → run-and-exit Job. Never imports torch.

Modules: :mod:`.crd` (CRD generator), :mod:`.builders` (pure Job/ConfigMap/RBAC builders),
:mod:`.status` (Job/Pod state → MoEFinetune status), :mod:`.handlers` (kopf handlers),
:mod:`.settings` (operator configuration). The API emulator + local kubelet for tests and the
laptop sandbox are the separate package :mod:`npu_lora_sandbox` (the ``sandbox`` extra).
"""

__all__: list[str] = []
