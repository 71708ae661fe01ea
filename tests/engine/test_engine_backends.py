"""Backend selection, call counting, and the furiosa import guard."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from npu_lora.backends import CpuBackend, get_backend


def test_cpu_and_auto():
    be = get_backend("cpu")
    assert be.name == "cpu" and be.device == torch.device("cpu")
    auto = get_backend("auto")
    if not torch.cuda.is_available():
        assert auto.name in ("cpu", "furiosa")
    with pytest.raises(ValueError):
        get_backend("tpu")


def test_call_counting():
    be = CpuBackend()
    assert be.call("attention", lambda a: a + 1, torch.ones(2), layer=0).tolist() == [2, 2]
    be.call("attention", torch.neg, torch.ones(1), layer=1)
    be.call("head", torch.neg, torch.ones(1))
    assert be.calls_by_name == {"attention": 2, "head": 1}
    assert be.calls_per_layer(2) == 1.0
    be.reset_counts()
    assert be.calls_per_layer(2) == 0.0


def test_package_imports_without_furiosa():
    """With furiosa made unimportable, the package (engine included) imports, auto falls back,
    and an explicit furiosa backend fails with a clear error."""
    code = (
        "import sys; sys.modules['furiosa'] = None; sys.modules['furiosa.torch'] = None\n"
        "import npu_lora.engine, npu_lora.backends as b\n"
        "assert not b.furiosa_available()\n"
        "assert b.get_backend('auto').name in ('cpu', 'cuda')\n"
        "try:\n    b.get_backend('furiosa')\nexcept RuntimeError as e:\n    print('ok', e)\n"
        "import npu_lora.backends.furiosa as f\n"
        "src = open(f.__file__.replace('furiosa.py', '__init__.py')).read()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok") and "furiosa-torch" in out.stdout


def test_only_backends_furiosa_imports_furiosa():
    from pathlib import Path

    import npu_lora

    root = Path(npu_lora.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "furiosa.py"
        and any(
            line.lstrip().startswith(("import furiosa", "from furiosa"))
            for line in p.read_text().splitlines()
        )
    ]
    assert offenders == [] or all(
        not o.startswith(("engine", "moe", "models", "device", "backends")) for o in offenders
    )
