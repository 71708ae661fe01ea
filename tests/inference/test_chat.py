"""``npu-lora chat``: piped stdin, streamed reply writer, the chat template fallback."""

from __future__ import annotations

import io

import pytest
from adapter_helpers import run_cli


def test_chat_with_piped_stdin_replies_once_per_line_and_exits_0(finished_run):
    r = run_cli("chat", str(finished_run), "--max-new-tokens", "6", stdin="hello\n좋은 영화\nbye\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split("\n")) == 4 and r.stdout.endswith("\n")  # 3 replies
    assert ">>>" not in r.stdout + r.stderr and "\x1b[" not in r.stdout


def test_sampled_chat_with_a_system_message_runs(finished_run):
    args = ["--temperature", "0.9", "--top-p", "0.8", "--seed", "1", "--system", "be brief"]
    r = run_cli("chat", str(finished_run), "--max-new-tokens", "4", *args, stdin="hi\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1


def test_reply_writer_drops_the_stop_string_and_keeps_one_line():
    from npu_lora.commands.chat import ReplyWriter

    out = io.StringIO()
    w = ReplyWriter(out, "<|im_end|>", one_line=True)
    for piece in ("a\nb", "<|im", "_end|>", "tail"):
        w.write(piece)
    w.write("", end=True)
    assert out.getvalue() == "a\\nb" and w.text == "a\nb"


def test_byte_level_tokenizer_gets_the_chatml_fallback():
    from npu_lora.data.tokenizer import byte_level_tokenizer, ensure_chat_template

    tok = ensure_chat_template(byte_level_tokenizer())
    assert byte_level_tokenizer().chat_template is None  # the cached one is untouched
    assert ensure_chat_template(tok) is tok  # already has one
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_piped_line_too_long_or_not_utf8_is_named_and_read_no_further():
    from npu_lora.commands.chat import InputLineError, read_turn

    s = io.BytesIO(b"hi\r\n" + b"x" * (1 << 20) + b"\n\xff\xfe\n")
    assert read_turn(s, 1, 4096) == "hi"
    with pytest.raises(InputLineError, match=r"stdin:2: .*longer than --max-input-bytes \(4096"):
        read_turn(s, 2, 4096)
    assert s.tell() < 8192  # the 1 MB line was not read whole
    with pytest.raises(InputLineError, match=r"stdin:7: the input line is not UTF-8"):
        read_turn(io.BytesIO(b"\xff\xfe\n"), 7, 4096)
    assert read_turn(io.BytesIO(b""), 1, 4096) is None


def test_chat_exits_2_naming_a_1_mb_line_after_answering_the_lines_before(finished_run):
    import subprocess
    import sys

    from testkit import REPO, cli_env

    for bad, needle in ((b"y" * (1 << 20), "longer than"), (b"\xff\xfe caf\xe9", "not UTF-8")):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "npu_lora.cli",
                "chat",
                str(finished_run),
                "--max-new-tokens",
                "3",
            ],
            input=b"hello\n" + bad + b"\nnever\n",
            capture_output=True,
            timeout=300,
            env=cli_env(),
            cwd=str(REPO),
        )
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode == 2, err
        assert "stdin:2: the input line is" in err and needle in err
        assert "Traceback" not in err
        assert r.stdout.count(b"\n") == 1  # the reply to "hello" only
