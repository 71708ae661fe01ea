"""The whole engine: exact decomposition vs a plain peft model, training, saving, loading."""

from __future__ import annotations

import json

import pytest
import torch
from npu_lora.api.v1alpha1 import LoraSpec, ModelSpec
from npu_lora.engine import StepProfile, build_engine
from npu_lora.models import build_model, decoder_layers, load_base_model


@pytest.mark.parametrize("placement", ["host-only", "hot"])
def test_engine_equals_plain_peft(tiny, placement):
    """Engine loss and LoRA grads == ``PeftModel(input_ids, attention_mask, labels).loss``
    (stock transformers forward: full logits, HF shift, F.cross_entropy) on the same weights."""
    spec = tiny.spec(moe={"placement": placement, "warmupSteps": 0})
    eng = build_engine(spec)
    tiny.randomize_lora(eng.model)
    eng.select_hot_experts(0)
    plain, _ = build_model(spec.model, spec.lora, seed=spec.training.seed)
    plain.load_state_dict(eng.model.state_dict())  # HostMLP keeps the parameter names
    batch = tiny.batch()
    prof = eng.forward_backward(batch)
    plain.train()
    out = plain(**batch)
    out.loss.backward()
    assert abs(prof.loss - out.loss.item()) < 1e-5
    ref = dict(plain.named_parameters())
    n = 0
    for name, p in eng.adapter.named_parameters():
        torch.testing.assert_close(p.grad, ref[name].grad, rtol=1e-4, atol=1e-6)
        n += 1
    assert n == 4 * len(decoder_layers(plain))  # q_proj, v_proj × lora_A, lora_B


def test_cpu_backend_head_streams_its_weight_and_equals_plain_peft(tiny, monkeypatch):
    """On the ``cpu`` backend the frozen LM head at the label positions (2 rows x 8 labels) runs
    the streaming kernel (``Backend.frozen_linear``); loss and LoRA grads still equal plain
    peft's (stock ``lm_head`` over full logits)."""
    from npu_lora.moe import stream_linear

    used = []
    usable = stream_linear.usable
    monkeypatch.setattr(stream_linear, "usable", lambda x, w: used.append(usable(x, w)) or used[-1])
    spec = tiny.spec()
    eng = build_engine(spec)
    tiny.randomize_lora(eng.model)
    plain, _ = build_model(spec.model, spec.lora, seed=spec.training.seed)
    plain.load_state_dict(eng.model.state_dict())
    batch = tiny.batch(answer=8)
    prof = eng.forward_backward(batch)
    assert used == [True]
    plain.train()
    out = plain(**batch)
    out.loss.backward()
    assert abs(prof.loss - out.loss.item()) < 1e-5
    ref = dict(plain.named_parameters())
    for name, p in eng.adapter.named_parameters():
        torch.testing.assert_close(p.grad, ref[name].grad, rtol=1e-4, atol=1e-6)


def test_loss_scale_and_accumulation(tiny):
    eng = build_engine(tiny.spec())
    tiny.randomize_lora(eng.model)
    b = tiny.batch()
    eng.forward_backward(b, loss_scale=0.5)
    eng.forward_backward(b, loss_scale=0.5)
    acc = [p.grad.clone() for p in eng.adapter.parameters()]
    for p in eng.adapter.parameters():
        p.grad = None
    eng.forward_backward(b)
    for a, p in zip(acc, eng.adapter.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "moe", [{"placement": "hot", "warmupSteps": 2, "keepGraph": False}, {"hostDtype": "bfloat16"}]
)
def test_adamw_reduces_loss(tiny, moe):
    spec = tiny.spec(moe=moe, training={"learningRate": 1e-2})
    eng = build_engine(spec)
    opt = torch.optim.AdamW(eng.adapter.parameters(), lr=spec.training.learning_rate)
    batch = tiny.batch()
    losses = []
    for step in range(1, 9):
        prof = eng.forward_backward(batch)
        assert isinstance(prof, StepProfile) and prof.tokens == 64
        assert prof.host_fwd_s > 0 and prof.host_bwd_s > 0 and prof.attn_head_s > 0
        opt.step()
        opt.zero_grad(set_to_none=True)
        eng.hotset.sync_weights()
        eng.select_hot_experts(step)
        losses.append(prof.loss)
    assert losses[-1] < losses[0] - 0.5, losses
    json.dumps(prof.to_dict())


def test_save_adapter_and_state_dict(tiny, tmp_path):
    eng = build_engine(tiny.spec(lora={"trainExperts": True, "r": 4}))
    tiny.randomize_lora(eng.model)
    eng.adapter.save(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    from safetensors.torch import load_file

    experts = load_file(str(tmp_path / "adapter" / "experts.safetensors"))
    assert set(experts) == {
        f"model.layers.{i}.mlp.experts.{n}" for i in range(2) for n in ("gate_up_proj", "down_proj")
    }
    sd = eng.adapter.state_dict()
    eng2 = build_engine(tiny.spec(lora={"trainExperts": True, "r": 4}, training={"seed": 1}))
    eng2.load_adapter_state_dict(sd)
    for k, v in eng2.adapter.state_dict().items():
        assert torch.equal(v, sd[k])


def test_vocab_grows_and_local_sharded_dir_with_layer_override(tmp_path):
    base = load_base_model(ModelSpec(preset="tiny-qwen3-moe"), seed=0, vocab_size=700)
    assert base.config.vocab_size == 700 and base.lm_head.weight.shape[0] == 700
    base.save_pretrained(str(tmp_path / "m"), max_shard_size="200KB")
    assert (tmp_path / "m" / "model.safetensors.index.json").is_file()
    model, cfg = build_model(ModelSpec(path=str(tmp_path / "m"), layers=1), LoraSpec(), seed=5)
    assert cfg.num_hidden_layers == 1 and len(decoder_layers(model)) == 1
    only1 = load_base_model(ModelSpec(path=str(tmp_path / "m"), layers=1), seed=5)
    got = dict(only1.named_parameters())
    assert len(got) < len(dict(base.named_parameters()))
    for name, p in base.named_parameters():
        if name.startswith("model.layers.1."):
            continue
        assert torch.equal(got[name], p), name
    assert model.get_base_model().config._attn_implementation == "eager"


def test_local_dir_per_expert_checkpoint(tmp_path):
    """A checkpoint in the original Qwen3-MoE layout (one tensor per expert and projection,
    sharded with an index) loads into the fused 3-D experts (transformers' conversion), and
    ``layers`` keeps only the first N layers."""
    from safetensors.torch import save_file

    base = load_base_model(ModelSpec(preset="tiny-qwen3-moe"), seed=0)
    sd = base.state_dict()
    legacy = {}
    for k, v in sd.items():
        if k.endswith("experts.gate_up_proj"):
            pre, inter = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                legacy[f"{pre}{e}.gate_proj.weight"] = v[e, :inter].clone()
                legacy[f"{pre}{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                legacy[f"{k[: -len('down_proj')]}{e}.down_proj.weight"] = v[e].clone()
        else:
            legacy[k] = v.clone()
    d = tmp_path / "qwen3-legacy"
    base.config.save_pretrained(str(d))
    keys = sorted(legacy)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file(
            {k: legacy[k].contiguous() for k in part}, str(d / fname), metadata={"format": "pt"}
        )
        weight_map.update(dict.fromkeys(part, fname))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    model = load_base_model(ModelSpec(path=str(d), layers=1), seed=3)
    got = model.state_dict()
    assert model.config.num_hidden_layers == 1
    assert all(torch.equal(got[k], sd[k]) for k in got)


def test_copying_backend_same_result(tiny):
    """A backend whose transfers really copy (like a device): same loss and gradients as the
    cpu backend bitwise, the kept graphs are still reused, and the transfer gradients flow."""
    from npu_lora.backends import CpuBackend

    class CopyBackend(CpuBackend):
        name = "copy"

        def _copy_to_device(self, t: torch.Tensor) -> torch.Tensor:
            return t.clone()

        def _copy_to_host(self, t: torch.Tensor) -> torch.Tensor:
            return t.clone()

    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 0})
    res = []
    for be in (CpuBackend(), CopyBackend()):
        eng = build_engine(spec, backend=be)
        tiny.randomize_lora(eng.model)
        eng.select_hot_experts(0)
        prof = eng.forward_backward(tiny.batch())
        assert prof.device_calls_per_layer == 2.0
        assert all(m.reused == 1 and m.recomputed == 0 for m in eng.mlps)
        res.append((prof.loss, [p.grad for p in eng.adapter.parameters()]))
    assert res[0][0] == res[1][0]
    assert all(torch.equal(a, b) for a, b in zip(res[0][1], res[1][1], strict=True))


def test_host_dtype_split_for_local_bf16_dir(tmp_path):
    """A bf16 checkpoint with hostDtype bfloat16: MoE blocks stay bf16 on the host, the rest
    (and LoRA) is fp32; rotary frequencies are the fp32 ones."""
    from npu_lora.models import causal_lm, moe_blocks

    base = load_base_model(ModelSpec(preset="tiny-qwen3-moe"), seed=0)
    inv_freq = base.model.rotary_emb.inv_freq.clone()
    base.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    model, _ = build_model(
        ModelSpec(path=str(tmp_path / "bf16")), LoraSpec(), seed=0, host_dtype="bfloat16"
    )
    lm = causal_lm(model)
    blocks = moe_blocks(model)
    assert all(p.dtype == torch.bfloat16 for b in blocks for p in b.parameters())
    host = {id(p) for b in blocks for p in b.parameters()}
    assert all(p.dtype == torch.float32 for p in model.parameters() if id(p) not in host)
    assert torch.equal(lm.model.rotary_emb.inv_freq, inv_freq)
