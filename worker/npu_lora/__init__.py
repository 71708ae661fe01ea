"""npu-lora: LoRA fine-tuning of Mixture-of-Experts LLMs with a hybrid device/host MoE engine.

This top-level package must stay import-light (no torch): the operator image imports
``npu_lora.api`` without torch installed. Heavy modules are imported where they are used.
"""

__version__ = "0.1.0"
