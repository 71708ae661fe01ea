#!/usr/bin/env python3
"""Generate the small example datasets shipped in ``npu_lora/data/examples`` (deterministic).

- ``nsmc-mini.tsv``: a synthetic Korean movie-review sentiment set in NSMC format
  (``id<TAB>document<TAB>label``, header, no quoting; label 1 positive, 0 negative), balanced.
- ``jsonl-mini.jsonl``: ``{"prompt", "completion"}`` records (small arithmetic questions and
  sentiment questions) and ``{"text"}`` records (short sentences).
- ``chat-mini.jsonl``: ``{"messages": [{"role", "content"}, ...]}`` conversations (Korean and
  English: arithmetic with follow-up turns, review sentiment, word translation), some
  multi-turn, some with a system prompt (``format: chat``; its own RNG, so adding it left the
  other files unchanged).

Everything is generated from word lists with ``random.Random(SEED)``: no real data is copied.
Run twice, it writes byte-identical files::

    python scripts/make_example_data.py            # writes worker/npu_lora/data/examples/
    python scripts/make_example_data.py --check    # exit 1 if the shipped files differ
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SEED = 20261130
N_NSMC = 400
N_JSONL_PROMPT = 60
N_JSONL_TEXT = 40
N_CHAT = 200

OUT = Path(__file__).resolve().parents[1] / "worker" / "npu_lora" / "data" / "examples"

SUBJECTS = [
    "배우들 연기",
    "스토리",
    "음악",
    "연출",
    "영상미",
    "결말",
    "주인공",
    "대사",
    "액션",
    "전개",
]
POS_PRED = [
    "정말 좋았다",
    "최고였다",
    "감동적이다",
    "훌륭하다",
    "완벽했다",
    "기억에 남는다",
    "마음에 든다",
]
NEG_PRED = ["너무 별로다", "최악이었다", "지루하다", "실망스럽다", "엉망이다", "어색하다", "아쉽다"]
POS_END = [
    "강력 추천합니다",
    "또 보고 싶다",
    "명작이네요",
    "시간 가는 줄 몰랐다",
    "10점 만점",
    "ㅎㅎ 재밌다",
]
NEG_END = ["돈이 아깝다", "보지 마세요", "시간 낭비", "잠만 잤다", "1점도 아깝다", "ㅡㅡ 노잼"]
FILLERS = ["솔직히", "진짜", "오랜만에", "기대 안 했는데", "주말에 봤는데", "친구랑 봤는데", ""]


def review(rng: random.Random, positive: bool) -> str:
    pred, end = (POS_PRED, POS_END) if positive else (NEG_PRED, NEG_END)
    parts = [rng.choice(FILLERS)]
    for _ in range(rng.randint(1, 2)):
        parts.append(
            f"{rng.choice(SUBJECTS)}{rng.choice(['이', '가', '은', '는', ''])} {rng.choice(pred)}"
        )
    if rng.random() < 0.8:
        parts.append(rng.choice(end))
    text = " ".join(p for p in parts if p)
    r = rng.random()
    if (
        r < 0.04
    ):  # NSMC has documents with bare double quotes: readers must not treat them as quoting
        text = f'"{text}'
    elif r < 0.08:
        text = f'{text} "강추"' if positive else f'{text} "비추"'
    elif r < 0.15:
        text += rng.choice(["!!", "...", "?", " ^^", " ;;"])
    return text[:139]


def make_nsmc(rng: random.Random) -> str:
    labels = [1] * (N_NSMC // 2) + [0] * (N_NSMC // 2)
    rng.shuffle(labels)
    ids = rng.sample(range(1_000_000, 9_999_999), N_NSMC)
    lines = ["id\tdocument\tlabel"]
    for i, label in zip(ids, labels, strict=True):
        lines.append(f"{i}\t{review(rng, bool(label))}\t{label}")
    return "\n".join(lines) + "\n"


def make_jsonl(rng: random.Random) -> str:
    records: list[dict[str, str]] = []
    for _ in range(N_JSONL_PROMPT):
        if rng.random() < 0.5:
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            records.append({"prompt": f"질문: {a} 더하기 {b}는?\n답:", "completion": f" {a + b}"})
        else:
            positive = rng.random() < 0.5
            records.append(
                {
                    "prompt": f"다음 리뷰는 긍정인가요 부정인가요?\n{review(rng, positive)}\n답:",
                    "completion": " 긍정" if positive else " 부정",
                }
            )
    for _ in range(N_JSONL_TEXT):
        positive = rng.random() < 0.5
        records.append(
            {"text": f"{review(rng, positive)}. 그래서 {'좋았다' if positive else '싫었다'}."}
        )
    rng.shuffle(records)
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


SYSTEMS = ["당신은 친절한 도우미입니다.", "You are a helpful assistant.", "짧게 답하세요."]
WORDS = [
    ("사과", "apple"),
    ("고양이", "cat"),
    ("영화", "movie"),
    ("학교", "school"),
    ("바다", "sea"),
    ("음악", "music"),
    ("친구", "friend"),
    ("하늘", "sky"),
]


def _arith(rng: random.Random) -> list[dict[str, str]]:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    k = rng.randint(2, 4)
    if rng.random() < 0.5:
        turns = [
            ("user", f"{a} 더하기 {b}는?"),
            ("assistant", f"{a + b}입니다."),
            ("user", f"그럼 거기에 {k}를 곱하면?"),
            ("assistant", f"{(a + b) * k}입니다."),
        ]
    else:
        turns = [
            ("user", f"What is {a} plus {b}?"),
            ("assistant", f"{a + b}."),
            ("user", f"And times {k}?"),
            ("assistant", f"{(a + b) * k}."),
        ]
    return [{"role": r, "content": c} for r, c in turns[: 2 if rng.random() < 0.3 else 4]]


def _sentiment(rng: random.Random) -> list[dict[str, str]]:
    positive = rng.random() < 0.5
    return [
        {"role": "user", "content": f"이 리뷰는 긍정이야 부정이야? {review(rng, positive)}"},
        {"role": "assistant", "content": "긍정" if positive else "부정"},
    ]


def _translate(rng: random.Random) -> list[dict[str, str]]:
    (ko, en), (ko2, en2) = rng.sample(WORDS, 2)
    msgs = [
        {"role": "user", "content": f"'{ko}'를 영어로?"},
        {"role": "assistant", "content": en},
    ]
    if rng.random() < 0.5:
        msgs += [
            {"role": "user", "content": f"'{ko2}'는?"},
            {"role": "assistant", "content": en2},
        ]
    return msgs


def make_chat(rng: random.Random) -> str:
    records = []
    for _ in range(N_CHAT):
        msgs = rng.choice([_arith, _sentiment, _translate])(rng)
        if rng.random() < 0.3:
            msgs = [{"role": "system", "content": rng.choice(SYSTEMS)}, *msgs]
        records.append({"messages": msgs})
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def build() -> dict[str, str]:
    rng = random.Random(SEED)
    return {
        "nsmc-mini.tsv": make_nsmc(rng),
        "jsonl-mini.jsonl": make_jsonl(rng),
        "chat-mini.jsonl": make_chat(random.Random(SEED + 1)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=OUT, help="output directory")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out")
    args = ap.parse_args(argv)
    files = build()
    if args.check:
        bad = [
            n
            for n, t in files.items()
            if not (args.out / n).is_file() or (args.out / n).read_text(encoding="utf-8") != t
        ]
        for n in bad:
            print(f"stale: {args.out / n}", file=sys.stderr)
        return 1 if bad else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {args.out / name} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
