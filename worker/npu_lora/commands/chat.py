"""``npu-lora chat RUN_DIR``: talk to a finished run's adapter, in a terminal or through a pipe.

Each user turn is added to the conversation, rendered with the tokenizer's chat template (the
byte-level preset tokenizer gets the ChatML fallback, ``npu_lora.data.tokenizer.
ensure_chat_template``) and answered with ``generate`` on the run's model (engine modules: host
experts, KV cache), tokens streamed to stdout as they come. Greedy by default;
``--temperature T`` (> 0) samples, with ``--top-p`` and ``--seed``. The history is kept
(multi-turn) unless ``--no-history``.

- stdin a terminal: a ``>>>`` prompt; ``/reset`` clears the history, ``/exit`` (or Ctrl-D) quits.
- stdin not a terminal (piped): one user turn per input line, one reply per output line (line
  breaks inside a reply are written as ``\\n``), no prompts or colours; exits at end of input.

An input line is at most ``--max-input-bytes`` (default 64 KiB) of UTF-8: piped, a longer or
undecodable line ends the chat with exit 2 naming ``stdin:LINE`` (read no further than the
limit); in a terminal the line is refused with the same message and the prompt comes back.

Exit codes: 0, 2 (a RUN_DIR without config.yaml or adapter, a base that differs, an input line
that is too long or not UTF-8), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from npu_lora.api.load import SpecError
from npu_lora.commands.common import CommandError, add_run_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    parser.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0 (default): greedy"
    )
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed")
    parser.add_argument("--system", metavar="TEXT", help="a system message first")
    parser.add_argument(
        "--no-history", action="store_true", help="answer each turn alone (no multi-turn)"
    )
    parser.add_argument(
        "--max-input-bytes",
        type=int,
        default=MAX_INPUT_BYTES,
        metavar="N",
        help=f"longest input line in bytes (default {MAX_INPUT_BYTES}); longer: exit 2 when piped",
    )


#: ``--max-input-bytes``' default: one user turn (a line of stdin)
MAX_INPUT_BYTES = 64 << 10


class InputLineError(SpecError):
    """An input line that is too long or not UTF-8; ``str()`` names ``stdin:LINE``."""


def read_turn(stream: Any, lineno: int, max_bytes: int) -> str | None:
    """The next line of a piped ``stream`` (binary, or text in tests) without its line ending;
    None at the end. Reads at most ``max_bytes`` (+ the ending) of it: InputLineError when it is
    longer or not UTF-8."""
    raw = stream.readline(max_bytes + 2)
    if not raw:
        return None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    body = raw.rstrip(b"\r\n")
    if len(body) > max_bytes:
        raise InputLineError(
            f"stdin:{lineno}: the input line is longer than --max-input-bytes ({max_bytes} "
            "bytes); send shorter turns or raise the limit"
        )
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputLineError(
            f"stdin:{lineno}: the input line is not UTF-8 text ({e.reason})"
        ) from None


class ReplyWriter:
    """Writes streamed text; holds back what may be the start of a stop string, drops the stop
    string; ``one_line``: line breaks as ``\\n`` (piped mode)."""

    def __init__(self, out: TextIO, stop: str | None, one_line: bool) -> None:
        self.out, self.stop, self.one_line = out, stop, one_line
        self.pending = ""
        self.stopped = False
        self.text = ""

    def _emit(self, s: str) -> None:
        self.text += s
        if self.one_line:
            s = s.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")
        self.out.write(s)
        self.out.flush()

    def write(self, s: str, end: bool = False) -> None:
        if self.stopped:
            return
        self.pending += s
        if self.stop and self.stop in self.pending:
            self._emit(self.pending.split(self.stop, 1)[0])
            self.pending, self.stopped = "", True
            return
        keep = 0
        if self.stop and not end:  # the longest suffix that starts the stop string
            for k in range(min(len(self.stop) - 1, len(self.pending)), 0, -1):
                if self.stop.startswith(self.pending[-k:]):
                    keep = k
                    break
        self._emit(self.pending[: len(self.pending) - keep])
        self.pending = self.pending[len(self.pending) - keep :]


def _streamer(tok: Any, writer: ReplyWriter) -> Any:
    from transformers import TextStreamer

    class _Stream(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            writer.write(text, end=stream_end)

    return _Stream(tok, skip_prompt=True, skip_special_tokens=True)


def run(args: argparse.Namespace) -> int:
    """Exit codes: :mod:`npu_lora.commands.common` (``run_command``); Ctrl-C ends a chat with 0."""
    if args.max_new_tokens < 1:
        raise CommandError("--max-new-tokens: must be at least 1")
    # `not (x >= 0)`: a NaN compares false both ways and would sample from garbage
    if not args.temperature >= 0 or not 0 < args.top_p <= 1 or args.temperature == float("inf"):
        raise CommandError("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.max_input_bytes < 1:
        raise CommandError("--max-input-bytes: must be at least 1")
    interactive = sys.stdin.isatty()
    try:
        from npu_lora.commands.common import load_from_args
        from npu_lora.inference.load import check_run_dir

        check_run_dir(Path(args.run_dir), args.adapter)

        if interactive:
            print(f"loading {args.run_dir} ...", file=sys.stderr)
        loaded = load_from_args(args)
        if interactive:
            print(
                f"base {loaded.base_check}; adapter {loaded.adapter}. /reset clears the "
                "history, /exit or Ctrl-D quits.",
                file=sys.stderr,
            )
        return _loop(loaded, args, interactive)
    except KeyboardInterrupt:  # the way out of a chat: not an error
        print(file=sys.stderr)
        return 0


def _turns(interactive: bool, max_bytes: int):
    lineno = 0
    stream = getattr(sys.stdin, "buffer", sys.stdin)
    while True:
        lineno += 1
        if interactive:
            try:
                line = input(">>> ")
            except EOFError:
                print(file=sys.stderr)
                return
            except UnicodeDecodeError as e:
                print(f"npu-lora chat: the line is not UTF-8 text ({e.reason})", file=sys.stderr)
                continue
            if len(line.encode("utf-8", "surrogateescape")) > max_bytes:
                print(
                    f"npu-lora chat: the line is longer than --max-input-bytes ({max_bytes} "
                    "bytes); not sent",
                    file=sys.stderr,
                )
                continue
        else:
            line = read_turn(stream, lineno, max_bytes)
            if line is None:
                return
        yield line


def _loop(loaded: Any, args: argparse.Namespace, interactive: bool) -> int:
    from npu_lora.data.chat import CHATML_TEMPLATE
    from npu_lora.data.tokenizer import CHATML_END
    from npu_lora.inference.generate import generate

    tok = loaded.tokenizer
    stop = CHATML_END if tok.chat_template == CHATML_TEMPLATE else None
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict[str, str]] = []
    for line in _turns(interactive, args.max_input_bytes):
        if interactive and line.strip() in ("/exit", "/quit"):
            break
        if interactive and line.strip() == "/reset":
            history.clear()
            continue
        if not line.strip():
            if not interactive:  # one reply line per input line, even an empty one
                sys.stdout.write("\n")
                sys.stdout.flush()
            continue
        messages = [*system, *history, {"role": "user", "content": line}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        writer = ReplyWriter(sys.stdout, stop, one_line=not interactive)
        generate(
            loaded,
            ids,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            streamer=_streamer(tok, writer),
            stop_strings=[stop] if stop else None,
        )
        writer.write("", end=True)
        sys.stdout.write("\n")
        sys.stdout.flush()
        if not args.no_history:
            history += [
                {"role": "user", "content": line},
                {"role": "assistant", "content": writer.text.strip()},
            ]
    return 0
