"""Print the requirements of pyproject.toml's core dependencies plus the given extras, one a
line, with the project's own extras (``npu-lora[worker]``) resolved.

The Dockerfile installs these in a layer that depends on pyproject.toml alone, before it copies
the sources: a source change then reuses the torch and dependency layers (docs/images.md).

    python scripts/image_requirements.py pyproject.toml rngd
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    name = re.sub(r"[-_.]+", "-", project["name"]).lower()
    optional = project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"image_requirements.py: no extra {extra!r} in {pyproject}")
        seen.add(extra)
        for req in optional[extra]:
            m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*\[([^\]]+)\]\s*$", req)
            if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == name:
                todo.extend(e.strip() for e in m.group(2).split(","))
            else:
                out.append(req)
    return list(dict.fromkeys(out))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(requirements(Path(argv[0]), argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
