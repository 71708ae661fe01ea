"""Using a finished run's adapter: load (base verified + adapter), score, generate.

``load_run`` (:mod:`npu_lora.inference.load`) is shared by ``npu-lora predict``, ``chat`` and
``export``; :mod:`npu_lora.inference.forward` runs the engine forward without backward;
:mod:`npu_lora.inference.generate` generates with the KV cache.
"""

from npu_lora.inference.load import ADAPTERS, LoadedRun, RunDirError, check_run_dir, load_run

__all__ = ["ADAPTERS", "LoadedRun", "RunDirError", "check_run_dir", "load_run"]
