"""The hybrid training engine: device attention/head + host MoE (HostMLP) + hot experts.

Public interface (stable; the training loop codes against it)::

    from npu_lora.engine import build_engine, HybridEngine, StepProfile

    engine = build_engine(spec, vocab_size=tokenizer_vocab_size)   # spec: MoEFinetuneSpec
    params = engine.adapter.parameters()                            # -> list[nn.Parameter]
    opt = torch.optim.AdamW(params, lr=...)
    engine.select_hot_experts(0)                 # before training (no-op unless warmupSteps=0)
    for step in range(1, steps + 1):
        for batch in micro_batches:              # CPU tensors, see forward_backward
            prof = engine.forward_backward(batch, loss_scale=1 / grad_accumulation)
        opt.step(); opt.zero_grad(set_to_none=True)
        engine.hotset.sync_weights()             # device copies follow trained expert weights
        info = engine.select_hot_experts(step)   # {} unless the hot set was chosen now
    engine.adapter.save(run_dir / "adapter")

The engine is built from parts, each from its own spec section (``build_engine`` →
``assemble``), and callers talk to the part that owns the thing:

- ``engine.modes`` (:class:`~npu_lora.engine.mode.ModeControl`, ``moe.placement``,
  ``keepGraph``, ``overlap``, ``lora.trainExperts``): ``policy``, ``mode``, ``placement``,
  ``keep_graph``, ``overlap``; ``modes.set(EngineMode(...))`` switches it between steps (the
  engine frees kept graphs and parks or restores the hot set); HostMLP reads it from there.
- ``engine.hotset`` (:class:`~npu_lora.engine.hotset.HotSet`, the rest of ``moe``):
  ``routing_counts()`` / ``load_routing_counts(counts)`` (``[L, E]``), ``summary()``
  (``fraction, experts, selected_at_step, per_layer``; ``{}`` before selection), ``history``,
  ``hist_LE``, ``total``, ``memory_report()``, ``sync_weights()``, ``device_gather``.
- ``engine.adapter`` (:class:`~npu_lora.engine.state.AdapterState`, ``lora``): ``parameters()``,
  ``named_parameters()``, ``state_dict()``, ``save(path)``, ``fingerprint`` (the base's).
- ``engine.hooks`` (``EngineHooks``: the one seam for the bench's strategies;
  ``build_engine(spec, hooks=...)`` / ``engine.use_hooks(hooks)``).

The engine itself runs what joins them: ``forward_backward``, ``token_nll``,
``select_hot_experts``, ``hot_state()`` / ``load_hot_state(state)`` (the hot set + the ``auto``
trials, JSON-able, for checkpoints), ``load_adapter_state_dict(sd)`` (+ the hot copies),
``agree_placement_with(agree)`` (data parallel ``auto``), ``placement_choice()``; and it holds
``engine.model`` (peft model), ``engine.config`` (HF config), ``engine.backend``
(``npu_lora.backends.Backend``), ``StepProfile.to_dict()``.

Modules: ``hybrid`` (the engine: one micro-batch, evaluation), ``mode`` (``ModeControl``),
``placement`` (device placement, ``AutoPlacement``), ``hotset`` (``HotSet``: the hot experts'
lifecycle and the routing counts), ``state`` (``AdapterState``: trainable state and the adapter
on disk), ``hooks`` (``EngineHooks``, ``DefaultHooks``), ``build`` (``build_engine``,
``assemble``), ``profile`` (``StepProfile``).

Label convention (Hugging Face): ``labels`` has the same shape as ``input_ids``; it equals
``input_ids`` at the answer positions and ``-100`` elsewhere; the engine shifts internally:
the logits at position ``t`` predict ``labels[t + 1]``. The loss is the mean cross-entropy over
all (shifted) label positions of the micro-batch.
"""

from npu_lora.engine.build import build_engine
from npu_lora.engine.hooks import DefaultHooks, EngineHooks, HotPath
from npu_lora.engine.hybrid import HybridEngine
from npu_lora.engine.profile import HostTimes, StepProfile
from npu_lora.moe.mode import EngineMode

__all__ = [
    "DefaultHooks",
    "EngineHooks",
    "EngineMode",
    "HostTimes",
    "HotPath",
    "HybridEngine",
    "StepProfile",
    "build_engine",
]
