"""Checkpoints hold no pickle: safetensors + JSON, read back exactly; a pickle checkpoint of
format 1 is refused naming the file, and nothing in the package unpickles or runs a model's
custom code."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import pytest
import torch
from npu_lora.api.load import SpecError
from npu_lora.train.checkpoint import (
    FORMAT,
    CheckpointReadError,
    PickleCheckpointError,
    find_checkpoint,
    load_checkpoint,
    load_tree,
    save_checkpoint,
    save_tree,
)

PACKAGE = Path(__file__).resolve().parents[2] / "worker" / "npu_lora"


class _Engine:
    """The checkpoint's view of an engine: trainable parameters, routing counts, hot set."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.counts = torch.randint(0, 100, (2, 8), generator=g)
        self.hot = None
        self.adapter = self  # the parts: trainable parameters (adapter), routing counts (hotset)
        self.hotset = self

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def routing_counts(self) -> torch.Tensor:
        return self.counts

    def load_routing_counts(self, c: torch.Tensor) -> None:
        self.counts = c.clone()

    def hot_state(self):
        return self.hot

    def load_hot_state(self, h) -> None:
        self.hot = h


def _trained(seed: int) -> tuple[_Engine, torch.optim.Optimizer]:
    eng = _Engine(seed)
    opt = torch.optim.AdamW(eng.adapter.parameters(), lr=1e-2, betas=(0.8, 0.95))
    for _ in range(3):
        loss = eng.model(torch.randn(5, 4)).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return eng, opt


def _one_step(eng: _Engine, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    loss = eng.model(torch.randn(5, 4)).pow(2).sum()  # draws from the restored RNG
    loss.backward()
    opt.step()
    opt.zero_grad()
    return [p.detach().clone() for p in eng.adapter.parameters()] + [torch.tensor(random.random())]


def test_a_checkpoint_restores_parameters_optimizer_and_rng_exactly(tmp_path):
    eng, opt = _trained(0)
    torch.manual_seed(123)
    random.seed(7)
    save_checkpoint(tmp_path, 3, eng, opt, extra={"scheduler": {"last_epoch": 3}})
    ckpt = tmp_path / "checkpoint"
    assert not list(ckpt.glob("*.pt")), "no pickle file is written"
    want_opt = copy.deepcopy(opt.state_dict())
    want_next = _one_step(eng, opt)  # the uninterrupted continuation

    eng2, opt2 = _trained(1)  # different weights, moments and RNG
    torch.manual_seed(999)
    random.seed(999)
    state = load_checkpoint(ckpt, eng2, opt2)
    assert state["format"] == FORMAT and state["step"] == 3
    assert state["scheduler"] == {"last_epoch": 3}
    got_opt = opt2.state_dict()
    assert got_opt["param_groups"] == want_opt["param_groups"]
    assert isinstance(got_opt["param_groups"][0]["betas"], tuple)
    for i, st in want_opt["state"].items():
        for k, v in st.items():
            assert torch.equal(got_opt["state"][i][k], v), (i, k)
            assert got_opt["state"][i][k].dtype == v.dtype
    assert torch.equal(eng2.counts, eng.counts)
    got_next = _one_step(eng2, opt2)
    for a, b in zip(got_next, want_next, strict=True):
        assert torch.equal(a, b), "the resumed step differs from the uninterrupted one"


def test_a_tree_round_trips_every_supported_type(tmp_path):
    obj = {
        "a": [1, 2.5, None, True, "x", float("inf")],
        3: (torch.arange(4, dtype=torch.bfloat16), torch.tensor(2.0)),
        "rng": torch.get_rng_state(),
        "py": random.getstate(),
    }
    save_tree(obj, tmp_path / "t")
    got = load_tree(tmp_path / "t")
    assert got["a"] == obj["a"] and got["py"] == obj["py"]
    assert torch.equal(got[3][0], obj[3][0]) and got[3][0].dtype == torch.bfloat16
    assert torch.equal(got["rng"], obj["rng"])


def test_a_value_that_is_not_data_is_never_written(tmp_path):
    with pytest.raises(TypeError, match="cannot be stored"):
        save_tree({"f": object()}, tmp_path / "t")


def test_a_tampered_tree_file_is_refused_naming_it(tmp_path):
    save_tree({"x": 1}, tmp_path / "t")
    (tmp_path / "t.json").write_text(
        json.dumps({"format": "npu-lora-tree/1", "tree": {"$object": "os.system"}})
    )
    with pytest.raises(CheckpointReadError, match=r"t\.json"):
        load_tree(tmp_path / "t")


def test_a_pickle_checkpoint_is_refused_naming_the_file_and_never_unpickled(tmp_path):
    """A format-1 checkpoint whose optimizer.pt would write a file when unpickled."""
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save(Payload(), ckpt / "optimizer.pt")
    torch.save({"names": [], "tensors": []}, ckpt / "params.pt")
    (ckpt / "state.json").write_text(json.dumps({"format": 1, "step": 2}))
    with pytest.raises(PickleCheckpointError, match=r"checkpoint/params\.pt.*format 1") as e:
        find_checkpoint(tmp_path)
    assert isinstance(e.value, SpecError)  # exit 2 in every command
    eng, opt = _trained(0)
    with pytest.raises(PickleCheckpointError):
        load_checkpoint(ckpt, eng, opt)
    assert not marker.exists()


def test_the_package_never_unpickles_or_runs_remote_code():
    """A grep over the package: no ``weights_only=False``, no ``trust_remote_code=True``."""
    bad = re.compile(r"weights_only\s*=\s*False|trust_remote_code\s*=\s*True")
    hits = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if bad.search(line)
    ]
    assert not hits, hits


def test_run_refuses_a_planted_pickle_checkpoint_with_exit_2_and_runs_none_of_it(
    tmp_path, capsys, standin
):
    """A run directory whose checkpoint was replaced by a format-1 (pickle) one, with a payload
    that would write a file when unpickled: the rerun exits 2 naming the file, runs nothing."""
    from testkit import tiny_manifest
    from train_helpers import run_in_process

    cfg = tiny_manifest(tmp_path, training={"steps": 2}, moe={"placement": "host-only"})
    out = tmp_path / "run"
    assert run_in_process(cfg, out) == 0
    ckpt = out / "checkpoint"
    state = json.loads((ckpt / "state.json").read_text())
    for p in ckpt.iterdir():
        p.unlink()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    for name in ("params.pt", "optimizer.pt", "rng.pt"):
        torch.save(Payload(), ckpt / name)
    (ckpt / "state.json").write_text(json.dumps({**state, "format": 1}))
    capsys.readouterr()
    assert run_in_process(cfg, out, "--steps", "4") == 2
    err = capsys.readouterr().err
    assert f"{ckpt / 'params.pt'}: a checkpoint of format 1" in err and "Traceback" not in err
    assert not marker.exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # nothing trained


def test_a_checkpoint_that_does_not_fit_is_named_not_a_traceback(tmp_path):
    eng, opt = _trained(0)
    save_checkpoint(tmp_path, 3, eng, opt)
    ckpt = tmp_path / "checkpoint"
    save_tree({"state": {}, "param_groups": "not a list"}, ckpt / "optimizer")
    with pytest.raises(SpecError, match=r"checkpoint: the checkpoint does not fit this run"):
        load_checkpoint(ckpt, *_trained(1))


def test_a_checkpoint_file_that_is_a_link_is_not_read(tmp_path):
    eng, opt = _trained(0)
    (tmp_path / "a").mkdir()
    save_checkpoint(tmp_path / "a", 3, eng, opt)
    ckpt = tmp_path / "a" / "checkpoint"
    elsewhere = tmp_path / "elsewhere.safetensors"
    (ckpt / "rng.safetensors").rename(elsewhere)
    (ckpt / "rng.safetensors").symlink_to(elsewhere)
    with pytest.raises(CheckpointReadError, match=r"rng\.safetensors: not a regular file"):
        load_checkpoint(ckpt, *_trained(1))


def test_a_deeply_nested_tree_is_refused(tmp_path):
    save_tree({"x": 1}, tmp_path / "t")
    deep = '{"$dict": [["x", ' * 5000 + "1" + "]]}" * 5000
    (tmp_path / "t.json").write_text('{"format": "npu-lora-tree/1", "tree": ' + deep + "}")
    with pytest.raises(CheckpointReadError, match=r"t\.json"):
        load_tree(tmp_path / "t")


def test_a_write_error_of_the_tensor_file_is_an_oserror_naming_it(tmp_path):
    """safetensors reports I/O errors as its own exception: a checkpoint write maps it to an
    OSError naming the file (so a full disk ends the run with its message, not a traceback)."""
    import errno

    with pytest.raises(OSError) as e:
        save_tree({"x": torch.zeros(3)}, tmp_path / "missing" / "t")
    assert e.value.errno == errno.ENOENT and e.value.filename.endswith("t.safetensors")
