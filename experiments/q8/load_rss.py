"""Peak host memory of loading a checkpoint with 8-bit host experts (models/q8_load.py) against
the bf16 load and against api.memory's estimate of the weights.

A bf16 checkpoint at Qwen3-30B-A3B widths (E=128, H=2048, I=768, top-8) at reduced depth
(--layers) and a small vocabulary (--vocab, so that the experts dominate) is written per expert
(``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``, one shard per layer), then loaded
in a fresh process per variant (``load_base_model(..., quantize=...)``) while a thread samples
/proc/self/status: VmHWM (peak RSS, includes the mmapped safetensors pages read) and the peak of
RssAnon (anonymous memory: the tensors the process holds). Prints one JSON line per variant.

    python experiments/q8/load_rss.py --dir /tmp/q8ck --layers 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, threading, time
import torch
from pathlib import Path

peak = {"anon": 0}
stop = False
def status():
    out = {}
    for line in open("/proc/self/status"):
        k, v = line.split(":", 1)
        if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) * 1024
    return out
def sample():
    while not stop:
        peak["anon"] = max(peak["anon"], status().get("RssAnon", 0))
        time.sleep(0.005)
base = status()
th = threading.Thread(target=sample, daemon=True); th.start()
from npu_lora.api.v1alpha1 import ModelSpec
from npu_lora.models.build import load_base_model
from npu_lora.moe import experts as ex
ex.register()
fmt = sys.argv[2]
t0 = time.perf_counter()
m = load_base_model(ModelSpec(path=sys.argv[1]), seed=0, dtype=torch.bfloat16,
                    experts_implementation="npu_lora_stream",
                    quantize=None if fmt == "bfloat16" else fmt)
dt = time.perf_counter() - t0
stop = True; th.join()
end = status()
held = sum(p.numel() * p.element_size() for p in m.parameters()) + sum(
    b.numel() * b.element_size() for b in m.buffers())
print(json.dumps({"fmt": fmt, "load_s": dt, "base_anon": base.get("RssAnon"),
                  "peak_anon": peak["anon"], "vmhwm": end["VmHWM"], "end_anon": end["RssAnon"],
                  "model_bytes": held}))
"""


def write(d: Path, layers: int, vocab: int) -> None:
    import torch
    from safetensors.torch import save_file

    E, H, inter = 128, 2048, 768
    cfg = json.loads(
        (
            Path(__file__).resolve().parents[2]
            / "worker/npu_lora/models/configs/qwen3-30b-a3b.json"
        ).read_text()
    )
    cfg.update(num_hidden_layers=layers, vocab_size=vocab, max_window_layers=layers)
    cfg["dtype"] = "bfloat16"
    cfg.pop("torch_dtype", None)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    wm = {}

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.bfloat16).mul_(0.02)

    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    other = {
        "model.embed_tokens.weight": r(vocab, H),
        "lm_head.weight": r(vocab, H),
        "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
    }
    save_file(other, str(d / "other.safetensors"))
    wm.update(dict.fromkeys(other, "other.safetensors"))
    for i in range(layers):
        p = f"model.layers.{i}"
        t = {
            f"{p}.input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
            f"{p}.post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
            f"{p}.self_attn.q_proj.weight": r(nh * hd, H),
            f"{p}.self_attn.k_proj.weight": r(nkv * hd, H),
            f"{p}.self_attn.v_proj.weight": r(nkv * hd, H),
            f"{p}.self_attn.o_proj.weight": r(H, nh * hd),
            f"{p}.self_attn.q_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
            f"{p}.self_attn.k_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
            f"{p}.mlp.gate.weight": r(E, H),
        }
        for e in range(E):
            t[f"{p}.mlp.experts.{e}.gate_proj.weight"] = r(inter, H)
            t[f"{p}.mlp.experts.{e}.up_proj.weight"] = r(inter, H)
            t[f"{p}.mlp.experts.{e}.down_proj.weight"] = r(H, inter)
        name = f"layer{i}.safetensors"
        save_file(t, str(d / name))
        wm.update(dict.fromkeys(t, name))
        del t
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/q8ck")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--formats", default="int8,float8_e4m3fn,bfloat16")
    a = ap.parse_args()
    d = Path(a.dir)
    if not (d / "model.safetensors.index.json").is_file():
        write(d, a.layers, a.vocab)
    E, H, inter, L = 128, 2048, 768, a.layers
    for fmt in a.formats.split(","):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(d), fmt], capture_output=True, text=True, check=False
        )
        line = (out.stdout.strip().splitlines() or [out.stderr[-2000:]])[-1]
        try:
            rec = json.loads(line)
        except ValueError:
            print(json.dumps({"fmt": fmt, "error": line}))
            continue
        expert_wide = L * E * 3 * H * inter * 2
        rec["experts_bf16_bytes"] = expert_wide
        rec["anon_growth"] = rec["peak_anon"] - (rec["base_anon"] or 0)
        rec["anon_growth_over_model"] = rec["anon_growth"] / rec["model_bytes"]
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
