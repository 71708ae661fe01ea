"""The 4K-token examples: the compile plan lists the long-row graphs with their forms and keys,
and the Qwen3 example's memory is what `api.memory` (and so `keepGraph` omitted (auto)) says."""

from __future__ import annotations

import json
from pathlib import Path

from npu_lora.api.load import load_manifest
from npu_lora.api.memory import GiB, estimate, kept_graph_layers, recommended_limit, text_config
from npu_lora.compile import plan as P

from .helpers import QWEN_CONFIG

REPO = Path(__file__).resolve().parents[2]
CHAT_4K = REPO / "examples" / "qwen3-30b-a3b-chat-4k.yaml"
TINY_4K = REPO / "examples" / "tiny-chat-4k.yaml"


def _qwen_cfg() -> dict:
    return text_config(json.loads(Path(QWEN_CONFIG).read_text()))


def test_qwen3_chat_4k_plan_lists_the_long_row_graphs():
    spec = load_manifest(CHAT_4K).spec
    assert spec.training.seq_len == 4096 and spec.data.packing and spec.data.format == "chat"
    for backend, attention in (("furiosa", "eager"), ("cpu", "sdpa"), ("cuda", "sdpa")):
        plan = P.compile_plan(spec, backend=backend, cfg=_qwen_cfg())
        by = {e.name: e for e in plan.entries}
        att = by["attention"]
        assert att.params["attention"] == attention
        assert [i["shape"] for i in att.inputs][3] == [1, 1, 4096, 4096]
        heads = [e for e in plan.entries if e.graph == "DeviceHead"]
        assert [e.inputs[2]["shape"][1] for e in heads] == [2**i for i in range(13)]
        chunks = {e.inputs[2]["shape"][1]: e.params["chunk_rows"] for e in heads}
        assert all(chunks[n] == n for n in chunks if n <= 64)  # 64 × 608 KB <= 64 MiB
        assert all(chunks[n] == 64 for n in chunks if n > 64)
        blocks = {e.params.get("loss_blocks") for e in heads if e.inputs[2]["shape"][1] > 64}
        assert blocks == {"rows" if backend == "furiosa" else "vocab"}  # api.sizing
        assert all("loss_blocks" not in e.params for e in heads if e.inputs[2]["shape"][1] <= 64)
        assert len(set(plan.keys)) == len(plan.keys)
    # the forms are in the keys: the same graphs at S=512 (eager everywhere) differ in keys
    cpu = {e.name: e.key for e in P.compile_plan(spec, backend="cpu", cfg=_qwen_cfg()).entries}
    fur = {e.name: e.key for e in P.compile_plan(spec, backend="furiosa", cfg=_qwen_cfg()).entries}
    assert cpu["attention"] != fur["attention"]


def test_compile_plan_command_prints_the_long_row_forms(capsys):
    from npu_lora.cli import main

    args = ["compile-plan", str(CHAT_4K), "--model-config", QWEN_CONFIG, "--backend", "cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[attention sdpa]" in out
    assert "head_n4096" in out and "[loss in vocabulary blocks]" in out
    args[-1] = "furiosa"
    assert main(args) == 0
    assert "[loss in chunks of 64]" in capsys.readouterr().out


def test_qwen3_chat_4k_memory_is_the_estimate():
    m = load_manifest(CHAT_4K)
    spec, cfg = m.spec, _qwen_cfg()
    limit = int(str(m.spec.resources.limits["memory"]).removesuffix("Gi")) * GiB
    # the comments' figures: keepGraph auto keeps 38 of 48 layers under the 88Gi limit
    n = kept_graph_layers(spec, cfg, limit, examples=10_000, host_dtype="bfloat16")
    assert n == 38
    assert kept_graph_layers(spec, cfg, 80 * GiB, examples=10_000, host_dtype="bfloat16") == 15
    full = estimate(spec, cfg, 10_000, "bfloat16", kept_layers=48)
    assert round(full.total / GiB, 1) == 73.0
    assert recommended_limit(full) == 92 * GiB
    assert round(full.weights / GiB, 1) == 54.0
    request = int(str(m.spec.resources.requests["memory"]).removesuffix("Gi")) * GiB
    assert estimate(spec, cfg, 10_000, "bfloat16", kept_layers=n).total < request <= limit


def test_tiny_4k_example_is_long_rows_on_the_cpu():
    s = load_manifest(TINY_4K).spec
    assert s.training.seq_len == 4096 and s.data.packing and s.moe.keep_graph is None
    assert s.device.backend == "cpu" and s.model.preset == "tiny-qwen3-moe"
