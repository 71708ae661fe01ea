"""Bounded manifest reading: size, encoding, YAML depth and alias expansion limits.

A manifest is read as bytes (at most :data:`MAX_MANIFEST_BYTES`), decoded as UTF-8, then its
YAML *events* are scanned before anything is constructed: nesting deeper than
:data:`MAX_DEPTH`, more than :data:`MAX_ALIASES` aliases, or more than :data:`MAX_NODES` nodes
once aliases are expanded (an "alias bomb") is refused. The scan is iterative (PyYAML's parser
keeps an explicit state stack), so a YAML nested 100,000 levels deep is refused in milliseconds
instead of raising ``RecursionError``. Every refusal is a :class:`~npu_lora.api.load.SpecError`
whose message starts with the file name.

The limits are far above any real MoEFinetune (the largest example is ~60 lines, depth 5, no
aliases) and near what a Kubernetes apiserver accepts (objects up to ~1.5 MiB; its YAML decoder
also rejects deep nesting and excessive alias expansion).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

#: Largest manifest file read (bytes). A ConfigMap, where the operator puts the worker's
#: config, holds at most 1 MiB.
MAX_MANIFEST_BYTES = 1 << 20
#: Deepest nesting of mappings/sequences.
MAX_DEPTH = 64
#: Most alias nodes (``*name``) in a document.
MAX_ALIASES = 100
#: Most nodes once every alias is expanded.
MAX_NODES = 100_000
#: Longest input echoed back in an error message (characters).
MAX_ECHO = 80


class ManifestLimitError(ValueError):
    """A manifest breaks a limit; ``str()`` is the user-facing message without the file name."""


def short_repr(value: Any, limit: int = MAX_ECHO) -> str:
    """``repr(value)`` cut to ``limit`` characters (inputs echoed in errors stay short)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'" + f" ({len(text)} chars)"


def read_manifest_text(path: Path, limit: int = MAX_MANIFEST_BYTES) -> str:
    """The file's text; raises ManifestLimitError (too big, not UTF-8) or OSError."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ManifestLimitError(f"larger than {limit} bytes (the manifest size limit)")
    if b"\x00" in data:
        raise ManifestLimitError(f"not a YAML text file (NUL byte at offset {data.index(0)})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestLimitError(
            f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}: {e.reason})"
        ) from None
    return text.removeprefix("\ufeff")


class DuplicateKeyError(ManifestLimitError):
    """A mapping names the same key twice (YAML and JSON alike: the last would silently win)."""


def _base_loader() -> type:
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_base_loader()):  # type: ignore[misc]
    """The safe loader, refusing a key repeated in one mapping (keys a merge ``<<`` brings in
    may still be overridden, as YAML intends; ``<<`` itself at most once: a second would
    silently lose to the first)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            merge_line = 0
            for key_node, _ in node.value:
                line = key_node.start_mark.line + 1 if key_node.start_mark else 0
                if key_node.tag == "tag:yaml.org,2002:merge":
                    if merge_line:
                        raise DuplicateKeyError(
                            f"line {line}: duplicate merge key '<<' (first at line {merge_line}; "
                            "merge several mappings with '<<: [*a, *b]')"
                        )
                    merge_line = line
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # the base class reports unhashable keys
                if key in seen:
                    raise DuplicateKeyError(
                        f"line {line}: duplicate key {short_repr(key)} (first at line "
                        f"{seen[key]}; a mapping may name each key once)"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _loader() -> type:
    return _UniqueKeyLoader


def check_yaml_events(
    text: str,
    *,
    max_nodes: int = MAX_NODES,
    max_aliases: int = MAX_ALIASES,
    max_depth: int = MAX_DEPTH,
) -> None:
    """Scan the YAML event stream; raise ManifestLimitError past a limit (nodes once aliases are
    expanded, aliases, depth), yaml.YAMLError if bad. Also the sandbox API server's bound."""
    depth = 0
    aliases = 0
    nodes = 0
    sizes: dict[str, int] = {}  # anchor -> expanded node count
    starts: list[tuple[str | None, int]] = []
    for ev in yaml.parse(text, Loader=_loader()):
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                line = ev.start_mark.line + 1 if ev.start_mark else "?"
                raise ManifestLimitError(
                    f"line {line}: nested deeper than {max_depth} levels (the depth limit)"
                )
            starts.append((ev.anchor, nodes))
            nodes += 1
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
            anchor, start = starts.pop()
            if anchor is not None:
                sizes[anchor] = nodes - start
        elif isinstance(ev, yaml.ScalarEvent):
            nodes += 1
            if ev.anchor is not None:
                sizes[ev.anchor] = 1
        elif isinstance(ev, yaml.AliasEvent):
            aliases += 1
            if aliases > max_aliases:
                raise ManifestLimitError(f"more than {max_aliases} YAML aliases (the alias limit)")
            nodes += sizes.get(ev.anchor or "", 1)
        if nodes > max_nodes:
            raise ManifestLimitError(
                f"more than {max_nodes} YAML nodes once aliases are expanded (the node limit)"
            )


def load_yaml_documents(text: str) -> list[Any]:
    """All non-empty documents of ``text``, after :func:`check_yaml_events`."""
    check_yaml_events(text)
    return [d for d in yaml.load_all(text, Loader=_loader()) if d is not None]


def nonfinite_paths(obj: Any, prefix: str = "") -> list[str]:
    """Dotted paths of float values that are NaN or infinite anywhere in ``obj``."""
    out: list[str] = []
    if isinstance(obj, float) and not math.isfinite(obj):
        out.append(prefix or "<root>")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += nonfinite_paths(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += nonfinite_paths(v, f"{prefix}[{i}]")
    return out
