"""Memory of a loaded Hugging Face fast tokenizer against its vocabulary size.

Writes a synthetic byte-level BPE tokenizer directory (tokenizer.json + tokenizer_config.json)
of ``--vocab`` entries (the GPT-2 byte alphabet, then merges of random earlier tokens, at most
16 characters; Qwen3's size is 151,936 with 151,387 merges), then in a fresh process imports
transformers, samples VmRSS, loads it with ``AutoTokenizer.from_pretrained`` (as
npu_lora.data.tokenizer does) and encodes 1 MB of text. Prints one JSON line per vocab size.

    python experiments/memfit/tokenizer_rss.py --vocab 32768,151936
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            pass
    return {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/self/status")
            if l.startswith(("VmRSS:", "VmHWM:"))}
import transformers
from transformers import AutoTokenizer
before = rss()
tok = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
loaded = rss()
text = ("the quick brown fox jumps over the lazy dog 1234567890 " * 20000)[:1_000_000]
ids = tok(text)["input_ids"]
after = rss()
print(json.dumps({"vocab": len(tok), "before_rss": before["VmRSS"], "loaded_rss": loaded["VmRSS"],
                  "after_encode_rss": after["VmRSS"], "hwm": after["VmHWM"], "tokens": len(ids)}))
"""


def write(d: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    rng = random.Random(0)
    vocab_map = {c: i for i, c in enumerate(alphabet)}
    toks = list(alphabet)
    merges = []
    while len(toks) < vocab:
        a, b = rng.choice(toks[-4096:] + alphabet), rng.choice(toks)
        new = a + b
        if len(new) > 16 or new in vocab_map:
            continue
        vocab_map[new] = len(toks)
        toks.append(new)
        merges.append((a, b))
    core = Tokenizer(models.BPE(vocab=vocab_map, merges=merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    d.mkdir(parents=True, exist_ok=True)
    core.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"})
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="32768,151936")
    ap.add_argument("--dir", default="/tmp/memfit/tok")
    a = ap.parse_args()
    for v in (int(x) for x in a.vocab.split(",")):
        d = Path(a.dir) / str(v)
        if not (d / "tokenizer.json").is_file():
            write(d, v)
        out = subprocess.run([sys.executable, "-c", CHILD, str(d)], capture_output=True, text=True)
        line = (out.stdout.strip().splitlines() or [out.stderr[-1500:]])[-1]
        rec = json.loads(line) if line.startswith("{") else {"error": line}
        rec["tokenizer_json_bytes"] = (d / "tokenizer.json").stat().st_size
        if "loaded_rss" in rec:
            rec["load_growth"] = rec["loaded_rss"] - rec["before_rss"]
            rec["bytes_per_entry"] = round(rec["load_growth"] / rec["vocab"], 1)
            rec["encode_growth"] = rec["after_encode_rss"] - rec["before_rss"]
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
