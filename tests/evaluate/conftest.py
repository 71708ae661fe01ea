"""Fixtures of the evaluation tests: the engine tests' own (tiny model, CPU backend,
deterministic), loaded from ``tests/engine/conftest.py`` so there is one definition."""

import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "engine" / "conftest.py"
_spec = importlib.util.spec_from_file_location("_npu_lora_engine_fixtures", _path)
assert _spec is not None and _spec.loader is not None
_engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_engine)

deterministic = _engine.deterministic
tiny = _engine.tiny
