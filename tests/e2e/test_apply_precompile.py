"""``kubectl apply`` of ``device.precompile`` against the emulator (issue 44): ``true`` without
``device.compileCache`` and the retired string form are refused naming the field; nothing is
stored. No operator needed (the run with a precompile Job: test_precompile_run.py)."""

from __future__ import annotations

import pytest
from e2e_harness import Cluster, manifest, to_yaml

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("device", "needle"),
    [
        ({"precompile": True}, "device.precompile: true needs device.compileCache"),
        (
            {"precompile": "true", "compileCache": {"claimName": "graphs"}},
            "spec.device.precompile in body must be of type boolean",
        ),
    ],
)
def test_a_bad_precompile_is_refused_naming_the_field(
    cluster: Cluster, device: dict, needle: str
) -> None:
    r = cluster.kubectl(
        "apply", "-f", "-", input=to_yaml(manifest("pc", device=device)), check=False
    )
    text = r.stdout + r.stderr
    assert r.returncode != 0 and needle in text and "spec.device" in text, text
    assert cluster.kubectl("get", "mft", "-o", "name").stdout.strip() == ""
    ok = manifest("pc", device={"precompile": True, "compileCache": {"claimName": "graphs"}})
    assert cluster.kubectl("apply", "-f", "-", input=to_yaml(ok), check=False).returncode == 0
