"""``npu-lora bench``: A/B benchmark of HostMLP variants (and stock peers) in one process.

Example (real Qwen3-30B-A3B widths, 2 layers, fp32 host, the host stands in for the device)::

    npu-lora bench --preset qwen3-30b-a3b --layers 2 --seq-len 128 --rounds 6 --out experiments/raw/x

Variants: ``<placement>[+keep_graph][+overlap|+sequential][+padmax][+torch_head][@<experts_impl>]`` with
placement ``host-only`` or ``hot`` (``hot`` moves ``--hot-fraction`` of each layer's experts to the
device after a host-only warm-up; ``+overlap`` issues the hot device call asynchronously while the
host computes the cold experts, only on a non-CPU device; ``+sequential`` names the default;
``+padmax`` pads every hot expert's tokens to the largest group instead of the cost rule;
``+torch_head`` computes the
LM head with torch's ``mm`` instead of the backend's streaming kernel, for A/B; ``+fp32``,
``+4k``, ``+int8`` / ``+fp8``: host-only with fp32, unplaced or 8-bit expert weights beside the
engine's own, the 8-bit ones with each layer's output and dX error against them; the full
grammar and its refusals: ``npu_lora.api.variant.Variant``),
and ``peer@<experts_impl>`` (stock transformers + peft on the same model; added by ``--peers``).
Experts kernels: keys of transformers' ``ALL_EXPERTS_FUNCTIONS`` (``grouped_mm``, ``eager``,
``batched_mm``) and ours (``npu_lora_stream``, ``npu_lora_sorted``, ``npu_lora_sorted_grouped``,
``npu_lora_sorted_loop``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from npu_lora.api import backends as registry
from npu_lora.api.v1alpha1.sections import MoESpec

#: what ``npu-lora run`` runs when the manifest says nothing: the bench's defaults follow it
_RUN_DEFAULTS = {k: MoESpec.model_fields[k].default for k in ("experts_kernel", "host_dtype")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--preset",
        choices=["tiny-qwen3-moe", "qwen3-30b-a3b"],
        default=None,
        help="model preset (default tiny-qwen3-moe unless --config)",
    )
    src.add_argument(
        "--config", metavar="FILE.yaml", help="MoEFinetune manifest or bare spec (its model/lora)"
    )
    parser.add_argument("--layers", type=int, help="decoder layers (reduce depth of a big preset)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hot-fraction", type=float, default=0.25)
    parser.add_argument(
        "--hot-warmup-steps",
        type=int,
        default=2,
        help="host-only steps counting routing before the hot set",
    )
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps per variant")
    parser.add_argument("--steps-per-round", type=int, default=1)
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds; odd rounds run the variants in reverse"
    )
    parser.add_argument(
        "--host-dtype",
        choices=["auto", "fp32", "bf16", "float32", "bfloat16"],
        default=_RUN_DEFAULTS["host_dtype"],
        help="host expert weights' dtype (default: moe.hostDtype's default, %(default)s: what "
        "`npu-lora run` resolves on this CPU; the header says which it ran)",
    )
    parser.add_argument("--backend", choices=registry.choices(), default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: torch's, as `npu-lora run` without "
        "moe.hostThreads). On a shared, oversubscribed machine use 1: "
        "2-thread GEMMs there were 5-12x slower and far noisier (experiments/2026-11-30-*)",
    )
    parser.add_argument(
        "--experts-impl",
        default=_RUN_DEFAULTS["experts_kernel"],
        help="default host experts kernel (default: moe.expertsKernel's default, %(default)s, "
        "what `npu-lora run` runs)",
    )
    parser.add_argument(
        "--variants",
        default="host-only,host-only+keep_graph,hot,hot+keep_graph",
        help="comma-separated variants (see module doc)",
    )
    parser.add_argument(
        "--baseline", help="variant the paired deltas are taken against (default: the first)"
    )
    parser.add_argument(
        "--peers", action=argparse.BooleanOptionalAction, default=True, help="stock peers"
    )
    parser.add_argument(
        "--peer-impls", default="grouped_mm,eager", help="experts kernels of the peers"
    )
    parser.add_argument(
        "--limits", action=argparse.BooleanOptionalAction, default=True, help="STREAM bandwidth"
    )
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="kept-graph saved bytes",
    )
    parser.add_argument(
        "--layer-probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one layer's host MoE in the engine vs the stream kernel alone on the same tokens "
        "(the 'host MoE engine/kernel per layer' line; needs a npu_lora_stream variant)",
    )
    parser.add_argument(
        "--roofline",
        metavar="DIR",
        help="instead of the A/B: sweep the stream kernel over tokens per pass (T=64..2048) and "
        "draw its roofline for this machine into DIR (roofline.png, roofline.jsonl, roofline.md)",
    )
    parser.add_argument(
        "--roofline-dtypes",
        type=_roofline_dtypes,
        default="float32,bfloat16",
        metavar="LIST",
        help="with --roofline: the expert dtypes swept, comma-separated, of float32, bfloat16, "
        "int8, float8_e4m3fn (8-bit: the bf16 layer quantised, bf16 activations, bytes counted "
        "as held: 1 a weight plus the scales)",
    )
    parser.add_argument("--answer-tokens", type=int, default=8, help="label positions per sequence")
    parser.add_argument(
        "--peak-rss",
        action="store_true",
        help="first, each host-only/peer variant in a process of its own: its peak RSS "
        "(ru_maxrss) after one step, in bench.md (npu_lora.bench.peak_rss)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--title")
    parser.add_argument("--out", metavar="DIR", default="bench-out")


def config_from_args(args: argparse.Namespace):
    from npu_lora.bench.harness import BenchConfig

    dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(args.host_dtype, args.host_dtype)
    return BenchConfig(
        preset=args.preset or (None if args.config else "tiny-qwen3-moe"),
        config=args.config,
        layers=args.layers,
        seq_len=args.seq_len,
        batch=args.batch,
        hot_fraction=args.hot_fraction,
        hot_warmup_steps=args.hot_warmup_steps,
        warmup=args.warmup,
        steps_per_round=args.steps_per_round,
        rounds=args.rounds,
        host_dtype=dtype,
        backend=args.backend,
        threads=args.threads,
        experts_impl=args.experts_impl,
        variants=[v.strip() for v in args.variants.split(",") if v.strip()],
        baseline=args.baseline,
        peers=args.peers,
        peer_impls=[v.strip() for v in args.peer_impls.split(",") if v.strip()],
        limits=args.limits,
        memory=args.memory,
        layer_probe=args.layer_probe,
        answer_tokens=args.answer_tokens,
        peak_rss=args.peak_rss,
        seed=args.seed,
        out=args.out,
        title=args.title,
    )


_ROOFLINE_DTYPES = ("float32", "bfloat16", "int8", "float8_e4m3fn")


def _roofline_dtypes(text: str) -> str:
    bad = [d for d in (x.strip() for x in text.split(",")) if d and d not in _ROOFLINE_DTYPES]
    if bad or not text.strip(" ,"):
        raise argparse.ArgumentTypeError(
            f"--roofline-dtypes: {bad or text!r} not among {', '.join(_ROOFLINE_DTYPES)}"
        )
    return text


def run(args: argparse.Namespace) -> int:
    from npu_lora.api.outpaths import check_out_dir
    from npu_lora.bench.harness import run_bench
    from npu_lora.commands.common import CommandError

    check_out_dir(Path(args.roofline or args.out), "--roofline" if args.roofline else "--out")
    if args.roofline:
        from npu_lora.bench.roofline import run_roofline

        dtypes = tuple(d.strip() for d in args.roofline_dtypes.split(",") if d.strip())
        run_roofline(
            out=args.roofline,
            threads=args.threads,
            dtypes=dtypes,
            log=lambda s: print(s, flush=True),
        )
        return 0
    try:
        cfg = config_from_args(args)
        run_bench(cfg, log=lambda s: print(s, flush=True))
    except ValueError as e:
        raise CommandError(str(e)) from e
    return 0
