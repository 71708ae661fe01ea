"""Rebuild a finished run's model from its run directory: base (verified) + trained adapter.

``load_run(RUN_DIR)`` reads ``config.yaml`` (the resolved manifest), rebuilds the engine exactly
as ``npu-lora run`` did (same tokenizer, preset or model path, layers, dtypes, seed: the base
weights of a preset come from the seed), checks the base against the fingerprint the run recorded
(:mod:`npu_lora.models.fingerprint`; a mismatch is an error, exit 2) and loads the trained weights
from ``adapter/`` (peft ``save_pretrained``; ``experts.safetensors`` too when the run trained the
experts), ``adapter-best/`` or ``checkpoint/`` (``params.safetensors``). Nothing is unpickled: a peft
adapter saved as ``adapter_model.bin`` (pickle) is refused, naming the file. The engine is put in eval mode,
placement host-only, no gradients: attention and head on the device, every expert on the host.

Errors a user can fix (missing files, a base that differs) raise :class:`RunDirError` (exit 2).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npu_lora.api.load import SpecError

#: ``--adapter`` choices: directories of a run directory.
ADAPTERS = ("adapter", "adapter-best", "checkpoint")
CONFIG = "config.yaml"


class RunDirError(SpecError):
    """A run directory that cannot be used (exit 2); ``str()`` names what is missing or wrong."""


@dataclass
class LoadedRun:
    run_dir: Path
    manifest: Any  # MoEFinetune
    tokenizer: Any
    engine: Any  # HybridEngine
    adapter: Path
    #: how the base was checked: ``verified sha256-...:<digest>`` or why it was not
    base_check: str

    @property
    def spec(self) -> Any:
        return self.manifest.spec

    @property
    def model(self) -> Any:
        """The peft model (LoRA active; ``with model.disable_adapter():`` for the base)."""
        return self.engine.model


def _has_peft_weights(path: Path) -> bool:
    return (path / "adapter_config.json").is_file() and (
        path / "adapter_model.safetensors"
    ).is_file()


def refuse_pickle_adapter(path: Path) -> None:
    """RunDirError when ``path`` holds a peft adapter only as pickle (``adapter_model.bin``)."""
    pickled = path / "adapter_model.bin"
    if pickled.exists() and not (path / "adapter_model.safetensors").is_file():
        raise RunDirError(
            f"--adapter: {pickled}: a pickle adapter (which can run code when read) is never "
            "loaded; only adapter_model.safetensors is (peft: save_pretrained(..., "
            "safe_serialization=True))"
        )


def check_run_dir(run_dir: Path, adapter: str = "adapter") -> Path:
    """The adapter directory to load; raises RunDirError naming what is missing. Reads nothing
    but directory entries."""
    if not run_dir.is_dir():
        raise RunDirError(f"RUN_DIR: no such directory: {run_dir}")
    if not (run_dir / CONFIG).is_file():
        raise RunDirError(
            f"RUN_DIR: {run_dir} has no {CONFIG} (not an npu-lora run directory; "
            "`npu-lora run FILE.yaml --out DIR` makes one)"
        )
    if adapter not in ADAPTERS:
        raise RunDirError(f"--adapter: {adapter!r} is not one of {', '.join(ADAPTERS)}")
    path = run_dir / adapter
    if adapter == "checkpoint":
        from npu_lora.train.checkpoint import find_checkpoint

        found = find_checkpoint(run_dir)
        if found is None:
            raise RunDirError(f"--adapter checkpoint: {run_dir} has no complete checkpoint/")
        return found[0]
    if not path.is_dir():
        hint = (
            " (the run has not finished: try --adapter checkpoint)"
            if adapter == "adapter"
            else " (written only by runs with spec.eval)"
        )
        raise RunDirError(f"--adapter {adapter}: {run_dir} has no {adapter}/{hint}")
    refuse_pickle_adapter(path)
    if not _has_peft_weights(path):
        raise RunDirError(
            f"--adapter {adapter}: {path} has no adapter_config.json + adapter_model.safetensors "
            "(an incomplete peft adapter directory)"
        )
    return path


def load_config(run_dir: Path, overrides: list[str] | None = None) -> Any:
    """The run's manifest (``config.yaml``) with ``--set`` overrides (e.g. a moved model path)."""
    from npu_lora.api.load import load_manifest

    try:
        return load_manifest(run_dir / CONFIG, list(overrides or []))
    except SpecError as e:
        raise RunDirError(f"RUN_DIR: {run_dir / CONFIG}: {e}") from None


def recorded_fingerprint(run_dir: Path, adapter_dir: Path) -> dict[str, Any] | None:
    """The base fingerprint the run recorded: in the adapter directory, else ``adapter/``,
    else ``summary.json``; None for a run made before fingerprints existed."""
    from npu_lora.models.fingerprint import FILE

    for p in (adapter_dir / FILE, run_dir / "adapter" / FILE):
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if _is_fingerprint(d):
            return d
    try:
        d = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        fp = d.get("base_fingerprint") if isinstance(d, dict) else None
        return fp if _is_fingerprint(fp) else None
    except (OSError, ValueError, RecursionError):
        return None


def _is_fingerprint(d: Any) -> bool:
    """A fingerprint record as the run writes it (a file edited by hand counts as none)."""
    return (
        isinstance(d, dict)
        and isinstance(d.get("digest"), str)
        and bool(d["digest"])
        and isinstance(d.get("algorithm"), str)
    )


def verify_base(recorded: dict[str, Any] | None, now: dict[str, Any], source: str) -> str:
    """Compare the rebuilt base's fingerprint with the recorded one (RunDirError on a mismatch)."""
    if recorded is None:
        msg = (
            f"the run in {source} recorded no base fingerprint (made before npu-lora recorded "
            "one): the rebuilt base is NOT verified"
        )
        print(f"warning: {msg}", file=sys.stderr)
        return "not verified: " + msg
    if recorded.get("algorithm") != now["algorithm"]:
        msg = f"fingerprint algorithm {recorded.get('algorithm')!r} unknown: NOT verified"
        print(f"warning: {msg}", file=sys.stderr)
        return "not verified: " + msg
    if recorded["digest"] != now["digest"]:
        raise RunDirError(
            f"the rebuilt base model differs from the one the adapter in {source} was trained on "
            f"(base fingerprint {now['digest'][:16]}… over {now['tensors']} tensors, recorded "
            f"{recorded['digest'][:16]}… over {recorded.get('tensors')}): another model "
            "directory, preset, layers, dtype, seed, tokenizer or torch version. Point "
            "--set model.path=... at the original weights, or use the original environment."
        )
    return f"verified {now['algorithm']}:{now['digest'][:16]}"


def load_trained_weights(engine: Any, adapter_dir: Path) -> None:
    """Copy the trained weights of ``adapter_dir`` (peft directory or checkpoint) into the
    engine's model (its freshly initialised LoRA, and the experts when they were trained)."""
    import torch

    if (adapter_dir / "params.json").is_file() and not _has_peft_weights(adapter_dir):
        from npu_lora.train.checkpoint import load_tree

        saved = load_tree(adapter_dir / "params")
        engine.load_adapter_state_dict(dict(zip(saved["names"], saved["tensors"], strict=True)))
        return
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    refuse_pickle_adapter(adapter_dir)
    state = load_file(str(adapter_dir / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(engine.model, state)
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    unexpected = list(getattr(result, "unexpected_keys", []))
    if missing or unexpected:
        raise RunDirError(
            f"--adapter: {adapter_dir} does not fit the run's LoRA config (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]})"
        )
    from npu_lora.engine.hybrid import EXPERTS_FILE

    experts = adapter_dir / EXPERTS_FILE
    if experts.is_file():
        from safetensors import SafetensorError

        try:
            tensors = load_file(str(experts))
            with torch.no_grad():
                for key, t in tensors.items():
                    i, name = int(key.split(".")[2]), key.rsplit(".", 1)[1]
                    p = getattr(engine.mlps[i].experts, name)
                    if not isinstance(p, torch.Tensor) or tuple(p.shape) != tuple(t.shape):
                        raise ValueError(f"{key}: not an expert weight of this model's shape")
                    p.copy_(t.to(p.device, p.dtype))
        except (OSError, SafetensorError, ValueError, IndexError, AttributeError) as e:
            # a file edited or planted by hand: named, never a traceback
            raise RunDirError(
                f"--adapter: {experts} does not fit the run's model ({type(e).__name__}: "
                f"{str(e)[:200]})"
            ) from None


def load_run(
    run_dir: str | Path,
    *,
    adapter: str = "adapter",
    overrides: list[str] | None = None,
    backend: str | None = None,
) -> LoadedRun:
    """Rebuild the run's engine (see the module doc); RunDirError / SpecError on bad input."""
    run_dir = Path(run_dir).expanduser()
    adapter_dir = check_run_dir(run_dir, adapter)
    manifest = load_config(run_dir, overrides)
    spec = manifest.spec
    from npu_lora.data import load_tokenizer
    from npu_lora.train.preflight import check_model

    check_model(spec)
    tok = load_tokenizer(spec.model)
    from npu_lora.data.tokenizer import ensure_chat_template

    tok = ensure_chat_template(tok)

    from npu_lora.engine import EngineMode, build_engine
    from npu_lora.train.loop import seed_everything

    seed_everything(spec.training.seed)  # as `npu-lora run` does before building
    engine = build_engine(spec, vocab_size=len(tok), backend=backend)
    base_check = verify_base(
        recorded_fingerprint(run_dir, adapter_dir), engine.adapter.fingerprint, str(run_dir)
    )
    load_trained_weights(engine, adapter_dir)
    engine.modes.set(EngineMode("host-only", keep_graph=False, overlap=False))
    engine.model.eval()
    for p in engine.model.parameters():
        p.requires_grad_(False)
    return LoadedRun(run_dir, manifest, tok, engine, adapter_dir, base_check)
