"""``npu-lora bench --peak-rss``: each variant's peak RSS in a process of its own."""

from __future__ import annotations

from npu_lora.bench.config import BenchConfig
from npu_lora.bench.peak_rss import measure, rss_lines


def test_each_variant_peak_rss_comes_from_its_own_process():
    cfg = BenchConfig(
        preset="tiny-qwen3-moe", seq_len=16, host_dtype="float32", limits=False, answer_tokens=4
    )
    logged: list[str] = []
    recs = measure(cfg, ["host-only+keep_graph", "hot", "peer@grouped_mm"], logged.append)
    assert [r["variant"] for r in recs] == ["host-only+keep_graph", "peer@grouped_mm"]  # no hot
    for r in recs:
        assert "error" not in r, r
        assert r["peak_rss_bytes"] >= r["built_rss_bytes"] > 50 << 20  # torch alone is more
        assert r["steps"] == 1 and r["step_s"] > 0
    assert len(logged) == 2 and all(line.startswith("peak RSS ") for line in logged)
    md = rss_lines(recs)
    assert any("host-only+keep_graph / peer@grouped_mm steps' peak RSS: " in line for line in md)
    for r in recs:
        assert r["step_peak_rss_bytes"] >= r["step_start_rss_bytes"] > 0


def test_a_failing_child_gives_a_record_with_its_error():
    cfg = BenchConfig(preset="tiny-qwen3-moe", seq_len=16, limits=False, experts_impl="no_such")
    (rec,) = measure(cfg, ["host-only"], lambda s: None)
    assert rec["variant"] == "host-only" and rec["error"]
    assert "failed" in rss_lines([rec])[-1]
