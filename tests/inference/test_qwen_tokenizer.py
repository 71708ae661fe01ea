"""With the real Qwen3 tokenizer (its own chat template): chat and export (``../shared/data``)."""

from __future__ import annotations

import pytest
import yaml
from adapter_helpers import REPO, run_cli
from npu_lora.cli import main

QWEN_TOK = REPO / ".." / "shared" / "data" / "qwen3-tokenizer"

pytestmark = [
    pytest.mark.shared,
    pytest.mark.slow,
    pytest.mark.skipif(not QWEN_TOK.is_dir(), reason="../shared/data/qwen3-tokenizer is absent"),
]


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-run")
    doc = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "qwen-tok"},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe", "tokenizer": str(QWEN_TOK.resolve())},
            "data": {"path": "example:jsonl-mini"},
            "moe": {"placement": "host-only"},
            "training": {"steps": 1, "seqLen": 32, "batchSize": 2},
            "device": {"backend": "cpu", "cards": 0},
        },
    }
    manifest = root / "m.yaml"
    manifest.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NPU_LORA_TERMINATION_LOG", str(root / "termination-log"))
        args = ["run", str(manifest), "--out", str(root / "run"), "-q", "--no-plot"]
        assert main([*args, "--no-tensorboard"]) == 0
    return root / "run"


def test_chat_uses_the_qwen_template_and_export_keeps_it(qwen_run, tmp_path):
    r = run_cli("chat", str(qwen_run), "--max-new-tokens", "4", stdin="안녕\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1
    out = tmp_path / "merged"
    r = run_cli("export", str(qwen_run), "--merged", str(out), "--verify")
    assert r.returncode == 0, r.stderr
    verify = next(x for x in r.stdout.splitlines() if x.startswith("verify:"))
    assert float(verify.rsplit("=", 1)[1]) <= 1e-4
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert "<think>" in tok.chat_template  # Qwen3's own template, not the ChatML fallback
