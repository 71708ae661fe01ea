"""``npu_lora.api.record.RECORD`` is the one registry of step columns: a column added there shows
up in every consumer, and no other module lists column names."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from npu_lora.api import record
from pydantic.alias_generators import to_camel

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker" / "npu_lora"
OPERATOR = ROOT / "operator"

#: Two columns added to a copy of api/record.py: one the engine measures (every consumer but
#: the data-parallel ones), one of a data-parallel run.
NEW_COLUMNS = """
    Column(
        "probe_bytes",
        "int",
        "bytes",
        "A test column.",
        source="engine",
        summed=True,
        table=True,
        median=True,
        bench=True,
        status=True,
        status_doc="A test column.",
        bench_label="probe",
        printer=Printer("Probe", "A test column.", priority=1),
    ),
    Column(
        "probe_wait_s",
        "float",
        "s",
        "A data-parallel test column.",
        source="data-parallel",
        median=True,
        status=True,
        status_doc="A data-parallel test column.",
        printer=Printer("Probe-Wait", "A data-parallel test column.", priority=1),
    ),
"""

CHECK = textwrap.dedent(
    """
    import dataclasses, json
    from npu_lora.api import record
    from npu_lora.api.v1alpha1 import DistributedStatus, MoEFinetuneStatus, StepRecord
    from npu_lora.bench import report as bench_report, resource, stats
    from npu_lora.engine.profile import StepProfile
    from npu_lora.report.status import distributed_status, last_step_status
    from npu_lora.train import summary, tensorboard
    from npu_lora_operator import crd, metrics

    rec = {c.name: 2 for c in record.RECORD} | {"probe_bytes": 3_000_000, "probe_wait_s": 0.25}
    crd_status = crd.openapi_schema()["properties"]["status"]["properties"]
    bench_summary = {
        "baseline": "a",
        "medians": {"a": {"probe_bytes": 3_000_000.0}},
        "deltas": {"a": {}},
    }
    case = {"seqLen": 8, "hostDtype": "float32", "hotFraction": 0.25, "baseline": "a",
            "variants": [{"name": "a", "medians": {"probe_bytes": 3_000_000.0}}]}
    print(json.dumps({
        "profile": [f.name for f in dataclasses.fields(StepProfile)],
        "record_names": list(record.NAMES),
        "dp_names": list(record.DATA_PARALLEL),
        "step_record_model": list(StepRecord.model_fields),
        "distributed_model": [f.alias for f in DistributedStatus.model_fields.values()],
        "crd_last_step": list(crd_status["lastStep"]["properties"]),
        "crd_distributed": list(crd_status["distributed"]["properties"]),
        "printer": [(c["name"], c["jsonPath"], c.get("priority", 0)) for c in crd.PRINTER_COLUMNS],
        "last_step": last_step_status(rec),
        "distributed": distributed_status(rec | {"step": 3}, None),
        "valid": MoEFinetuneStatus.model_validate(
            {"lastStep": last_step_status(rec), "distributed": distributed_status(rec, None)}
        ).last_step.probe_bytes,
        "tb_tags": list(tensorboard.TAGS),
        "tb": tensorboard.scalars(rec),
        "medians": summary.medians([rec, rec | {"probe_bytes": 5_000_000}]),
        "timing_table": summary.timing_table({"median": {"probe_bytes": 4e6}}),
        "bench_columns": list(stats.PROFILE_COLUMNS),
        "bench_table": bench_report.render_table(bench_summary, ["a"]),
        "bench_md": resource.markdown({"cases": [case]}),
        "prometheus": [m for _, m in metrics._LAST_STEP],
    }))
    """
)


def _consumers_with_new_columns(tmp_path: Path) -> dict:
    pkg = tmp_path / "worker" / "npu_lora"
    shutil.copytree(WORKER, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    src = (pkg / "api" / "record.py").read_text(encoding="utf-8")
    anchor = "\n)\n\n#: The keys of every record"
    assert src.count(anchor) == 1, "RECORD's closing parenthesis moved: update this test"
    (pkg / "api" / "record.py").write_text(src.replace(anchor, NEW_COLUMNS + anchor[1:], 1))
    env = {"PYTHONPATH": f"{pkg.parent}:{OPERATOR}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_column_added_to_the_record_appears_in_every_consumer(tmp_path):
    got = _consumers_with_new_columns(tmp_path)
    # the engine's profile and the record
    assert "probe_bytes" in got["profile"] and "probe_wait_s" not in got["profile"]
    assert got["record_names"][-1] == "probe_bytes"
    assert got["dp_names"][-1] == "probe_wait_s"
    # status models (the API and the CRD's schema) and what the worker reports
    assert got["step_record_model"][-1] == "probe_bytes"
    assert got["crd_last_step"][-1] == "probeBytes"
    assert got["distributed_model"][-1] == "probeWaitSeconds"
    assert got["crd_distributed"][-1] == "probeWaitSeconds"
    assert got["last_step"]["probeBytes"] == 3_000_000 and got["valid"] == 3_000_000
    assert got["distributed"]["probeWaitSeconds"] == 0.25
    assert "probeWaitSeconds" not in got["last_step"]
    # kubectl get mft -o wide
    assert ["Probe", ".status.lastStep.probeBytes", 1] in got["printer"]
    assert ["Probe-Wait", ".status.distributed.probeWaitSeconds", 1] in got["printer"]
    # TensorBoard
    assert "traffic/probe_bytes" in got["tb_tags"] and got["tb"]["traffic/probe_bytes"] == 3e6
    assert got["tb"]["dist/probe_wait_s"] == 0.25
    # summary.json's medians and the printed table
    assert got["medians"]["probe_bytes"] == 4_000_000 and got["medians"]["probe_wait_s"] == 0.25
    assert "probe_bytes" in got["timing_table"]
    # the bench: medians and both tables (MB)
    assert got["bench_columns"][-1] == "probe_bytes"
    assert "| probe MB |" in got["bench_table"] and "| 3.000 |" in got["bench_table"]
    assert "| probe MB |" in got["bench_md"] and "| 3 |" in got["bench_md"]
    # the operator's Prometheus gauges of status.lastStep
    assert any("probe_bytes" in m for m in got["prometheus"])


#: Column names too generic to search for (they name other things too: eval records, specs).
_GENERIC = {c.name for c in record.RECORD if "_" not in c.name}
#: Accumulators that the measuring code adds to, field by field (the measurement itself:
#: HostMLP's times, the step's collectives, the device seam's copies).
_ACCUMULATORS = {"HostTimes", "StepComm", "Traffic"}


def _column_words() -> set[str]:
    words = {c.name for c in record.RECORD} | {c.status_key for c in record.RECORD}
    return words - _GENERIC


def test_no_module_but_the_record_lists_column_names():
    """A tuple, list or set literal naming two or more columns, or a class declaring fields
    named like columns (a hand-written profile or status model), anywhere in the worker or the
    operator except ``api/record.py``, is a second registry."""
    words = _column_words()
    found = []
    for root in (WORKER, OPERATOR):
        for path in sorted(root.rglob("*.py")):
            if path == WORKER / "api" / "record.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            where = path.relative_to(ROOT)
            for node in ast.walk(tree):
                if isinstance(node, ast.Tuple | ast.List | ast.Set):
                    hits = [
                        e.value
                        for e in node.elts
                        if isinstance(e, ast.Constant) and e.value in words
                    ]
                    if len(hits) >= 2:
                        found.append(f"{where}:{node.lineno} {hits}")
                if isinstance(node, ast.ClassDef) and node.name not in _ACCUMULATORS:
                    fields = [
                        n.target.id
                        for n in node.body
                        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                    ]
                    hits = [f for f in fields if f in words or to_camel(f) in words]
                    if len(hits) >= 2:
                        found.append(f"{where}:{node.lineno} class {node.name} {hits}")
    assert not found, "column names listed outside api/record.py:\n" + "\n".join(found)


def test_the_guard_sees_a_restated_list(tmp_path):
    """The guard's own check: the old hand-written lists would have been found."""
    words = _column_words()
    old = ast.parse('RECORD_KEYS = ("world_size", "allreduce_s", "skew_s")')
    (node,) = [n for n in ast.walk(old) if isinstance(n, ast.Tuple)]
    assert sum(isinstance(e, ast.Constant) and e.value in words for e in node.elts) == 3
    cls = ast.parse("class P:\n    attn_head_s: float\n    skew_seconds: float\n")
    fields = [n.target.id for n in cls.body[0].body]
    assert all(f in words or to_camel(f) in words for f in fields)
