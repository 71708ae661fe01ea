"""Loading checkpoints with 8-bit host experts (``npu_lora.models.q8_load``): a bf16 checkpoint
quantised expert by expert, a fine-grained FP8 checkpoint (``quant_method: fp8``,
``weight_block_size``, ``*.weight_scale_inv``) and a compressed-tensors FP8 checkpoint (per-channel
``*.weight_scale``), each a tiny preset written per expert as checkpoints on disk store them
(``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``); other quantisations refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from npu_lora.api.load import SpecError
from npu_lora.models import quant
from train_helpers import records, run_in_process, tiny_manifest

QUANTISED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _base_state() -> tuple[dict[str, torch.Tensor], dict]:
    from npu_lora.api.v1alpha1 import ModelSpec
    from npu_lora.models.build import load_base_model

    model = load_base_model(ModelSpec(preset="tiny-qwen3-moe"), seed=0)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("experts.gate_up_proj"):
            pfx = k[: -len("gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                sd[f"{pfx}{e}.gate_proj.weight"] = v[e, :inter].clone()
                sd[f"{pfx}{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith("experts.down_proj"):
            pfx = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                sd[f"{pfx}{e}.down_proj.weight"] = v[e].clone()
        else:
            sd[k] = v.clone()
    return sd, model.config.to_dict()


def _fp8_block(w: torch.Tensor, block: tuple[int, int]):
    q, s = quant.quantize_expert(w, quant.Format("fp8", torch.float8_e4m3fn, block, 448.0))
    return q, s


def write_checkpoint(d: Path, layout: str, block: int = 32) -> Path:
    """A tiny-preset checkpoint directory: ``bf16``, ``fp8`` (fine-grained, ``block`` x
    ``block``) or ``ct`` (compressed-tensors, per channel)."""
    from safetensors.torch import save_file

    sd, cfg = _base_state()
    out = {}
    for k, v in sd.items():
        mod = k.rsplit(".", 2)[-2] if k.endswith(".weight") else ""
        if layout != "bf16" and mod in QUANTISED:
            base = k[: -len("weight")]
            if layout == "fp8":
                q, s = _fp8_block(v, (block, block))
                out[k], out[base + "weight_scale_inv"] = q, s
            else:
                q, s = _fp8_block(v, (1, 0))
                out[k], out[base + "weight_scale"] = q, s.reshape(-1, 1).bfloat16()
        else:
            out[k] = v.bfloat16().contiguous()
    d.mkdir(parents=True, exist_ok=True)
    save_file(out, str(d / "model.safetensors"))
    cfg["dtype"] = "bfloat16"
    cfg.pop("torch_dtype", None)
    if layout == "fp8":
        cfg["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [block, block],
        }
    elif layout == "ct":
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "symmetric": True,
                        "strategy": "channel",
                        "dynamic": False,
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "token",
                        "dynamic": True,
                    },
                }
            },
            "ignore": ["lm_head", "re:.*mlp.gate$"],
        }
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    from npu_lora.data.tokenizer import byte_level_tokenizer

    byte_level_tokenizer().save_pretrained(str(d))  # what the preset runs with
    return d


def _load(path: Path, fmt: str):
    from npu_lora.api.v1alpha1 import ModelSpec
    from npu_lora.models.build import load_base_model, moe_blocks

    m = load_base_model(
        ModelSpec(path=str(path)), seed=0, dtype=torch.bfloat16,
        experts_implementation="npu_lora_stream", quantize=fmt,
    )  # fmt: skip
    return m, moe_blocks(m)


@pytest.mark.parametrize(
    ("layout", "fmt", "source"),
    [
        ("bf16", "int8", "quantised at load"),
        ("bf16", "float8_e4m3fn", "quantised at load"),
        ("fp8", "float8_e4m3fn", "bytes kept"),
        ("fp8", "int8", "re-quantised"),
        ("ct", "float8_e4m3fn", "bytes kept"),
    ],
)
def test_checkpoint_layouts_load(tmp_path, layout, fmt, source):
    from npu_lora.moe import stream

    stream.register()
    ck = write_checkpoint(tmp_path / "ck", layout)
    model, blocks = _load(ck, fmt)
    ex = blocks[0].experts
    assert ex.gate_up_proj.dtype == quant.FORMATS[fmt].dtype
    assert source in ex.quant_source
    ref, _ = _base_state()
    # the experts dequantised are the checkpoint's weights within the format's error
    w = quant.dequantized(ex, "gate_up_proj", None, torch.float32)
    inter = w.shape[1] // 2
    g = ref["model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert (w[3, :inter] - g).abs().max() <= g.abs().max() * 0.07
    if layout == "fp8" and fmt == "float8_e4m3fn":  # the bytes as they were written
        q, _ = _fp8_block(g, (32, 32))
        assert torch.equal(ex.gate_up_proj[3, :inter].view(torch.uint8), q.view(torch.uint8))
        assert quant.block_of(ex) == (32, 32)
    if layout == "ct" and fmt == "float8_e4m3fn":
        assert quant.block_of(ex) == (1, 0)
    # non-expert weights dequantised / read in the model dtype
    qp = model.model.layers[0].self_attn.q_proj.weight
    assert qp.dtype == torch.bfloat16
    rq = ref["model.layers.0.self_attn.q_proj.weight"]
    assert (qp.float() - rq).abs().max() <= rq.abs().max() * 0.07
    # the rotary buffers were rebuilt (not left uninitialised by to_empty)
    rot = model.model.rotary_emb
    assert torch.isfinite(rot.inv_freq).all() and rot.inv_freq[0] == 1.0


@pytest.mark.parametrize("layout", ["fp8", "ct"])
def test_run_from_fp8_checkpoint_trains_and_resumes(tmp_path, layout):
    ck = write_checkpoint(tmp_path / "ck", layout)
    cfg = tiny_manifest(
        tmp_path,
        model={"path": str(ck), "preset": None},
        moe={"placement": "hot", "warmupSteps": 2, "hostDtype": "float8_e4m3fn"},
        training={"steps": 5},
        checkpoint={"everySteps": 2},
    )
    out = tmp_path / "run"
    assert run_in_process(cfg, out, "--steps", "3") == 0
    assert run_in_process(cfg, out) == 0  # resumes
    assert [r["step"] for r in records(out)] == [1, 2, 3, 4, 5]
    host = json.loads((out / "summary.json").read_text())["machine"]["host"]
    assert "bytes kept" in host["layout"]


def test_other_quantisations_are_refused(tmp_path):
    ck = write_checkpoint(tmp_path / "ck", "bf16")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=r"config\.json.*gptq"):
        _load(ck, "int8")
    run = tiny_manifest(
        tmp_path, model={"path": str(ck), "preset": None}, moe={"hostDtype": "int8"}
    )
    assert run_in_process(run, tmp_path / "run") == 2


def test_fp8_checkpoint_needs_an_8bit_host_dtype(tmp_path):
    ck = write_checkpoint(tmp_path / "ck", "fp8")
    from npu_lora.api.v1alpha1 import ModelSpec
    from npu_lora.models.build import load_base_model

    with pytest.raises(SpecError, match="hostDtype: float8_e4m3fn"):
        load_base_model(ModelSpec(path=str(ck)), seed=0, dtype=torch.bfloat16)


@pytest.mark.parametrize(("layout", "fmt"), [("bf16", "int8"), ("fp8", "float8_e4m3fn")])
def test_releasing_the_mapped_files_between_experts_loads_the_same_bytes(
    tmp_path, monkeypatch, layout, fmt
):
    """The loader reopens the checkpoint files every ``RELEASE_EXPERTS`` experts (the pages a
    ``safe_open`` mapping has read stay in the process's RSS until it is dropped): releasing
    after every expert loads bit for bit what one mapping for the whole load does."""
    from npu_lora.models import q8_load
    from npu_lora.moe import stream

    stream.register()
    ck = write_checkpoint(tmp_path / "ck", layout)
    releases = []
    real = q8_load._Reader.release

    def counted(self):
        releases.append(len(self._touched))
        real(self)

    monkeypatch.setattr(q8_load._Reader, "release", counted)
    monkeypatch.setattr(q8_load, "RELEASE_EXPERTS", 1)
    _, every = _load(ck, fmt)
    n_every = len(releases)
    monkeypatch.setattr(q8_load, "RELEASE_EXPERTS", 1 << 30)
    _, once = _load(ck, fmt)
    E = every[0].experts.gate_up_proj.shape[0]
    assert n_every - (len(releases) - n_every) == len(every) * E  # + one a layer either way
    # every expert's release reopened the file it had read (the layer's last one: nothing left)
    assert sum(1 for r in releases[:n_every] if r) == len(every) * E
    for a, b in zip(every, once, strict=True):
        for name in ("gate_up_proj", "down_proj"):
            pa, pb = getattr(a.experts, name), getattr(b.experts, name)
            assert torch.equal(pa.view(torch.uint8), pb.view(torch.uint8))
            sa, sb = getattr(a.experts, name + "_scale"), getattr(b.experts, name + "_scale")
            assert torch.equal(sa, sb)
