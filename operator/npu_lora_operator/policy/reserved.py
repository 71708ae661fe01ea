"""Environment names a podTemplate may not set: what the worker, Python, torch, furiosa, the
loader, the shell, the host-kernel build and the worker's HTTPS client read (compared in upper
case, so ``path`` is ``PATH``)."""

from __future__ import annotations

#: environment the worker, Python, torch, furiosa and the loader own: names (exact) and
#: prefixes a podTemplate may not set (compared in upper case)
RESERVED_ENV_NAMES = frozenset(
    {
        "HOME",
        "PATH",
        "TMPDIR",
        "TMP",
        "TEMP",
        "USER",
        "SHELL",
        "KUBECONFIG",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "JOB_COMPLETION_INDEX",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "BASH_ENV",
        "ENV",
        # shells and glibc: code, shared objects or name resolution from a path or a string
        "PS4",
        "PROMPT_COMMAND",
        "SHELLOPTS",
        "BASHOPTS",
        "IFS",
        "CDPATH",
        "GLOBIGNORE",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "RES_OPTIONS",
        "LOCALDOMAIN",
        # the host-kernel build: compiler, flags and header/library search paths
        "CC",
        "CXX",
        "CPP",
        "LD",
        "AR",
        "CFLAGS",
        "CXXFLAGS",
        "CPPFLAGS",
        "LDFLAGS",
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "LIBRARY_PATH",
        "MAX_JOBS",
        # where the worker's HTTPS goes (the API server, with its token) and its TLS keys
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "FTP_PROXY",
        "SSLKEYLOGFILE",
    }
)
RESERVED_ENV_PREFIXES = (
    "PYTHON",
    "LD_",
    "XDG_",
    "NPU_LORA_",
    "TORCH",
    "PYTORCH_",
    "FURIOSA",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "MALLOC_",
    "GLIBC_",
    "CUDA_",
    "NCCL_",
    "GLOO_",
    "MASTER_",
    "TORCHELASTIC_",
    "SSL_",
    "KUBERNETES_",
    "TRITON_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "BASH_",
    "CCACHE_",
    "NVIDIA_",
    "ONEDNN_",
    "DNNL_",
)


def reserved_env(name: str) -> bool:
    """``name`` is owned by the worker or its runtime (:data:`RESERVED_ENV_NAMES`/``PREFIXES``)."""
    up = name.upper()
    return up in RESERVED_ENV_NAMES or up.startswith(RESERVED_ENV_PREFIXES)


def prefix_can_form_reserved(prefix: str) -> bool:
    """Some key appended to ``prefix`` could make a reserved name."""
    up = prefix.upper()
    if up.startswith(RESERVED_ENV_PREFIXES):
        return True
    return any(n.startswith(up) for n in RESERVED_ENV_NAMES) or any(
        r.startswith(up) for r in RESERVED_ENV_PREFIXES
    )
