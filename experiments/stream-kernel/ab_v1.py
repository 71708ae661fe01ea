"""The v1 streaming kernel (issue 10's first version, commit 57fcbba) beside the current one, in
one process: builds v1 from git under another extension name and registers it as the experts
implementation ``npu_lora_stream_v1`` (``--v1-openmp``: built with -fopenmp, so that its
``at::parallel_for`` really runs on several threads; as shipped it was built without and ran on
one), then runs ``npu_lora.bench.kernels`` with it in the rotation.

    python experiments/stream-kernel/ab_v1.py --v1-openmp -- --tokens 128 512 \\
        --dtypes float32 bfloat16 --impls copy grouped_mm npu_lora_stream_v1 npu_lora_stream \\
        --rounds 4 --threads 2 --out experiments/raw/2026-12-02-stream-v2/vs-v1
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import types
from pathlib import Path

V1_COMMIT = "57fcbba"
ROOT = Path(__file__).resolve().parents[2]
KDIR = "worker/npu_lora/moe/kernels"
FILES = ("stream.cpp", "stream_isa.h", "stream_avx2.cpp", "stream_avx512.cpp", "stream_base.cpp")


def _git_show(path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{V1_COMMIT}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def register_v1(openmp: bool) -> str:
    from npu_lora.moe import kernels
    from torch.utils.cpp_extension import load as cpp_load
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    src = Path(tempfile.mkdtemp(prefix="npu-lora-v1-"))
    for f in FILES:
        (src / f).write_text(_git_show(f"{KDIR}/{f}"))
    flags = ["-O3", "-fno-math-errno"] + (["-fopenmp"] if openmp else [])
    name = "npu_lora_stream_v1" + ("_omp" if openmp else "")
    build = kernels.cache_dir() / name
    build.mkdir(parents=True, exist_ok=True)
    mod = cpp_load(
        name=name,
        sources=[str(src / f) for f in FILES if f.endswith(".cpp")],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"] if openmp else [],
        build_directory=str(build),
    )
    isa = kernels.isa()
    shim = types.SimpleNamespace(
        load=lambda: mod, isa=lambda: isa, ISA_CODES=kernels.ISA_CODES, cpu_isas=kernels.cpu_isas
    )
    code = _git_show("worker/npu_lora/moe/stream.py").replace(
        "from npu_lora.moe import kernels\n", ""
    )
    v1 = types.ModuleType("npu_lora_stream_v1_py")
    v1.kernels = shim
    exec(compile(code, "stream_v1.py", "exec"), v1.__dict__)
    ALL_EXPERTS_FUNCTIONS.register("npu_lora_stream_v1", v1.npu_lora_stream_experts_forward)
    return name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--v1-openmp", action="store_true")
    a, rest = p.parse_known_args()
    rest = [x for x in rest if x != "--"]
    name = register_v1(a.v1_openmp)
    print(f"v1 ({V1_COMMIT}) built as {name}", flush=True)
    from npu_lora.bench import kernels as kb

    return kb.main(rest)


if __name__ == "__main__":
    sys.exit(main())
