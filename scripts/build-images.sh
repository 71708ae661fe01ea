#!/usr/bin/env bash
# Build the operator and worker images with podman (Dockerfile targets `operator`, `worker`).
#
#   scripts/build-images.sh [--base auto|pull|local] [--only TARGET[,TARGET...]] [--no-install]
#
# TARGETs (Dockerfile targets): operator, worker (rngd: furiosa-torch, torch 2.10.0), worker-cpu
# (the cpu backend: CPU torch). Default: all three. Exits non-zero, with the failing step's log
# tail, when anything fails (.ci/run relies on it).
#
# - Installs podman, buildah, debootstrap and runc with apt-get when podman is missing (as root).
# - Uses the project's podman settings (scripts/containers.conf through CONTAINERS_CONF) and
#   leaves the machine's configuration alone.
# - Base image: the Dockerfile's PYTHON_IMAGE (python:3.11.x-slim-bookworm). --base auto (the
#   default) pulls it and, when no image registry can be reached, builds an equivalent local
#   base instead and says so: Debian bookworm from debootstrap (minbase) with Debian's python3.11
#   in a venv at /opt/python on PATH (python, pip). --base local always builds that one (and
#   skips the pull's wait: CI uses it, no image registry is reachable there).
# - worker-cpu: a local CPU torch wheel (torch==2.13.0+cpu, found by this machine's pip, e.g. its
#   find-links) is copied into .images/wheels/ and installed from there; without one the build
#   asks https://download.pytorch.org/whl/cpu.
# - Tags: localhost/npu-lora-operator:VERSION, localhost/npu-lora-worker:VERSION and
#   localhost/npu-lora-worker:VERSION-cpu (VERSION from pyproject.toml); prints each build's wall time and each image's size, and checks that the
#   operator image has neither torch nor npu_lora_sandbox.
# Environment: NPU_LORA_BASE_IMAGE (the local base's name), BUILD_LOG_DIR (build logs, default
# .images/), DEBIAN_MIRROR (debootstrap's mirror, default http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

BASE_MODE=auto
ONLY=""
INSTALL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE_MODE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "build-images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$BASE_MODE" in auto|pull|local) ;; *)
  echo "build-images.sh: --base must be auto, pull or local, not '$BASE_MODE'" >&2; exit 2 ;;
esac
TARGETS=()
IFS=, read -r -a TARGETS <<<"${ONLY:-operator,worker,worker-cpu}"
for target in "${TARGETS[@]}"; do
  case "$target" in operator|worker|worker-cpu) ;; *)
    echo "build-images.sh: --only takes operator, worker, worker-cpu (comma-separated), not '$target'" >&2; exit 2 ;;
  esac
done
wants() { local t; for t in "${TARGETS[@]}"; do [ "$t" = "$1" ] && return 0; done; return 1; }

export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO/scripts/containers.conf}"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
PYTHON_IMAGE=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
LOCAL_BASE="${NPU_LORA_BASE_IMAGE:-localhost/npu-lora-base:py3.11-bookworm}"
LOG_DIR="${BUILD_LOG_DIR:-$REPO/.images}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$LOG_DIR"

say() { printf 'build-images: %s\n' "$*"; }

# --- tools ------------------------------------------------------------------------------------
need=()
for tool in podman buildah debootstrap runc; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$INSTALL" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${need[*]} (apt-get)"
    t_install=$(date +%s)
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman buildah debootstrap runc >/dev/null
    say "installed in $(( $(date +%s) - t_install )) s"
  else
    echo "build-images.sh: missing ${need[*]}; install them (Debian: apt-get install podman buildah debootstrap runc) or run as root" >&2
    exit 1
  fi
fi
say "$(podman --version), runtime $(podman info --format '{{.Host.OCIRuntime.Name}}'), storage $(podman info --format '{{.Store.GraphDriverName}}')"

elapsed() { echo $(( $(date +%s) - $1 )); }

# --- base -------------------------------------------------------------------------------------
build_local_base() {
  local t0 dir
  t0=$(date +%s)
  dir=$(mktemp -d /var/tmp/npu-lora-base.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$dir'" RETURN
  say "debootstrap --variant=minbase bookworm ($MIRROR) -> $LOCAL_BASE"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$dir" "$MIRROR" >"$LOG_DIR/base.log" 2>&1 \
    || { tail -20 "$LOG_DIR/base.log" >&2; exit 1; }
  cat >"$dir/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  # A machine whose TLS goes through an intercepting proxy trusts extra CAs: the local base
  # trusts them too (else pip cannot reach PyPI from a build step), and pip uses the system store.
  local cas=()
  for ca in /usr/local/share/ca-certificates/*.crt; do [ -e "$ca" ] && cas+=("$ca"); done
  if [ ${#cas[@]} -gt 0 ]; then
    cp "${cas[@]}" "$dir/usr/local/share/ca-certificates/"
    chroot "$dir" update-ca-certificates >>"$LOG_DIR/base.log" 2>&1
    say "local base trusts this machine's extra CA certificates: ${cas[*]##*/}"
  fi
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$dir/etc/pip.conf"
  # Like python:3.11-slim: `python` and `pip` on PATH, installing into one Python that is not
  # Debian's externally-managed system one (PEP 668): a venv at /opt/python.
  chroot "$dir" /usr/bin/python3 -m venv /opt/python >>"$LOG_DIR/base.log" 2>&1
  chroot "$dir" apt-get clean
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/log/*.log
  tar -C "$dir" --numeric-owner -c . | podman import \
    --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$LOCAL_BASE" >/dev/null
  say "local base $LOCAL_BASE built in $(elapsed "$t0") s: Debian bookworm, $(podman run --rm "$LOCAL_BASE" python --version)"
}

BASE="$PYTHON_IMAGE"
if [ "$BASE_MODE" != local ]; then
  if podman image exists "$PYTHON_IMAGE" || timeout 120 podman pull -q "docker.io/library/$PYTHON_IMAGE" >"$LOG_DIR/pull.log" 2>&1; then
    say "base: $PYTHON_IMAGE (pulled)"
  elif [ "$BASE_MODE" = pull ]; then
    echo "build-images.sh: cannot pull $PYTHON_IMAGE: $(tail -1 "$LOG_DIR/pull.log")" >&2
    exit 1
  else
    say "cannot pull $PYTHON_IMAGE ($(tail -1 "$LOG_DIR/pull.log")): building an equivalent local base from Debian packages instead"
    BASE_MODE=local
  fi
fi
if [ "$BASE_MODE" = local ]; then
  BASE="$LOCAL_BASE"
  if podman image exists "$LOCAL_BASE"; then
    say "base: $LOCAL_BASE (local Debian bookworm base, already built)"
  else
    build_local_base
  fi
fi

# --- images -----------------------------------------------------------------------------------
# The sources' digest, as a label: the smoke tests skip (in CI: fail on) images built from other
# sources.
DIGEST=$(python3 scripts/source_digest.py .)
SUMMARY="$LOG_DIR/summary.txt"
: >"$SUMMARY"
T_ALL=$(date +%s)
build() {
  local target=$1 tag=$2 t0 secs size
  shift 2
  t0=$(date +%s)
  say "building $tag (target $target, base $BASE); log in $LOG_DIR/$target.log"
  podman build --target "$target" --build-arg "PYTHON_IMAGE=$BASE" --build-arg "VERSION=$VERSION" \
    "$@" --label "io.npu-lora.source-digest=$DIGEST" -t "$tag" -f Dockerfile . >"$LOG_DIR/$target.log" 2>&1 \
    || { tail -40 "$LOG_DIR/$target.log" >&2; echo "build-images.sh: building $target failed (log: $LOG_DIR/$target.log)" >&2; exit 1; }
  secs=$(elapsed "$t0")
  size=$(podman image inspect --format '{{.Size}}' "$tag")
  say "$tag: built in $secs s, $((size / 1000000)) MB"
  echo "$target image=$tag base=$BASE seconds=$secs bytes=$size" >>"$SUMMARY"
}

# worker-cpu's torch: a local CPU wheel when this machine's pip has one (the Dockerfile installs
# from .images/wheels/, which must exist, empty or not).
rm -rf .images/wheels
mkdir -p .images/wheels
touch -d 2000-01-01T00:00:00Z .images/wheels
CPU_ARGS=()
if wants worker-cpu; then
  TORCH_CPU_VERSION=$(sed -n 's/^ARG TORCH_CPU_VERSION=//p' Dockerfile | head -1)
  if timeout 300 python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 -d .images/wheels "torch==${TORCH_CPU_VERSION}+cpu" \
      >"$LOG_DIR/cpu-wheel.log" 2>&1 && ls .images/wheels/torch-*.whl >/dev/null 2>&1; then
    say "worker-cpu: torch from the local wheel $(basename .images/wheels/torch-*.whl)"
    CPU_ARGS=(--build-arg "TORCH_CPU_INDEX=")
    # buildah's layer cache keys the steps after a COPY on the copied files' times too: fixed
    # times keep the torch and dependency layers cached from one run of this script to the next
    touch -d 2000-01-01T00:00:00Z .images/wheels/* .images/wheels
  else
    rm -f .images/wheels/*
    say "worker-cpu: no local torch ${TORCH_CPU_VERSION}+cpu wheel ($(tail -1 "$LOG_DIR/cpu-wheel.log")): the build asks download.pytorch.org/whl/cpu"
  fi
fi

if wants operator; then
  build operator "localhost/npu-lora-operator:$VERSION"
  # The operator image ships neither torch nor the sandbox (the emulator + local kubelet).
  podman run --rm --entrypoint python "localhost/npu-lora-operator:$VERSION" -c '
import importlib.util as u
bad = [m for m in ("torch", "npu_lora_sandbox") if u.find_spec(m) is not None]
assert not bad, f"the operator image contains {bad}"
import npu_lora_operator, kopf, kubernetes
print("operator image: no torch, no npu_lora_sandbox; kopf", kopf.__version__ if hasattr(kopf, "__version__") else "ok")
'
fi
if wants worker-cpu; then
  build worker-cpu "localhost/npu-lora-worker:$VERSION-cpu" "${CPU_ARGS[@]}"
  podman run --rm --entrypoint npu-lora "localhost/npu-lora-worker:$VERSION-cpu" kernels status \
    | grep -q '^state:  built' || { echo "build-images.sh: worker-cpu has no built kernel" >&2; exit 1; }
  podman run --rm --entrypoint python "localhost/npu-lora-worker:$VERSION-cpu" -c '
import importlib.util as u, torch, npu_lora
assert u.find_spec("furiosa") is None and torch.version.cuda is None
print("worker-cpu image: torch", torch.__version__, "(CPU build), no furiosa-torch")
'
fi
if wants worker; then
  build worker "localhost/npu-lora-worker:$VERSION"
  podman run --rm --entrypoint python "localhost/npu-lora-worker:$VERSION" -c '
import torch, furiosa.torch, npu_lora
print("worker image: torch", torch.__version__, "furiosa.torch", getattr(furiosa.torch, "__version__", "ok"))
'
fi
rm -rf .images/wheels
mkdir -p .images/wheels
touch -d 2000-01-01T00:00:00Z .images/wheels
say "done in $(elapsed "$T_ALL") s (images only); summary in $SUMMARY"
cat "$SUMMARY"
