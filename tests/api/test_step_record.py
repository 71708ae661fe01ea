"""The per-step record has one definition (``npu_lora.api.record``); every list of its columns
is derived from it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from npu_lora.api import record
from npu_lora.api.v1alpha1 import StepRecord


def test_record_module_is_torch_free():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import npu_lora.api.record, npu_lora.api.v1alpha1, npu_lora.report.status\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_status_model_and_status_keys_come_from_the_record():
    from npu_lora.report.status import last_step_status

    assert list(StepRecord.model_fields) == [c.name for c in record.STATUS_FIELDS]
    rec = {c.name: 1.234567 for c in record.RECORD} | {"step": 7, "tokens": 64}
    out = last_step_status(rec)
    assert list(out) == [c.status_key for c in record.STATUS_FIELDS]
    assert out["attnHeadS"] == 1.235 and out["loss"] == 1.2346 and out["step"] == 7
    assert StepRecord.model_validate(out).attn_head_s == 1.235


def test_printer_summary_and_bench_columns_come_from_the_record():
    from npu_lora.bench.harness import PROFILE_COLUMNS
    from npu_lora.train.summary import TIMING_COLUMNS
    from npu_lora_operator.crd import PRINTER_COLUMNS

    by_path = {c["jsonPath"]: c for c in PRINTER_COLUMNS}
    for c in record.RECORD:
        path = f".status.lastStep.{c.status_key}"
        if c.printer is None:
            assert path not in by_path
            continue
        assert c.status, c.name  # a printer column shows a status key
        col = by_path[path]
        assert (col["name"], col.get("priority", 0)) == (c.printer.name, c.printer.priority)
    assert tuple(c.name for c in record.RECORD if c.table) == TIMING_COLUMNS
    assert tuple(c.name for c in record.RECORD if c.bench) == PROFILE_COLUMNS


def test_ordered_record_names_a_missing_column():
    values = dict.fromkeys(record.NAMES, 0) | {"nonfinite": "loss"}
    assert list(record.ordered(values)) == [*record.NAMES, "nonfinite"]
    del values["host_fwd_s"]
    with pytest.raises(KeyError, match="host_fwd_s"):
        record.ordered(values)
