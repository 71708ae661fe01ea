"""The hybrid training engine: device attention/head + host MoE (HostMLP) + hot experts.

Public interface (stable; the training loop codes against it)::

    from npu_lora.engine import build_engine, HybridEngine, StepProfile

    engine = build_engine(spec, vocab_size=tokenizer_vocab_size)   # spec: MoEFinetuneSpec
    params = engine.trainable_parameters()                          # -> list[nn.Parameter]
    opt = torch.optim.AdamW(params, lr=...)
    engine.select_hot_experts(0)                 # before training (no-op unless warmupSteps=0)
    for step in range(1, steps + 1):
        for batch in micro_batches:              # CPU tensors, see forward_backward
            prof = engine.forward_backward(batch, loss_scale=1 / grad_accumulation)
        opt.step(); opt.zero_grad(set_to_none=True)
        engine.after_optimizer_step()
        info = engine.select_hot_experts(step)   # {} unless the hot set was chosen now
    engine.save_adapter(run_dir / "adapter")

Also: ``engine.model`` (peft model), ``engine.config`` (HF config), ``engine.backend``
(``npu_lora.backends.Backend``), ``routing_counts() -> [L, E]`` /
``load_routing_counts(counts)``, ``hot_state()`` /
``load_hot_state(state)`` (JSON-able; for checkpoints), ``hot_summary()`` (``fraction, experts,
selected_at_step, per_layer``; ``{}`` before selection), ``adapter_state_dict()`` /
``load_adapter_state_dict(sd)`` (for checkpoints), ``named_trainable_parameters()``,
``StepProfile.to_dict()``, ``engine.mode`` / ``set_mode(EngineMode(...))`` (placement,
keep_graph, overlap: one owner, checked by the engine; HostMLP reads it from there),
``build_engine(spec, hooks=...)`` / ``engine.use_hooks(hooks)`` (``EngineHooks``: the one seam
for the bench's strategies), ``engine.agree_placement_with(agree)`` (data parallel ``auto``).

Modules: ``hybrid`` (the facade: one micro-batch, evaluation), ``mode`` (``ModeControl``),
``placement`` (device placement, ``AutoPlacement``), ``hotset`` (``HotSet``: the hot experts'
lifecycle), ``state`` (``AdapterState``: trainable state and the adapter on disk), ``hooks``
(``EngineHooks``, ``DefaultHooks``), ``build`` (``build_engine``), ``profile`` (``StepProfile``).

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
