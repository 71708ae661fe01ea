"""``moe.hostDtype``: resolve ``auto`` from the capability probe; flag explicit slow choices.

Rules (``caps`` = :func:`npu_lora.machine.cpu_capabilities`):

- ``npu_lora_stream`` with its C++ extension: bf16 weights are multiplied natively where the CPU
  has AVX512-BF16 (``vdpbf16ps``) and widened to fp32 in registers on every other x86-64 CPU
  (AVX2, AVX-512, baseline), accumulated in fp32 either way, so ``auto`` picks
  ``bfloat16`` (half the bytes to stream; Qwen3 checkpoints are bf16, so the weights lose
  nothing). On a CPU without native bf16 the block's router and activations stay fp32
  (``compute_dtype``; the kernel rounds the activations to bf16 itself), so no torch bf16 matmul
  runs there. Measured on an AVX2-only EPYC (experiments/2026-12-02-stream-kernel-v2.md): bf16
  0.69x the fp32 time per layer at T=128, 0.88-0.92x at T=512 (compute-bound); on a Zen 4 with
  AVX512-BF16 (experiments/2026-12-02-zen4-native-bf16.md) see the figures there. Without the extension (its
  torch fallback widens each expert with a copy) ``auto`` picks ``float32``.
- kernels that compute in torch (``grouped_mm``, ``eager``, ``npu_lora_sorted*``): ``bfloat16``
  only where the CPU has native bf16 (AVX512-BF16 or AMX-BF16), else ``float32``. An explicit
  ``bfloat16`` with such a kernel on a CPU without native bf16 is *known slow* (issue 10: 35-75x
  fp32 on an AVX2-only EPYC): the choice stands, with a warning in the log and in
  ``status.host.warning``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

STREAM = "npu_lora_stream"


#: 8-bit host dtypes (frozen experts in 8 bits + scales; npu_lora.models.quant)
Q8_DTYPES = ("int8", "float8_e4m3fn")


@dataclass(frozen=True)
class HostChoice:
    """The resolved host dtype, why, and the warning for a known-slow explicit choice."""

    requested: str
    dtype: str
    kernel: str
    kernel_backend: str | None  # npu_lora_stream: "cpp:<isa>" or "torch"
    reason: str
    warning: str | None = None
    #: dtype of the block's activations and router on the host (the experts' weights stay in
    #: ``dtype``): float32 where ``dtype`` is bfloat16 and the CPU has no native bf16
    compute_dtype: str | None = None

    #: 8-bit host dtypes: the experts' layout and its source (set once the model is loaded)
    layout: str | None = None

    def __post_init__(self) -> None:
        if self.compute_dtype is None:
            self.compute_dtype = self.dtype

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def status(self) -> dict[str, Any]:
        """``status.host`` (worker-owned)."""
        out = {"dtype": self.dtype, "kernel": self.kernel, "reason": self.reason}
        if self.kernel_backend:
            out["kernelBackend"] = self.kernel_backend
        if self.warning:
            out["warning"] = self.warning
        if self.layout:
            out["layout"] = self.layout
        return out


def resolve_host_dtype(
    requested: str, kernel: str, *, caps: dict[str, Any] | None = None, log_it: bool = True
) -> HostChoice:
    """``requested``: ``auto``, ``float32`` or ``bfloat16``; ``kernel``: ``moe.expertsKernel``."""
    from npu_lora.machine import cpu_capabilities

    caps = caps if caps is not None else cpu_capabilities()
    native = bool(caps.get("native_bf16"))
    backend = None
    if kernel == STREAM:
        from npu_lora.moe import kernels, stream

        backend = stream.backend()
        bf16_ok = backend.startswith("cpp:")
        if not bf16_ok:
            why = f"{kernel} runs its torch fallback (extension unavailable)"
        elif kernels.native_how(backend.removeprefix("cpp:")):
            how = kernels.native_how(backend.removeprefix("cpp:"))
            why = f"{kernel} ({backend}) computes bf16 natively ({how})"
        else:
            why = f"{kernel} ({backend}) widens bf16 operands to fp32 in registers"
    else:
        bf16_ok = native
        why = f"{kernel} computes in torch; CPU native bf16: {native} (isa {caps.get('isa')})"
    warning = None
    if requested in Q8_DTYPES:
        if kernel != STREAM:
            raise ValueError(f"moe.hostDtype {requested} needs moe.expertsKernel {STREAM}")
        # the experts in 8 bits; the router and the activations keep the dtype bf16 would get
        compute = "bfloat16" if (bf16_ok and native) else "float32"
        how = "dequantised in registers" if bf16_ok else "dequantised per expert (torch fallback)"
        reason = (
            f"explicit: 8-bit frozen experts, {kernel} ({backend}) {how}; router and "
            f"activations in {compute}"
        )
        choice = HostChoice(requested, requested, kernel, backend, reason, None, compute)
        if log_it:
            log.info("host dtype %s (%s)", requested, reason)
        return choice
    if requested == "auto":
        dtype = "bfloat16" if bf16_ok else "float32"
        reason = f"auto: {why}"
    else:
        dtype = requested
        reason = f"explicit: {why}"
        if requested == "bfloat16" and kernel != STREAM and not native:
            warning = (
                f"moe.hostDtype bfloat16 with moe.expertsKernel {kernel} on a CPU without native "
                f"bf16 (no avx512_bf16/amx_bf16): torch's bf16 matmuls are known to run tens of "
                f"times slower than fp32 here; use hostDtype auto/float32 or expertsKernel "
                f"{STREAM}"
            )
    compute = dtype
    if dtype == "bfloat16" and kernel == STREAM and bf16_ok and not native:
        # the kernel takes fp32 activations with bf16 weights (it rounds them to bf16 itself);
        # the router's small matmul and the block's glue stay out of torch's slow bf16 path
        # (measured: a [128, 2048] x [2048, 128] router linear, forward + backward, 206 ms in
        # bf16 against 9.6 ms in fp32 on an AVX2 EPYC; experiments/2026-12-02-stream-kernel-v2.md)
        compute = "float32"
        reason += "; router and activations in float32 (no native bf16 on this CPU)"
    choice = HostChoice(requested, dtype, kernel, backend, reason, warning, compute)
    if log_it:
        if warning:
            log.warning(warning)
        log.info("host dtype %s (%s)", dtype, reason)
    return choice
