"""The sandbox kubelet expands ``$(VAR)`` in env values, command and args as the kubelet does
(``$$`` is a literal ``$`` anywhere), so the operator's escaping of user paths
(``builders.literal_arg``) is tested against the rule a real node applies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from npu_lora_operator.builders import literal_arg
from npu_lora_sandbox.podenv import _expand

ENV = {"A": "x", "B": "$(A)", "TOKEN": "s3cr3t", "UP": ".."}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$(A)", "x"),
        ("$$(A)", "$(A)"),
        ("a$$b", "a$b"),  # `$$` is `$` before anything, not only before `(`
        ("a$b", "a$b"),
        ("$$", "$"),
        ("$$$(A)", "$x"),
        ("$(C)", "$(C)"),  # unknown: as written
        ("$(A", "$(A"),  # unterminated
        ("$(", "$("),
        ("$", "$"),
        ("$(B)", "$(A)"),  # a value is not expanded twice
        ("/mnt/output/$(UP)/x", "/mnt/output/../x"),
    ],
)
def test_expansion_follows_the_kubelet(text: str, want: str) -> None:
    assert _expand(text, ENV) == want


@given(st.text(alphabet="$()ABTOKENUP/.x", max_size=24))
def test_a_literal_arg_reaches_the_process_as_written(text: str) -> None:
    assert _expand(literal_arg(text), ENV) == text
