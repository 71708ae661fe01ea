"""The README stays a quick start, and the docs stay true: plain Markdown with checked links.

- README.md is at most 15 KB; the long material lives in docs/*.md, each linked from README.md.
- Every relative link in README.md, docs/*.md and experiments/README.md resolves to a file, and
  a ``#fragment`` to a heading of the target (GitHub's anchor rules).
- Every ``usage: npu-lora CMD`` synopsis equals what ``npu-lora CMD --help`` prints (whitespace
  aside), and every ``--flag`` written after ``npu-lora CMD`` in a code span or code block is an
  option of CMD's parser.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "experiments" / "README.md"]
README_MAX_BYTES = 15_000

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _prose(text: str) -> str:
    """The text without code blocks and code spans (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def test_readme_is_a_quick_start_of_at_most_15_kb():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes (at most {README_MAX_BYTES}): move reference material to docs/"
    )


def test_every_docs_page_is_linked_from_the_readme():
    targets = {t.split("#")[0] for t in LINK.findall(_prose(README.read_text(encoding="utf-8")))}
    missing = [_rel(d) for d in DOCS if _rel(d) not in targets]
    assert not missing, f"README.md's Documentation list lacks: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve_to_a_file_and_heading(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {_rel(dest)})")
    assert not broken, f"{_rel(page)}: broken links: {broken}"


# ----------------------------------------------------------------------------- CLI synopses


@cache
def _parser(command: str):
    from npu_lora import cli

    if command not in cli.SUBCOMMANDS:
        return None
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    importlib.import_module(cli.SUBCOMMANDS[command][0]).add_arguments(sub)
    return sub


def _flags(command: str) -> set[str]:
    parser = _parser(command)
    return {s for a in parser._actions for s in a.option_strings}


def _commands(text: str):
    """(command, the rest of its line) for every ``npu-lora CMD ...`` in code."""
    pieces = [line for block in FENCE.findall(text) for line in block.splitlines()]
    pieces += [span.strip("`") for span in INLINE_CODE.findall(FENCE.sub("", text))]
    for piece in pieces:
        if piece.lstrip().startswith("usage:"):
            continue
        # a command starts a line or follows a shell operator; a path may lead to the binary
        for m in re.finditer(
            r"(?:^|&&|;|\||\()\s*(?:\$\s*)?(?:[\w.~/-]*/)?npu-lora ([a-z][a-z-]*)(.*)", piece, re.S
        ):
            rest = re.split(r"\s(?:#|&&|\||;)", m.group(2).replace("\n", " "))[0]
            yield m.group(1), rest


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_cli_flags_in_the_docs_exist_in_the_parsers(page):
    wrong = []
    for command, rest in _commands(page.read_text(encoding="utf-8")):
        if _parser(command) is None:
            wrong.append(f"npu-lora {command}: no such command")
            continue
        for flag in re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", rest):
            if flag not in _flags(command) and not re.match(r"-\d", flag):
                wrong.append(f"npu-lora {command} {flag}")
    assert not wrong, f"{_rel(page)}: not in `npu-lora CMD --help`: {sorted(set(wrong))}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=_rel)
def test_usage_synopses_match_help(page):
    text = page.read_text(encoding="utf-8")
    for block in FENCE.findall(text):
        body = block.split("\n", 1)[1].rsplit("```", 1)[0]
        m = re.match(r"\s*usage: npu-lora ([a-z][a-z-]*)", body)
        if not m:
            continue
        parser = _parser(m.group(1))
        assert parser is not None, f"{_rel(page)}: npu-lora {m.group(1)}: no such command"
        assert body.split() == parser.format_usage().split(), (
            f"{_rel(page)}: the synopsis of `npu-lora {m.group(1)}` differs from --help:\n"
            f"{parser.format_usage()}"
        )


def test_the_readme_shows_the_run_synopsis():
    assert "usage: npu-lora run" in README.read_text(encoding="utf-8")
