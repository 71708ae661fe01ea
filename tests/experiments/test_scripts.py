"""experiments/ is a lab notebook, not the repository: within a budget, every script runs at HEAD.

Budget (issue 31): at most 150 files and 3 MB under experiments/ in all. Records are Markdown;
raw data is kept compressed (``raw/<run>.tar.gz``: ``tar -xzf`` restores ``raw/<run>/``) only
where a record cites it; plots are redrawn by ``experiments/plot.py``, never committed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments"
MAX_FILES = 150
MAX_BYTES = 3 * 1024 * 1024
OUR_PACKAGES = ("npu_lora", "npu_lora_operator", "npu_lora_sandbox")


def _files() -> list[Path]:
    """The files git tracks under experiments/ (on disk, less ignored output, without git)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", "experiments"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        files = [ROOT / p for p in out.decode().split("\0") if p]
        if files:
            return [f for f in files if f.exists()]
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {EXP / "plots"} | {p for p in (EXP / "raw").glob("*") if p.is_dir()}
    return [
        f
        for f in EXP.rglob("*")
        if f.is_file() and not any(s in f.parents for s in skip) and "__pycache__" not in f.parts
    ]


FILES = _files()
SCRIPTS = sorted(f for f in FILES if f.suffix == ".py")
RECORDS = sorted(f for f in EXP.glob("*.md") if f.name != "README.md")


def test_experiments_stay_within_the_file_and_byte_budget():
    total = sum(f.stat().st_size for f in FILES)
    assert len(FILES) <= MAX_FILES, f"{len(FILES)} files under experiments/ (budget {MAX_FILES})"
    assert total <= MAX_BYTES, f"{total} bytes under experiments/ (budget {MAX_BYTES})"


def test_no_plot_or_uncompressed_bulk_data_is_committed():
    bulky = [
        f.relative_to(ROOT)
        for f in FILES
        if f.suffix in {".png", ".jpg", ".svg", ".jsonl", ".log"} or f.stat().st_size > 256 * 1024
    ]
    assert not bulky, f"commit raw data compressed (raw/<run>.tar.gz) and plots not at all: {bulky}"


def test_every_record_is_in_the_index():
    index = (EXP / "README.md").read_text(encoding="utf-8")
    missing = [r.name for r in RECORDS if f"]({r.name})" not in index]
    assert not missing, f"experiments/README.md does not list: {missing}"


def test_every_folder_and_script_has_an_owner_in_the_readme():
    """The owners table (torchtitan's rule: an owner, removed when no longer maintained or once
    its result is absorbed) lists every folder and top-level script under experiments/."""
    index = (EXP / "README.md").read_text(encoding="utf-8")
    section = index.split("## Owners and removal", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+?)/?` \|", section, flags=re.MULTILINE))
    tops = {
        f.relative_to(EXP).parts[0]
        for f in FILES
        if f.suffix != ".md" or len(f.relative_to(EXP).parts) > 1
    }
    missing = sorted(tops - listed)
    assert not missing, f"experiments/README.md's owners table does not list: {missing}"
    gone = sorted(p for p in listed if not (EXP / p).exists())
    assert not gone, f"the owners table lists what is not there: {gone}"


def test_raw_data_a_record_cites_is_kept():
    """``experiments/raw/<run>/...`` in a record resolves to the archive ``raw/<run>.tar.gz``."""
    archives = {p.name.removesuffix(".tar.gz") for p in (EXP / "raw").glob("*.tar.gz")}
    cited: set[tuple[str, str]] = set()
    for record in RECORDS:
        for run in re.findall(r"raw/([0-9A-Za-z][\w.,{}-]*?)(?:/|\.log|`)", record.read_text()):
            head, _, rest = run.partition("{")
            alts, _, tail = rest.partition("}")
            for alt in alts.split(",") if rest else [""]:
                cited.add((record.name, (head + alt + tail).removesuffix(".tar.gz")))
    missing = sorted((rec, run) for rec, run in cited if run not in archives)
    assert not missing, f"records cite raw data that is not kept: {missing}"
    uncited = archives - {run for _, run in cited}
    assert not uncited, f"raw archives no record cites: {sorted(uncited)}"


def _resolves(module: str, name: str | None) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    if name is None or name == "*" or hasattr(mod, name):
        return True
    return importlib.util.find_spec(f"{module}.{name}") is not None


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(EXP)) for s in SCRIPTS])
def test_script_imports_at_head(script):
    """Every script imports (its main guarded), and every name it takes from the project's
    packages, also inside functions, still exists."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    guarded = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    assert guarded, f"{script.name}: runs on import (no `if __name__ == '__main__':`)"
    stale = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in OUR_PACKAGES:
                stale += [
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if not _resolves(node.module, a.name)
                ]
        elif isinstance(node, ast.Import):
            stale += [
                a.name
                for a in node.names
                if a.name.split(".")[0] in OUR_PACKAGES and not _resolves(a.name, None)
            ]
    assert not stale, f"{script.name} uses names HEAD no longer has: {stale}"
    spec = importlib.util.spec_from_file_location(f"_experiment_{script.stem}", script)
    assert spec and spec.loader
    saved = list(sys.path)
    try:
        sys.path.insert(0, str(script.parent))
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    finally:
        sys.path[:] = saved


def test_plot_script_redraws_a_kept_run(tmp_path):
    archive = EXP / "raw" / "2026-11-30-s512-fp32.tar.gz"
    with tarfile.open(archive) as tar:
        assert any(m.name.endswith("bench.jsonl") for m in tar.getmembers())
    proc = subprocess.run(
        [sys.executable, str(EXP / "plot.py"), str(archive), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    png = tmp_path / "2026-11-30-s512-fp32" / "bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_script_finds_every_kept_benchmark(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(EXP / "plot.py"), "--list", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip().splitlines()[-1].split()[0]) >= 100


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
@pytest.mark.parametrize("source", ["stream-kernel/bench.cpp", "stream-kernel/readbw.cpp"])
def test_cpp_benchmark_compiles_against_the_kernel_at_head(source):
    proc = subprocess.run(
        [
            "g++",
            "-fsyntax-only",
            "-std=c++17",
            "-fopenmp",
            f"-I{ROOT / 'worker/npu_lora/moe/kernels'}",
            str(EXP / source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
