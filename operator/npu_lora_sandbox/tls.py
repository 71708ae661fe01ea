"""The API emulator's TLS: a self-signed serving certificate, made once per process.

kubectl (client-go's clientcmd) sends a kubeconfig's credentials only over TLS, so the emulator
serves HTTPS for bearer-token authentication to work with the real kubectl. The certificate (an
EC P-256 key, valid for two days, SANs ``127.0.0.1``, ``localhost`` and the serving host) is
made with the ``openssl`` command (no Python dependency) and doubles as its own CA: kubeconfigs
carry it as ``certificate-authority-data``.
"""

from __future__ import annotations

import functools
import ipaddress
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServingCert:
    cert_pem: bytes
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting this certificate (e.g. for ``urllib``)."""
        return ssl.create_default_context(cadata=self.cert_pem.decode())


def _san(host: str) -> str:
    names = {"IP:127.0.0.1", "DNS:localhost"}
    try:
        ipaddress.ip_address(host)
        if host not in ("0.0.0.0", "::"):
            names.add(f"IP:{host}")
    except ValueError:
        names.add(f"DNS:{host}")
    return ",".join(sorted(names))


@functools.cache
def serving_cert(host: str = "127.0.0.1") -> ServingCert:
    """The process's certificate for ``host`` (made on first use)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "the sandbox API serves HTTPS (kubectl sends credentials only over TLS) and needs the "
            "`openssl` command to make its certificate; install openssl"
        )
    d = Path(tempfile.mkdtemp(prefix="npu-lora-sandbox-tls-"))
    cert, key = d / "tls.crt", d / "tls.key"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=npu-lora-sandbox",
            "-addext",
            f"subjectAltName={_san(host)}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyCertSign",
            "-addext",
            "extendedKeyUsage=serverAuth",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    return ServingCert(cert.read_bytes(), cert, key)
