"""npu-lora's Kubernetes operator (kopf): MoEFinetune → run-and-exit Job. Never imports torch.

Modules: :mod:`.crd` (CRD generator), :mod:`.builders` (pure Job/ConfigMap/RBAC builders),
:mod:`.status` (Job/Pod state → MoEFinetune status), :mod:`.handlers` (kopf handlers),
:mod:`.settings` (operator configuration), :mod:`.sandbox` (API emulator + local kubelet).
"""

__all__: list[str] = []
