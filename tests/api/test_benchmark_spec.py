"""spec.benchmark: validation without a cluster, the sweep's cases, the status table."""

from __future__ import annotations

import pytest
from npu_lora.api.load import SpecError, load_manifest
from npu_lora.api.v1alpha1 import BENCHMARK_VARIANTS, BenchmarkStatus, MoEFinetune


def _manifest(**bench):
    return MoEFinetune.model_validate(
        {
            "metadata": {"name": "b"},
            "spec": {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": {"path": "example:nsmc-mini"},
                "moe": {"warmupSteps": 50},  # not checked against training.steps in a benchmark
                "benchmark": bench,
            },
        }
    )


def test_defaults_are_the_seeds_four_variants():
    b = _manifest().spec.benchmark
    assert b is not None and tuple(b.variants) == BENCHMARK_VARIANTS
    assert (b.rounds, b.steps_per_round, b.seq_lens, b.host_dtypes) == (6, 1, [128], ["float32"])


@pytest.mark.parametrize(
    ("bench", "needle"),
    [
        ({"variants": ["hot+fast"]}, "variants"),
        ({"variants": ["host-only", "hot+fp32"]}, "variants[1]: variant 'hot.fp32': .fp32 applies"),
        ({"variants": ["host-only+sequential"]}, "variants[0]: .*sequential applies to hot"),
        ({"variants": ["host-only", "hot+int8"]}, "variants[1]: variant 'hot.int8': .int8 applies"),
        ({"variants": ["host-only+fp32+fp8"]}, "variants[0]: .*fp8 and .fp32 exclude each other"),
        ({"variants": ["peer+keep_graph"]}, "variants"),
        ({"variants": ["hot", "hot"]}, "duplicates"),
        ({"baseline": "peer"}, "baseline 'peer' is not one of the variants"),
        ({"rounds": 0}, "rounds"),
        ({"seqLens": []}, "seqLens"),
        ({"hostDtypes": ["float16"]}, "hostDtypes"),
        ({"hotFractions": [0.0]}, "hotFractions"),
    ],
)
def test_invalid_benchmark_names_the_field(tmp_path, bench, needle):
    import yaml

    doc = _manifest().to_api()
    doc["spec"]["benchmark"] = bench
    p = tmp_path / "b.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=needle.replace("[", r"\[")):
        load_manifest(str(p))


def test_variants_take_the_bench_cli_grammar():
    """Every modifier ``npu-lora bench`` runs is admitted, with the CLI's combination rules: the
    fair bf16 peer (``peer+fp32``), the stock default attention (``peer+sdpa``), fp32 storage and
    the 4 KiB-page copies of our engine."""
    import re

    from npu_lora.api.v1alpha1 import VARIANT_PATTERN
    from npu_lora.bench.variant import Variant

    names = [
        "host-only+keep_graph@npu_lora_stream",
        "host-only+keep_graph+fp32+4k@npu_lora_stream",
        "host-only+keep_graph+int8@npu_lora_stream",
        "host-only+fp8",
        "host-only+torch_head",
        "hot+keep_graph+overlap+padmax",
        "peer+fp32@grouped_mm",
        "peer+fp32+sdpa@grouped_mm",
    ]
    b = _manifest(variants=names).spec.benchmark
    assert b is not None and b.variants == names
    for n in names:  # the CRD's admission pattern agrees
        assert re.match(VARIANT_PATTERN, n) and Variant.parse(n).name == n
    for bad in ("peer+keep_graph", "hot+sdpa", "host-only+fast", "hot+legacy"):
        assert not re.match(VARIANT_PATTERN, bad)


def test_the_removed_legacy_variant_is_refused_by_name():
    """``+legacy`` (the hot path before issue 13) is gone from the engine and the bench; the
    parser says so rather than listing it as an unknown modifier."""
    from npu_lora.bench.variant import Variant

    with pytest.raises(ValueError, match=r"\+legacy was removed"):
        Variant.parse("hot+keep_graph+legacy")


def test_cases_sweep_every_combination():
    from npu_lora.bench.resource import case_name, cases

    m = _manifest(seqLens=[64, 128], hostDtypes=["float32", "bfloat16"], hotFractions=[0.25, 0.5])
    got = cases(m)
    assert len(got) == 8 and got[0] == (64, "float32", 0.25) and got[-1] == (128, "bfloat16", 0.5)
    assert case_name(*got[0]) == "s64-float32-hot0.25"
    assert cases(_manifest()) == [(128, "float32", 0.25)]


def test_case_table_from_a_harness_summary():
    from npu_lora.bench.resource import case_table, markdown

    nan = float("nan")
    summary = {
        "baseline": "host-only",
        "medians": {
            "host-only": {"step_s": 2.0, "host_bwd_s": 1.0, "loss": nan, "n": 6},
            "host-only+keep_graph": {"step_s": 1.5, "host_bwd_s": 0.5, "n": 6},
            "peer@grouped_mm": {"step_s": 1.6, "n": 6},
        },
        "deltas": {
            "host-only": {
                "median_ratio": 1.0,
                "median_delta_s": 0.0,
                "same_sign_rounds": 0,
                "rounds": 6,
            },
            "host-only+keep_graph": {
                "median_ratio": 0.75,
                "median_delta_s": -0.5,
                "same_sign_rounds": 6,
                "rounds": 6,
            },
            "peer@grouped_mm": {
                "median_ratio": 0.8,
                "median_delta_s": -0.4,
                "same_sign_rounds": 5,
                "rounds": 6,
            },
        },
        "pairs": {"host-only+keep_graph / peer@grouped_mm : step_s": {"median_ratio": 0.94}},
        "limits": {"copy_gbs": 12.345678, "triad_gbs": 10.0},
    }
    t = case_table(summary, 128, "float32", 0.25)
    assert t["best"] == "host-only+keep_graph" and t["peerRatio"] == 0.94
    assert t["copyGbs"] == 12.35  # 4 significant digits
    first = t["variants"][0]
    assert first["medians"] == {"step_s": 2.0, "host_bwd_s": 1.0}  # NaN dropped
    assert first["steps"] == 6 and first["sameSignRounds"] == 0
    status = {"variants": 3, "roundsDone": 6, "roundsTotal": 6, "cases": [t]}
    BenchmarkStatus.model_validate(status)
    md = markdown(status)
    assert "| host-only+keep_graph | 1.5 |" in md and "peer@grouped_mm 0.940" in md
