"""One expert pass per node through the real CLI (``npu-lora run --ranks 2``, the worker's own
launcher, the real hybrid engine on the tiny preset): ``distributed.sharedPass: on`` trains
bit for bit like ``off`` (each rank streaming its own experts), and the worker's expert bytes
per step (``node_expert_bytes``, counted by the kernels' calls) are half of theirs. The kill of
a rank mid-step with the pass on is ``test_train_distributed.py``'s SIGKILL test (``auto`` is
on there)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from train_helpers import run_cli, tiny_manifest

torch = pytest.importorskip("torch")

STEPS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tmp: Path, mode: str) -> Path:
    m = tiny_manifest(
        tmp,
        name=f"pass-{mode}",
        training={"steps": STEPS, "batchSize": 2},
        moe={"hostThreads": 1, "placement": "hot", "warmupSteps": 2},
        checkpoint={"everySteps": 10},
        distributed={"port": _free_port(), "rendezvousTimeoutSeconds": 60, "sharedPass": mode},
    )
    out = tmp / mode
    r = run_cli("run", str(m), "--ranks", "2", "--out", str(out), "-q", "--no-plot")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]


@pytest.mark.slow
def test_shared_pass_trains_bitwise_like_separate_ranks_and_streams_half(
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file

    on, off = _run(tmp_path, "on"), _run(tmp_path, "off")
    a = load_file(str(on / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(off / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "the shared pass changed the result"
    s_on, s_off = _steps(on), _steps(off)
    assert [r["loss"] for r in s_on] == [r["loss"] for r in s_off]
    for x, y in zip(s_on, s_off, strict=True):
        assert 0 < x["node_expert_bytes"] < y["node_expert_bytes"]
        if x["step"] <= 2:
            # host-only until the hot set (warmupSteps 2); tiny preset: 8 experts, top-2,
            # 2 × 64 tokens a rank hit every expert on both ranks, so the union's hit set is
            # each rank's own and the node streams exactly half
            assert y["node_expert_bytes"] == 2 * x["node_expert_bytes"], (x, y)
        else:
            # hot experts on the device: a rank may miss a cold expert the other hits; the
            # union streams each hit expert once: at least half, less than both ranks apart
            assert 2 * x["node_expert_bytes"] >= y["node_expert_bytes"], (x, y)


@pytest.mark.parametrize(
    ("mode", "ranks", "train_experts", "kernel", "env", "on"),
    [
        ("auto", 2, False, "npu_lora_stream", None, True),
        ("auto", 1, False, "npu_lora_stream", None, False),  # one rank a pod: nothing to share
        ("auto", 2, True, "npu_lora_stream", None, False),  # trained experts are per rank
        ("auto", 2, False, "grouped_mm", None, False),  # not bitwise batch-invariant
        ("on", 2, False, "grouped_mm", None, True),
        ("on", 2, False, "npu_lora_stream", "0", False),  # weights not shared
        ("off", 2, False, "npu_lora_stream", None, False),
    ],
)
def test_shared_pass_resolution(
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    ranks: int,
    train_experts: bool,
    kernel: str,
    env: str | None,
    on: bool,
) -> None:
    from types import SimpleNamespace as NS

    from npu_lora.distributed.launch import ENV_SHARE, shared_pass_on

    if env is None:
        monkeypatch.delenv(ENV_SHARE, raising=False)
    else:
        monkeypatch.setenv(ENV_SHARE, env)
    spec = NS(
        distributed=NS(shared_pass=mode),
        lora=NS(train_experts=train_experts),
        moe=NS(experts_kernel=kernel),
    )
    assert shared_pass_on(spec, ranks) is on
