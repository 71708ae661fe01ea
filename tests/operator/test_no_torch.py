"""The operator side never imports torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import npu_lora_operator
import npu_lora_sandbox

CODE = """
import importlib, sys
sys.modules['torch'] = None  # any `import torch` raises ImportError
mods = {mods!r}
for m in mods:
    importlib.import_module(m)
import npu_lora.cli
for name in ('crd', 'operator', 'sandbox'):
    mod = npu_lora.cli._load(npu_lora.cli.SUBCOMMANDS[name][0])
    import argparse
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
# the admission policy's memory estimate (the worker's pre-flight estimate) is torch-free too
from npu_lora_operator import builders, settings
body = {{"metadata": {{"name": "r", "namespace": "n", "uid": "u"}},
        "spec": {{"model": {{"preset": "tiny-qwen3-moe"}}, "data": {{"path": "example:x"}}}}}}
job = builders.build_job(builders.Run.from_body(body), settings.OperatorConfig())
assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
body["spec"]["model"] = {{"preset": "qwen3-30b-a3b"}}
job = builders.build_job(builders.Run.from_body(body), settings.OperatorConfig())
qwen = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
assert 'torch' not in [k for k, v in sys.modules.items() if v is not None]
assert 'npu_lora.moe' not in sys.modules  # the host kernel is never built or loaded here
print('ok', len(mods), qwen)
"""

QWEN_BODY = {
    "metadata": {"name": "r", "namespace": "n", "uid": "u"},
    "spec": {"model": {"preset": "qwen3-30b-a3b"}, "data": {"path": "example:x"}},
}


def test_operator_imports_without_torch() -> None:
    mods = sorted(
        m.name
        for pkg in (npu_lora_operator, npu_lora_sandbox)
        for m in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}.")
    )
    mods += [
        "npu_lora_operator",
        "npu_lora_sandbox",
        "npu_lora.report.status",
        "npu_lora.api",
        "npu_lora.api.load",
    ]
    assert "npu_lora_operator.handlers" in mods and "npu_lora_sandbox.emulator" in mods
    out = subprocess.run(
        [sys.executable, "-c", CODE.format(mods=mods)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
    _, _, qwen_without_torch = out.stdout.split()
    assert qwen_without_torch == _qwen_memory_with_torch()


def _qwen_memory_with_torch() -> str:
    """The Qwen3-30B-A3B preset's ``auto`` limit where torch imports, and the worker's own
    estimate of the same run (float32, ``auto``'s widest choice) rounded the same way."""
    import torch  # noqa: F401  (importable here: nothing may depend on it)
    from npu_lora.api.memory import recommended_limit
    from npu_lora.train.preflight import estimate_memory, model_widths
    from npu_lora_operator import builders, policy, settings

    run = builders.Run.from_body(QWEN_BODY)
    job = builders.build_job(run, settings.OperatorConfig())
    limit = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    est = estimate_memory(run.spec, model_widths(run.spec), host_dtype="float32")
    assert est is not None
    assert limit == f"{recommended_limit(est) >> 30}Gi" != policy.PodPolicy().memory_when_unknown
    return limit


def test_qwen3_30b_auto_memory_is_the_worker_estimate() -> None:
    """48 layers × 128 experts × 3 × 768 × 2048 (+ router) in float32 is 108 GiB of experts;
    with activations, the (unmeasured) runtime allowance of 2 GiB and the load's transient copy
    of one layer's gate_up_proj, × 1.25: 141 GiB, not the 16Gi of an unknown model."""
    assert _qwen_memory_with_torch() == "141Gi"
