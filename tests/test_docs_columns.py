"""Documented ``kubectl get mft`` output cannot drift from what kubectl prints.

The columns come from one registry: the CRD's printer columns
(``npu_lora_operator.crd.PRINTER_COLUMNS``), whose last-step columns are generated from the step
record (``worker/npu_lora/api/record.py``). Checked against it, derived and never listed here:

- every capture in README.md, docs/*.md and examples/*.yaml (a line starting ``NAME`` then
  ``PHASE``) has exactly the default columns, or all of them for ``-o wide``, in CRD order;
- the column table in docs/sandbox.md (between ``<!-- columns:begin -->`` and
  ``<!-- columns:end -->``) is :func:`columns_markdown`'s output; ``NPU_LORA_WRITE_DOCS=1``
  rewrites it;
- the sandbox banner lists the default and the wide-only columns of the same list;
- the run directory the banner and the docs name is where the API's path rule puts it.

A new printer column (a PROGRESS column, say) therefore fails this test until the captures are
re-taken (``npu-lora sandbox`` + ``kubectl get mft``, ``-o wide``) and the table regenerated.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BEGIN, END = "<!-- columns:begin -->", "<!-- columns:end -->"
HEADER = re.compile(r"^[ \t]*(?:#[ \t]*)?NAME[ \t]+PHASE\b.*$", re.M)


def _columns() -> list[dict]:
    crd = pytest.importorskip("npu_lora_operator.crd")
    return list(crd.PRINTER_COLUMNS)


def expected_headers() -> tuple[list[str], list[str]]:
    """(default, wide) header words of ``kubectl get mft``."""
    cols = _columns()
    default = ["NAME", *(c["name"].upper() for c in cols if not c.get("priority"))]
    wide = ["NAME", *(c["name"].upper() for c in cols)]
    return default, wide


def columns_markdown() -> str:
    """The docs' column table, from the registry."""
    lines = ["| column | shown | from | meaning |", "| --- | --- | --- | --- |"]
    for c in _columns():
        shown = "`-o wide`" if c.get("priority") else "always"
        lines.append(f"| {c['name'].upper()} | {shown} | `{c['jsonPath']}` | {c['description']} |")
    return "\n".join(lines)


def _captures() -> list[tuple[str, int, list[str]]]:
    out = []
    for page in [*PAGES, *EXAMPLES]:
        text = page.read_text(encoding="utf-8")
        for m in HEADER.finditer(text):
            words = m.group(0).strip().lstrip("#").split()
            line = text.count("\n", 0, m.start()) + 1
            out.append((str(page.relative_to(ROOT)), line, words))
    return out


def test_there_are_captures_to_check():
    pages = {p for p, _, _ in _captures()}
    assert {"README.md", "docs/sandbox.md"} <= pages, pages


@pytest.mark.parametrize("where", [f"{p}:{n}" for p, n, _ in _captures()])
def test_every_kubectl_get_capture_has_todays_columns(where):
    default, wide = expected_headers()
    (words,) = [w for p, n, w in _captures() if f"{p}:{n}" == where]
    assert words in (default, wide), (
        f"{where}: the capture's columns {words} are not kubectl's today\n"
        f"default: {default}\nwide:    {wide}\n(re-take it from a real run)"
    )


def test_the_column_table_in_the_docs_is_generated_from_the_registry():
    page = ROOT / "docs" / "sandbox.md"
    text = page.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{page}: no {BEGIN} ... {END} block"
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    want = f"{head}{BEGIN}\n{columns_markdown()}\n{END}{tail}"
    if text != want and os.environ.get("NPU_LORA_WRITE_DOCS") == "1":
        page.write_text(want, encoding="utf-8")
        text = want
    assert text == want, (
        "docs/sandbox.md's column table is stale: NPU_LORA_WRITE_DOCS=1 rewrites it"
    )


def test_the_sandbox_banner_lists_the_registrys_columns():
    command = pytest.importorskip("npu_lora_sandbox.command")
    default, wide = expected_headers()
    assert command.banner_columns(wide=False) == [c for c in default[1:] if c != "AGE"]
    assert command.banner_columns(wide=True) == [c for c in wide if c not in default]
