#!/usr/bin/env python3
"""Tokens per step and padding with and without ``data.packing`` for a manifest's data.

    python scripts/packing_stats.py examples/tiny-chat.yaml
    python scripts/packing_stats.py examples/tiny-local.yaml --data ../shared/data/nsmc/ratings_train.txt \\
        --tokenizer ../shared/data/qwen3-tokenizer --seq-len 128

Prints one JSON line per setting (the summary's ``data`` stats). Reads and tokenises only.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("manifest")
    ap.add_argument("--data", help="override spec.data.path (format auto)")
    ap.add_argument("--tokenizer", help="override: a tokenizer directory (spec.model.tokenizer)")
    ap.add_argument("--seq-len", type=int, help="override spec.training.seqLen")
    args = ap.parse_args(argv)

    from npu_lora.api.load import load_manifest
    from npu_lora.data import load_examples, load_tokenizer, tokenize_examples

    spec = load_manifest(args.manifest).spec
    if args.data:
        spec.data.path, spec.data.format = args.data, "auto"
    if args.tokenizer:
        spec.model.tokenizer = args.tokenizer
    if args.seq_len:
        spec.training.seq_len = args.seq_len
    examples = load_examples(spec)
    tok = load_tokenizer(spec.model)
    for packing in (False, True):
        spec.data.packing = packing
        stats = tokenize_examples(examples, tok, spec).stats.to_dict()
        row = {
            "data": spec.data.path,
            "seq_len": spec.training.seq_len,
            "batch": spec.training.batch_size,
        }
        print(json.dumps({**row, **stats}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
