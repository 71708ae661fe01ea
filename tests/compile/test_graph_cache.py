"""The graph cache: atomic publish, killed compiles, the worker's hits/misses, real inductor compiles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from npu_lora.compile import cache
from npu_lora.compile import precompile as pc
from npu_lora.compile.plan import compile_plan

from .helpers import make_spec, spec_doc

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{REPO / 'worker'}:{REPO / 'operator'}"}
KEY = "ab" + "0" * 62


def _fake(doc=None):
    def build(tmp: Path) -> dict:
        (tmp / "artefact.bin").write_bytes(b"x" * 1000)
        return dict(doc or {"fake": True})

    return build


def fill(root: Path, plan) -> None:
    for k in plan.keys:
        assert cache.publish(root, k, _fake())[0] == "published"


def test_publish_then_hit(tmp_path):
    assert not cache.present(tmp_path, KEY)
    assert cache.publish(tmp_path, KEY, _fake({"n": 1}))[0] == "published"
    assert cache.present(tmp_path, KEY)
    outcome, doc = cache.publish(tmp_path, KEY, lambda tmp: pytest.fail("built a hit"))
    assert outcome == "hit" and doc["n"] == 1 and doc["key"] == KEY
    assert cache.temporaries(tmp_path) == []


def test_a_failed_compile_leaves_nothing(tmp_path):
    def boom(tmp: Path) -> dict:
        (tmp / "half").write_bytes(b"x")
        raise RuntimeError("compiler said no")

    with pytest.raises(RuntimeError, match="compiler said no"):
        cache.publish(tmp_path, KEY, boom)
    assert not cache.present(tmp_path, KEY)
    assert cache.temporaries(tmp_path) == []
    assert not cache.entry_dir(tmp_path, KEY).exists()


_KILLED = """
import sys, time
from pathlib import Path
from npu_lora.compile import cache
def build(tmp):
    (tmp / "half.bin").write_bytes(b"x" * 100)
    print("building", flush=True)
    time.sleep(60)
    return {}
cache.publish(Path(sys.argv[1]), sys.argv[2], build)
"""


def test_a_killed_compile_never_counts_as_present(tmp_path):
    p = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(tmp_path), KEY],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "building"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(30)
    temps = cache.temporaries(tmp_path)
    assert len(temps) == 1 and (temps[0] / "half.bin").exists()  # the half entry is a temp
    assert not cache.present(tmp_path, KEY)
    assert cache.lookup(tmp_path, [KEY]) == {KEY: False}
    # the next compile of the key publishes over it; the sweep removes the killed one's temp
    assert cache.publish(tmp_path, KEY, _fake())[0] == "published"
    assert cache.sweep(tmp_path, older_than_s=0) == temps
    assert cache.temporaries(tmp_path) == [] and cache.present(tmp_path, KEY)


def test_two_compiles_of_one_key_never_corrupt_each_other(tmp_path):
    gate = threading.Barrier(2)
    outcomes = []

    def build(tag):
        def b(tmp: Path) -> dict:
            (tmp / "artefact.bin").write_text(tag * 1000)
            gate.wait(10)  # both are compiling at once
            return {"tag": tag}

        return b

    threads = [
        threading.Thread(target=lambda t=t: outcomes.append(cache.publish(tmp_path, KEY, build(t))))
        for t in "ab"
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(o for o, _ in outcomes) == ["lost", "published"]
    entry = cache.read_entry(tmp_path, KEY)
    art = (cache.entry_dir(tmp_path, KEY) / "artefact.bin").read_text()
    assert art == entry["tag"] * 1000  # the entry is one compile's, whole
    assert cache.temporaries(tmp_path) == []


def test_worker_compiles_nothing_when_the_cache_is_full(tmp_path, monkeypatch):
    plan = compile_plan(make_spec())
    fill(tmp_path, plan)
    monkeypatch.setattr(pc, "compile_entry", lambda *a, **k: pytest.fail("compiled a hit"))
    rec = pc.ensure_plan(plan, tmp_path)
    assert (rec["total"], rec["hits"], rec["misses"], rec["compiled"]) == (12, 12, 0, 0)
    assert all(g["hit"] and g["compile_s"] == 0.0 for g in rec["graphs"])


def test_worker_compiles_only_the_misses(tmp_path, monkeypatch):
    plan = compile_plan(make_spec())
    for e in plan.entries[2:]:
        cache.publish(tmp_path, e.key, _fake())
    compiled = []

    def fake_compile(plan_, entry, root):
        compiled.append(entry.name)
        cache.publish(root, entry.key, _fake())
        return {
            "index": entry.index,
            "name": entry.name,
            "key": entry.key,
            "hit": False,
            "outcome": "published",
            "compile_s": 1.5,
        }

    monkeypatch.setattr(pc, "compile_entry", fake_compile)
    rec = pc.ensure_plan(plan, tmp_path)
    assert compiled == ["embed", "attention"]
    assert (rec["hits"], rec["misses"], rec["compiled"]) == (10, 2, 2)
    assert [g["hit"] for g in rec["graphs"][:3]] == [False, False, True]
    assert rec["graphs"][0]["compile_s"] == 1.5
    assert pc.ensure_plan(plan, tmp_path)["misses"] == 0
    # count only: misses are reported, nothing is compiled
    plan2 = compile_plan(make_spec(device={"dtype": "bfloat16"}))
    rec2 = pc.ensure_plan(plan2, tmp_path, compile_misses=False)
    assert rec2["misses"] == rec2["total"] and rec2["compiled"] == 0


def test_run_checks_the_cache_before_training(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from npu_lora.commands.run import check_compile_cache

    spec = make_spec()
    engine = SimpleNamespace(backend=SimpleNamespace(name="cpu"))
    monkeypatch.delenv(cache.ENV_ROOT, raising=False)
    assert check_compile_cache(spec, engine) is None  # no cache configured: nothing
    monkeypatch.setenv(cache.ENV_ROOT, str(tmp_path))
    fill(tmp_path, compile_plan(spec, backend="cpu"))
    monkeypatch.setattr(pc, "compile_entry", lambda *a, **k: pytest.fail("compiled a hit"))
    rec = check_compile_cache(spec, engine)
    assert rec["hits"] == rec["total"] == 12 and rec["compiled"] == 0


def test_plan_graphs_build_every_graph_at_the_plan_shapes():
    import torch
    from npu_lora.compile.graphs import plan_graphs

    plan = compile_plan(make_spec(training={"seqLen": 16}))
    graphs = plan_graphs(plan)
    assert [g.name for g in graphs] == [e.name for e in plan.entries]
    for g, e in zip(graphs, plan.entries, strict=True):
        got = [(list(t.shape), str(t.dtype).removeprefix("torch.")) for t in g.example_inputs]
        assert got == [(i["shape"], i["dtype"]) for i in e.inputs], e.name
        with torch.no_grad():
            g.module(*g.example_inputs)  # runs eagerly at those shapes


@pytest.mark.slow
def test_precompile_index_compiles_with_inductor_then_hits(tmp_path):
    """A real compile (torch.compile, inductor, its on-disk cache in the entry) of one graph."""
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(spec_doc(training={"seqLen": 16, "steps": 10})))
    root = tmp_path / "cache"
    cmd = [sys.executable, "-m", "npu_lora.cli", "precompile", str(f), "--cache", str(root)]
    t0 = time.perf_counter()
    r = subprocess.run(
        cmd, env={**ENV, "JOB_COMPLETION_INDEX": "0"}, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert (row["name"], row["outcome"], row["hit"]) == ("embed", "published", False)
    entry = cache.read_entry(root, row["key"])
    assert entry["how"]["artefacts"] > 0 and entry["compile_s"] > 0
    assert (cache.entry_dir(root, row["key"]) / "inductor" / "fxgraph").is_dir()
    first = time.perf_counter() - t0
    r2 = subprocess.run(
        [*cmd, "--index", "0"], env=ENV, capture_output=True, text=True, timeout=600
    )
    row2 = json.loads(r2.stdout.strip().splitlines()[-1])
    assert (row2["key"], row2["outcome"], row2["compile_s"]) == (row["key"], "hit", 0.0)
    assert first > 0


def test_run_compiles_misses_only_where_compiling_helps(tmp_path, monkeypatch):
    """cpu with precompile auto: count only (the cpu engine runs eagerly); precompile true (or
    furiosa): the misses are compiled before the first step; the env var decides over both."""
    from types import SimpleNamespace

    from npu_lora.commands.run import check_compile_cache

    compiled = []

    def fake_compile(plan_, entry, root):
        compiled.append(entry.name)
        return {"index": entry.index, "name": entry.name, "key": entry.key, "hit": False,
                "outcome": "published", "compile_s": 0.1}  # fmt: skip

    monkeypatch.setattr(pc, "compile_entry", fake_compile)
    monkeypatch.setenv(cache.ENV_ROOT, str(tmp_path))
    monkeypatch.delenv("NPU_LORA_COMPILE_MISSES", raising=False)
    engine = SimpleNamespace(backend=SimpleNamespace(name="cpu"))
    rec = check_compile_cache(make_spec(), engine)
    assert (rec["misses"], rec["compiled"], compiled) == (12, 0, [])
    rec = check_compile_cache(
        make_spec(device={"precompile": True, "compileCache": {"claimName": "graphs"}}), engine
    )
    assert rec["compiled"] == 12 and len(compiled) == 12
    monkeypatch.setenv("NPU_LORA_COMPILE_MISSES", "0")
    assert (
        check_compile_cache(
            make_spec(device={"precompile": True, "compileCache": {"claimName": "graphs"}}), engine
        )["compiled"]
        == 0
    )
