"""Using a finished run's adapter: load (base verified + adapter), score, generate.

``load_run`` (:mod:`npu_lora.inference.load`) is shared by ``npu-lora predict``, ``chat`` and
``export``; :mod:`npu_lora.inference.predict` turns :mod:`npu_lora.evaluate`'s scores into
per-row records; :mod:`npu_lora.inference.generate` generates with the KV cache;
:mod:`npu_lora.inference.export` merges and writes a Hugging Face directory.
"""

from npu_lora.inference.load import ADAPTERS, LoadedRun, RunDirError, check_run_dir, load_run

__all__ = ["ADAPTERS", "LoadedRun", "RunDirError", "check_run_dir", "load_run"]
