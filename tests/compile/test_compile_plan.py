"""The compile plan: deterministic keys, the right graphs, keys that change with the right inputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from npu_lora.compile import plan as P

from .helpers import QWEN_CONFIG, make_spec, spec_doc

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{REPO / 'worker'}:{REPO / 'operator'}"}


def keys(spec, **kw) -> dict[str, str]:
    return {e.name: e.key for e in P.compile_plan(spec, **kw).entries}


def _changed(a: dict[str, str], b: dict[str, str]) -> set[str]:
    assert a.keys() == b.keys()
    return {n for n in a if a[n] != b[n]}


def test_tiny_plan_lists_every_graph_the_engine_compiles():
    plan = P.compile_plan(make_spec())
    names = [e.name for e in plan.entries]
    # S=32: label buckets 1..32, hot buckets 8..32 (tokens 32), Eh = ceil(0.25 * 8) = 2
    assert names == [
        "embed",
        "attention",
        "head_n1",
        "head_n2",
        "head_n4",
        "head_n8",
        "head_n16",
        "head_n32",
        "hot_experts_b8",
        "hot_experts_b16",
        "hot_experts_b32",
        "hot_gathered_b32",  # cpu: Eh * Bk = 64 > T = 32
    ]
    assert [e.index for e in plan.entries] == list(range(len(names)))
    assert len(set(plan.keys)) == len(names)
    assert all(len(k) == 64 for k in plan.keys)


def test_host_only_and_furiosa_plans():
    host = [e.name for e in P.compile_plan(make_spec(moe={"placement": "host-only"})).entries]
    assert not any(n.startswith("hot") for n in host)
    fur = [e.name for e in P.compile_plan(make_spec(), backend="furiosa").entries]
    assert "hot_gathered_b32" not in fur and "hot_experts_b32" in fur  # engine: no gather on RNGD


@pytest.mark.skipif(not Path(QWEN_CONFIG).exists(), reason="needs ../shared/data")
def test_qwen3_30b_a3b_plan():
    cfg = json.loads(Path(QWEN_CONFIG).read_text())
    spec = make_spec(training={"seqLen": 128}, device={"backend": "furiosa"})
    plan = P.compile_plan(spec, cfg=cfg)
    assert [e.name for e in plan.entries] == [
        "embed",
        "attention",
        *(f"head_n{n}" for n in (1, 2, 4, 8, 16, 32, 64, 128)),
        *(f"hot_experts_b{b}" for b in (8, 16, 32, 64, 128)),
    ]
    hot = plan.entries[-1]
    assert hot.inputs[0]["shape"] == [32, 128, 2048]  # 0.25 of 128 experts, Bk, hidden
    assert hot.weights[0]["shape"] == [32, 1536, 2048]
    # the packaged preset has the same widths: same keys
    assert (
        P.compile_plan(
            make_spec(
                model={"preset": "qwen3-30b-a3b"},
                training={"seqLen": 128},
                device={"backend": "furiosa"},
            )
        ).keys
        == plan.keys
    )


SHAPE_RULES = {
    "hot_count",
    "tokens_per_pass",
    "default_buckets",
    "hot_buckets",
    "next_pow2",
    "label_bucket",
    "label_buckets",
}


def _sizing_users() -> tuple[dict[str, list[str]], set[str]]:
    """(where each shape rule is defined, the modules importing rules from api.sizing)."""
    import ast

    import npu_lora

    root = Path(npu_lora.__file__).parent
    defined: dict[str, list[str]] = {}
    users: set[str] = set()
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name in SHAPE_RULES:
                defined.setdefault(node.name, []).append(rel)
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "npu_lora.api.sizing"
                and {a.name for a in node.names} & SHAPE_RULES
            ):
                users.add(rel)
    return defined, users


def test_shape_rules_have_one_torch_free_home():
    """hot_count, tokens per pass, the buckets and the label buckets are defined once, in
    api/sizing.py (torch-free), and the compile plan, the memory estimate, the engine's hot set,
    the hot path, the device graphs and the graph builders of the plan and the RNGD catalogue
    import them from there: a copy anywhere else fails this test."""
    defined, users = _sizing_users()
    assert defined == {r: ["api/sizing.py"] for r in SHAPE_RULES}
    assert {
        "compile/plan.py",
        "api/memory.py",
        "engine/hotset.py",
        "moe/hot.py",
        "device/graphs.py",
        "device/examples.py",
    } <= users, users


def test_label_buckets_are_what_label_gather_picks():
    import torch
    from npu_lora.device.graphs import label_gather

    gen = torch.Generator().manual_seed(0)
    for S in (8, 32, 48, 128):
        seen = set()
        for _ in range(200):
            labels = torch.full((2, S), -100)
            n = int(torch.randint(1, S, (1,), generator=gen))
            labels[:, S - n :] = 1
            seen.add(label_gather(labels, torch.float32).sel_BNS.shape[1])
        assert seen <= set(P.label_buckets(S)), (S, seen)


_SNIPPET = """
import json, sys
from npu_lora.api.load import load_manifest
from npu_lora.compile.plan import compile_plan
spec = load_manifest(sys.argv[1]).spec
print(json.dumps({"keys": compile_plan(spec).keys, "torch": "torch" in sys.modules}))
"""


def test_keys_are_stable_across_processes_and_environments(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(spec_doc()))
    here = P.compile_plan(make_spec()).keys
    outs = []
    for i, extra in enumerate(
        [
            {},
            {
                "PYTHONHASHSEED": "123",
                "OMP_NUM_THREADS": "1",
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
                "XDG_CACHE_HOME": str(tmp_path / "xdg"),
                "HOME": str(tmp_path),
                "NPU_LORA_COMPILE_CACHE": str(tmp_path / "cache"),
                "LC_ALL": "C",
                "TZ": "Asia/Seoul",
            },
        ]
    ):
        cwd = tmp_path / f"cwd{i}"
        cwd.mkdir()
        r = subprocess.run(
            [sys.executable, "-c", _SNIPPET, str(f)],
            env={**ENV, **extra},
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        )
        outs.append(json.loads(r.stdout))
    assert outs[0]["keys"] == outs[1]["keys"] == here
    assert outs[0]["torch"] is False  # the plan is torch-free (the operator can compute it)


def test_keys_are_pinned_for_furiosa_without_furiosa_torch(monkeypatch):
    monkeypatch.setattr(P, "_version", lambda d: {"torch": "2.13.0"}.get(d))
    assert P.compiler_id("furiosa") == "furiosa-torch==2026.4.0 torch==2.10.0"
    assert P.compiler_id("cpu") == "torch==2.13.0 inductor-cpu"


def test_seq_len_changes_exactly_the_graphs_that_depend_on_it():
    fixed = {"placement": "hot", "bucketSizes": [8, 16]}
    a = keys(make_spec(moe=fixed, training={"seqLen": 32}))
    b = keys(make_spec(moe=fixed, training={"seqLen": 48}))
    common = a.keys() & b.keys()
    changed = {n for n in common if a[n] != b[n]}
    # the hot experts see [Eh, Bk, D] only: fixed buckets keep their keys
    assert changed == {n for n in common if not n.startswith("hot_experts")}
    assert {"hot_experts_b8", "hot_experts_b16"} <= common - changed


def test_lora_rank_changes_only_the_attention_block():
    assert _changed(keys(make_spec(lora={"r": 16})), keys(make_spec(lora={"r": 8}))) == {
        "attention"
    }
    assert _changed(
        keys(make_spec()), keys(make_spec(lora={"targetModules": ["q_proj", "k_proj", "v_proj"]}))
    ) == {"attention"}


def test_other_inputs_change_the_right_graphs():
    base = keys(make_spec())
    half = keys(make_spec(moe={"hotFraction": 0.5}))  # Eh 4: one more gathered bucket
    assert {n for n in base.keys() & half.keys() if base[n] != half[n]} == {
        n for n in base if n.startswith("hot")
    }
    assert set(half) - set(base) == {"hot_gathered_b16"}
    assert _changed(base, keys(make_spec(device={"dtype": "bfloat16"}))) == set(base)
    assert _changed(base, keys(make_spec(), compiler="torch==9.9 inductor-cpu")) == set(base)
    # batch size: every graph's shapes but the hot experts' [Eh, Bk, D] (T = B*S adds buckets)
    b2 = keys(make_spec(training={"batchSize": 2}))
    common = base.keys() & b2.keys()
    assert {n for n in common if base[n] != b2[n]} == {
        n for n in common if not n.startswith("hot_experts")
    }
    # nothing else of the spec enters: steps, learning rate, data, output
    same = keys(make_spec(training={"steps": 99, "learningRate": 1e-3}, data={"path": "x.jsonl"}))
    assert same == base


def test_graph_source_enters_the_key(tmp_path):
    pkg = tmp_path / "npu_lora"
    shutil.copytree(Path(P.__file__).resolve().parents[1] / "device", pkg / "device")
    assert P.source_digest(pkg) == P.source_digest()
    graphs = pkg / "device" / "graphs.py"
    graphs.write_text(graphs.read_text() + "\n# a change\n")
    changed = P.source_digest(pkg)
    assert changed != P.source_digest()
    e = P.compile_plan(make_spec()).entries[0]
    assert P.entry_key(e, compiler="c", source=changed) != P.entry_key(
        e, compiler="c", source=P.source_digest()
    )


def test_compile_plan_command(tmp_path, capsys):
    from npu_lora.cli import main

    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(spec_doc()))
    assert main(["compile-plan", str(f), "--json", "--cache", str(tmp_path / "c")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "cpu" and len(doc["graphs"]) == 12
    assert doc["cache"] == {"root": str(tmp_path / "c"), "present": 0, "total": 12}
    assert main(["compile-plan", str(f), "--set", "training.seqLen=64"]) == 0
    out = capsys.readouterr().out
    assert "head_n64" in out and "compile plan: " in out


def test_rngd_check_reads_the_plan(tmp_path, capsys):
    """``rngd-check --plan`` checks the run's own graphs (names, shapes, keys of the plan)."""
    from npu_lora.cli import main

    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(spec_doc(training={"seqLen": 16, "steps": 10})))
    plan = P.compile_plan(make_spec(training={"seqLen": 16}), backend="furiosa")
    assert main(["rngd-check", "--plan", str(f), "--list"]) == 0
    listed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [e.name for e in plan.entries]
    out = tmp_path / "check.json"
    rc = main(
        [
            "rngd-check",
            "--plan",
            str(f),
            "--tier",
            "inventory",
            "--graphs",
            "embed,hot_experts_b8",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["plan_keys"] == {
        e.name: e.key for e in plan.entries if e.name in ("embed", "hot_experts_b8")
    }


def test_bench_records_the_plan():
    from types import SimpleNamespace

    from npu_lora.bench.harness import BenchConfig, bench_plan_record

    cfg = BenchConfig(seq_len=32, batch=1, backend="cpu")
    rec = bench_plan_record(cfg, SimpleNamespace(backend=SimpleNamespace(name="cpu")), True)
    names = [g["name"] for g in rec["graphs"]]
    assert rec["kind"] == "compile_plan" and names[:2] == ["embed", "attention"]
    assert "hot_experts_b32" in names
