"""``npu-lora compile-plan FILE``: every device graph the run compiles, with its content key.

Torch-free (the plan is :mod:`npu_lora.compile.plan`). ``--json`` prints the whole plan;
``--cache DIR`` also says which keys are already in the graph cache.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from npu_lora.api import backends as registry
from npu_lora.commands.common import CommandError, add_overrides


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="MoEFinetune manifest or bare spec (YAML)")
    add_overrides(parser)
    parser.add_argument(
        "--backend",
        choices=sorted(registry.names()),
        default=None,
        help="plan for this backend (default: spec.device.backend; auto: furiosa with cards, "
        "else cpu)",
    )
    parser.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="the model's config.json (default: the preset's, or spec.model.path/config.json)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="graph cache root: mark each graph present/missing (default: NPU_LORA_COMPILE_CACHE)",
    )


def load_plan(
    file: Path, overrides: list[str], backend: str | None, model_config: Path | None = None
):
    from npu_lora.api.load import SpecError, load_manifest
    from npu_lora.compile.plan import compile_plan

    manifest = load_manifest(file, overrides)
    cfg = None
    if model_config is not None:
        from npu_lora.api.memory import text_config

        try:
            doc = json.loads(model_config.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise SpecError(f"--model-config: {model_config} is not UTF-8 JSON") from None
        except ValueError as e:
            raise SpecError(f"--model-config: {model_config} is not valid JSON ({e})") from None
        except OSError as e:
            raise SpecError(f"--model-config: {model_config}: {e.strerror or e}") from None
        if not isinstance(doc, dict):
            raise SpecError(f"--model-config: {model_config} is not a JSON object")
        cfg = text_config(doc, manifest.spec.model.layers)
    return compile_plan(manifest.spec, backend=backend, cfg=cfg)


def run(args: argparse.Namespace) -> int:
    from npu_lora.api.load import SpecError
    from npu_lora.compile import cache
    from npu_lora.compile.plan import format_plan

    try:
        plan = load_plan(args.file, args.overrides, args.backend, args.model_config)
    except (SpecError, ValueError, OSError) as e:
        raise CommandError(str(e)) from e
    root = args.cache or cache.cache_root()
    doc = plan.to_dict()
    if root is not None:
        hits = cache.lookup(root, plan.keys)
        for g in doc["graphs"]:
            g["present"] = hits[g["key"]]
        doc["cache"] = {"root": str(root), "present": sum(hits.values()), "total": len(hits)}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(format_plan(plan))
    if root is not None:
        c = doc["cache"]
        print(f"cache {c['root']}: {c['present']}/{c['total']} present")
        missing = [g["name"] for g in doc["graphs"] if not g["present"]]
        if missing:
            print("missing: " + ", ".join(missing))
    return 0
