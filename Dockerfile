# syntax=docker/dockerfile:1
# npu-lora images. Two targets from one file:
#
#   docker build --target operator   -t npu-lora-operator:0.1.0 .    # kopf operator, no torch
#   docker build --target worker     -t npu-lora-worker:0.1.0 .      # engine + furiosa-torch (rngd)
#   docker build --target worker-cpu -t npu-lora-worker:0.1.0-cpu .  # engine, CPU torch (cpu backend)
#
# The worker targets install torch and the project's dependencies from pyproject.toml alone
# (scripts/image_requirements.py) before any source is copied, so a source change reuses those
# layers; a builder stage with g++ and the Python headers compiles the host experts kernel
# (`npu-lora kernels build`) and the final stage copies only the built kernel (no compiler).
# worker-cpu installs torch==TORCH_CPU_VERSION+cpu from .images/wheels/ (scripts/build-images.sh
# puts a local wheel there; the directory must exist, empty is fine) or TORCH_CPU_INDEX.
#
# Both run as the non-root user `npu-lora` (uid/gid 1000, matching the chart's and the Job
# builder's securityContext) and start with `npu-lora` (ENTRYPOINT); the command is the
# subcommand (`operator ...`, `run CONFIG ...`).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---------------------------------------------------------------------------------------------
# base: Python, the non-root user, pip settings shared by every stage.
FROM ${PYTHON_IMAGE} AS base

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="npu-lora" \
      org.opencontainers.image.description="LoRA fine-tuning of MoE LLMs on FuriosaAI RNGD NPUs, as a Kubernetes batch operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

RUN groupadd --gid 1000 npu-lora \
    && useradd --uid 1000 --gid 1000 --home-dir /home/npu-lora --create-home \
       --shell /usr/sbin/nologin npu-lora

# ---------------------------------------------------------------------------------------------
# wheel: build the project's wheel once (setuptools runs here, not in the final images), and
# the operator's copy of it without npu_lora_sandbox (the API emulator + local kubelet of
# `npu-lora sandbox`, the `sandbox` extra), so the operator image never holds sandbox code.
FROM base AS wheel

WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker/ worker/
COPY operator/ operator/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && pip install --no-cache-dir wheel==0.45.1 \
    && python -m wheel unpack --dest /tmp/unpacked "$(ls /wheels/npu_lora-*.whl)" \
    && rm -r /tmp/unpacked/npu_lora-*/npu_lora_sandbox \
    && mkdir /wheels/operator \
    && python -m wheel pack --dest-dir /wheels/operator /tmp/unpacked/npu_lora-* \
    && rm -r /tmp/unpacked \
    && ls /wheels/npu_lora-*.whl /wheels/operator/npu_lora-*.whl

# ---------------------------------------------------------------------------------------------
# operator: `npu-lora operator` (kopf + kubernetes client; the `operator` extra, no torch).
# It installs the wheel without npu_lora_sandbox (see the wheel stage) and checks that neither
# the sandbox nor torch can be found (find_spec: without importing). The wheels are copied, not
# bind-mounted: buildah 1.28 (Debian 12's podman) loses a RUN --mount from= a cached stage.
FROM base AS operator

LABEL org.opencontainers.image.description="npu-lora operator (kopf): MoEFinetune -> Job"

COPY --from=wheel /wheels/operator/ /tmp/wheels/
RUN pip install --no-cache-dir "$(ls /tmp/wheels/npu_lora-*.whl)[operator]" \
    && rm -r /tmp/wheels \
    && python -c "import npu_lora_operator, kopf, kubernetes" \
    && python -c "import importlib.util as u; assert u.find_spec('npu_lora_sandbox') is None, 'sandbox left'" \
    && python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch installed'"

USER 1000:1000
WORKDIR /home/npu-lora
ENTRYPOINT ["npu-lora"]
CMD ["operator", "--help"]

# ---------------------------------------------------------------------------------------------
# worker-deps: what the rngd worker runs on, from pyproject.toml only (cached across source edits).
# furiosa-torch's compiler shells out to an aarch64 cross-compiler (it builds code for the
# card's host-side cores); without these two packages every op fails to compile. Versions are
# those of Debian 12 (bookworm), which the base image tag above pins.
# furiosa-torch 2026.4.0 requires exactly torch 2.10.0 (its native module breaks with other
# versions). Install that torch first and pin it with a constraints file so that resolving the
# rest can never move it. PyPI's torch 2.10.0 wheel for Linux x86-64 is the CUDA build (~4 GB of
# nvidia-* wheels; docs/images.md); the cpu backend has its own, smaller image (worker-cpu).
FROM base AS worker-deps

RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       gcc-aarch64-linux-gnu=4:12.2.0-3 \
       libc6-dev-arm64-cross=2.36-8cross1 \
    && rm -rf /var/lib/apt/lists/*

ARG TORCH_VERSION=2.10.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN echo "torch==${TORCH_VERSION}" > /etc/pip-constraints.txt \
    && pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

ENV PIP_CONSTRAINT=/etc/pip-constraints.txt
COPY pyproject.toml scripts/image_requirements.py /tmp/deps/
RUN python /tmp/deps/image_requirements.py /tmp/deps/pyproject.toml rngd > /tmp/deps/rngd.txt \
    && pip install --no-cache-dir -r /tmp/deps/rngd.txt \
    && rm -r /tmp/deps

# ---------------------------------------------------------------------------------------------
# worker-kernel: builds the host experts kernel with g++ and the Python headers (the python:slim
# image has them; the local Debian base's Python does not: libpython3.11-dev, unpinned because
# Debian's security updates replace the version the base's libpython3.11 must match). Only its
# kernel cache is copied on.
FROM worker-deps AS worker-kernel

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++=4:12.2.0-3 \
    && if ! python -c "import os, sysconfig; assert os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"; then \
         apt-get install -y --no-install-recommends libpython3.11-dev; fi \
    && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels/npu_lora-*.whl /tmp/wheels/
ENV NPU_LORA_KERNEL_CACHE=/opt/npu-lora/cache
RUN pip install --no-cache-dir --no-deps "$(ls /tmp/wheels/npu_lora-*.whl)" \
    && TORCH_DEVICE_BACKEND_AUTOLOAD=0 npu-lora kernels build

# ---------------------------------------------------------------------------------------------
# worker: the training engine with furiosa-torch (RNGD), i.e. the `rngd` extra. No compiler:
# the kernel built above is found under the same cache key less the compiler (docs/kernels.md).
FROM worker-deps AS worker

LABEL org.opencontainers.image.description="npu-lora worker: hybrid device/host MoE LoRA training (furiosa-torch)"

ARG TORCH_VERSION=2.10.0
COPY --from=wheel /wheels/npu_lora-*.whl /tmp/wheels/
RUN pip install --no-cache-dir --no-deps "$(ls /tmp/wheels/npu_lora-*.whl)[rngd]" \
    && rm -r /tmp/wheels \
    && pip check \
    && TORCH_DEVICE_BACKEND_AUTOLOAD=0 python -c \
       "import torch, npu_lora; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__"

# The host experts kernel, built once in worker-kernel under this image's cache key (torch,
# Python, sources) into a world-readable cache: pods load it without a compiler. `kernels build`
# here loads it (and fails the image build if it cannot: never a silent torch fallback per pod).
ENV NPU_LORA_KERNEL_CACHE=/opt/npu-lora/cache
COPY --from=worker-kernel /opt/npu-lora/cache /opt/npu-lora/cache
RUN TORCH_DEVICE_BACKEND_AUTOLOAD=0 npu-lora kernels build \
    && TORCH_DEVICE_BACKEND_AUTOLOAD=0 npu-lora kernels status \
    && chmod -R a+rX /opt/npu-lora

# Writable defaults for a read-only root filesystem: furiosa's compile cache lives under
# $XDG_CACHE_HOME/furiosa. In a cluster the operator's Job sets XDG_CACHE_HOME to where it mounts
# the MoEFinetune's compileCache volume.
ENV HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache

USER 1000:1000
WORKDIR /home/npu-lora
ENTRYPOINT ["npu-lora"]
CMD ["--help"]

# ---------------------------------------------------------------------------------------------
# worker-cpu-deps / worker-cpu: the same engine for the `cpu` backend (host-only training, no
# NPU) on the CPU build of torch: no furiosa-torch, no CUDA libraries (docs/images.md: sizes).
FROM base AS worker-cpu-deps

ARG TORCH_CPU_VERSION=2.13.0
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
COPY .images/wheels/ /tmp/local-wheels/
RUN echo "torch==${TORCH_CPU_VERSION}+cpu" > /etc/pip-constraints.txt \
    && pip install --no-cache-dir --find-links /tmp/local-wheels \
       ${TORCH_CPU_INDEX:+--extra-index-url "$TORCH_CPU_INDEX"} -r /etc/pip-constraints.txt \
    && rm -r /tmp/local-wheels

ENV PIP_CONSTRAINT=/etc/pip-constraints.txt
COPY pyproject.toml scripts/image_requirements.py /tmp/deps/
RUN python /tmp/deps/image_requirements.py /tmp/deps/pyproject.toml worker > /tmp/deps/worker.txt \
    && pip install --no-cache-dir -r /tmp/deps/worker.txt \
    && rm -r /tmp/deps

FROM worker-cpu-deps AS worker-cpu-kernel

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++=4:12.2.0-3 \
    && if ! python -c "import os, sysconfig; assert os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"; then \
         apt-get install -y --no-install-recommends libpython3.11-dev; fi \
    && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels/npu_lora-*.whl /tmp/wheels/
ENV NPU_LORA_KERNEL_CACHE=/opt/npu-lora/cache
RUN pip install --no-cache-dir --no-deps "$(ls /tmp/wheels/npu_lora-*.whl)" \
    && npu-lora kernels build

FROM worker-cpu-deps AS worker-cpu

LABEL org.opencontainers.image.description="npu-lora worker for the cpu backend (CPU torch, no furiosa-torch)"

COPY --from=wheel /wheels/npu_lora-*.whl /tmp/wheels/
RUN pip install --no-cache-dir --no-deps "$(ls /tmp/wheels/npu_lora-*.whl)[worker]" \
    && rm -r /tmp/wheels \
    && pip check \
    && python -c "import torch, npu_lora; assert not torch.cuda.is_available() and torch.version.cuda is None"

ENV NPU_LORA_KERNEL_CACHE=/opt/npu-lora/cache
COPY --from=worker-cpu-kernel /opt/npu-lora/cache /opt/npu-lora/cache
RUN npu-lora kernels build \
    && npu-lora kernels status \
    && chmod -R a+rX /opt/npu-lora

ENV HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache

USER 1000:1000
WORKDIR /home/npu-lora
ENTRYPOINT ["npu-lora"]
CMD ["--help"]
