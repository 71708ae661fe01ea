#!/usr/bin/env python3
"""The digest of the sources an image is built from (what the Dockerfile COPYs: pyproject.toml,
worker/, operator/, scripts/image_requirements.py, and the Dockerfile itself; README.md is copied too, but only as the wheel's
long description, so a README-only change does not make an image stale).

``scripts/build-images.sh`` stores it as the image label ``io.npu-lora.source-digest``; the image
smoke tests (tests/images) skip an image whose label differs from the working tree's digest, so
an image built from other sources is never taken for this tree's. Standard library only.

    python3 scripts/source_digest.py [REPO_ROOT]
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

LABEL = "io.npu-lora.source-digest"
PATHS = ("Dockerfile", "pyproject.toml", "worker", "operator", "scripts/image_requirements.py")


def _files(root: Path) -> list[str]:
    """The files under PATHS that git tracks (or does not ignore); a plain walk outside git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "--", *PATHS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return sorted(p for p in out.splitlines() if (root / p).is_file())
    except (OSError, subprocess.CalledProcessError):
        found: list[str] = []
        for p in PATHS:
            q = root / p
            found += [str(f.relative_to(root)) for f in q.rglob("*") if f.is_file()]
            if q.is_file():
                found.append(p)
        return sorted(f for f in found if "__pycache__" not in f)


def source_digest(root: Path) -> str:
    h = hashlib.sha256()
    for rel in _files(root):
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256((root / rel).read_bytes()).digest())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    print(source_digest(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1])))
