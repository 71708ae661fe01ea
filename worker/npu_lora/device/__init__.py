"""Device-side modules (compile-friendly); see ``npu_lora.device.graphs``."""
