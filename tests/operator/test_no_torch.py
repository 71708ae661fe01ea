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
assert 'torch' not in [k for k, v in sys.modules.items() if v is not None]
print('ok', len(mods))
"""


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
