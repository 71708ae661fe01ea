"""``npu-lora export RUN_DIR --merged DIR``: the base with the run's adapter merged, as a Hugging
Face model directory (safetensors, config.json, tokenizer, generation config) that
``AutoModelForCausalLM.from_pretrained(DIR)`` loads offline. The peft adapter (``RUN_DIR/adapter``)
stays the default artefact; a merged copy is for serving stacks without LoRA support.

The base is rebuilt and verified as for ``predict`` (:mod:`npu_lora.inference.load`); see
:mod:`npu_lora.inference.export`. ``--verify`` reloads DIR and prints the largest logit
difference to base+adapter on a short probe text. A non-empty DIR is refused unless ``--force``,
and ``--force`` replaces only a previous export (its ``npu_lora_export.json`` lists every file in
it): never ``/``, ``$HOME``, a run directory or an ancestor of one (:mod:`npu_lora.api.outpaths`).
DIR is written through a temporary directory and a rename.

Exit codes: 0, 2 (RUN_DIR without config.yaml or adapter, a base that differs, a DIR
that may not be replaced),
1 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from npu_lora.commands.common import add_run_arguments

PROBE = "npu-lora export: a probe sentence to compare logits. 리뷰: 좋은 영화\\n감정:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--merged", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="weights dtype (default auto: the model directory's dtype, float32 for a preset)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace DIR when it is a previous export (its npu_lora_export.json lists every file)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="reload DIR with AutoModelForCausalLM and compare its logits with base+adapter",
    )


def run(args: argparse.Namespace) -> int:
    """Exit codes: :mod:`npu_lora.commands.common` (``run_command``)."""
    from npu_lora.inference.export import check_out
    from npu_lora.inference.load import check_run_dir

    out = Path(args.merged).expanduser()
    check_run_dir(Path(args.run_dir), args.adapter)
    check_out(out, args.force, Path(args.run_dir).expanduser())
    return _export(args, out)


def _export(args: argparse.Namespace, out: Path) -> int:
    import torch

    from npu_lora.commands.common import load_from_args
    from npu_lora.inference.export import (
        export_dtype,
        export_merged,
        logits,
        max_logit_difference,
        plain_model,
    )

    loaded = load_from_args(args)
    probe = reference = None
    if args.verify:
        ids = loaded.tokenizer.encode(PROBE, add_special_tokens=False)
        probe = torch.tensor([ids], dtype=torch.long)
        reference = logits(plain_model(loaded, export_dtype(loaded, args.dtype)), probe)
    export_merged(loaded, out, dtype=args.dtype, force=args.force)
    files = sorted(p.name for p in out.iterdir())
    print(f"merged model: {out} ({', '.join(files)})")
    print(f"base: {loaded.base_check}; adapter: {loaded.adapter}")
    if probe is not None and reference is not None:
        diff = max_logit_difference(reference, out, probe)
        print(f"verify: max |logit difference| to base+adapter = {diff:.3g}")
    return 0
