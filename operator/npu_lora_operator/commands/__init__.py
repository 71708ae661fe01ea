"""``npu-lora`` subcommands of the operator side: ``crd``, ``operator``, ``sandbox``.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and imports nothing heavy
at module level (never torch).
"""
