"""Proving the RNGD path without an NPU.

- ``inventory``: a pure-torch op inventory of a device graph's forward and backward (any torch
  >= 2.10), flagging int64 tensor ops and ops RNGD's compiler rejects.
- ``check``: ``npu-lora rngd-check`` (arguments: ``npu_lora.commands.rngd_check``): inventory, per-op compile probes and whole-graph compiles
  of every device graph with furiosa-torch's compiler on the CPU (needs the RNGD venv built by
  ``scripts/rngd-env.sh``).
- ``catalogue``: the engine's device graphs with example inputs and stock references (the
  check's default source).
- ``formulations``: compile-friendly equivalents of ops RNGD rejects.

Importing this package imports neither torch nor furiosa-torch.
"""
