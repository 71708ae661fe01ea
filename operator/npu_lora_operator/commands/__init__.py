"""``npu-lora`` subcommands of the operator side: ``crd``, ``operator`` (``sandbox`` lives in
:mod:`npu_lora_sandbox.command`).

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and imports nothing heavy
at module level (never torch).
"""
