"""Red-team pass (issue 38): policy cases the earlier hostile sets did not name."""

from __future__ import annotations

import pytest
from npu_lora_operator import policy as pol
from policy_runs import run

WORKER = "reg/npu-lora-worker:1"
POLICY = pol.PodPolicy(default_resources=(), allowed_host_paths=("/srv/models",))


@pytest.mark.parametrize(
    "path",
    ["/srv/models/x/..", "/srv/models/x/../y", "/srv/models/..", "/srv/models/../srv/models"],
)
def test_a_host_path_with_a_backstep_is_refused_even_when_it_normalises_inside(path):
    """``/srv/models/x/..`` normalises to an allowed prefix, but on the node ``x`` may be a link
    to ``/etc``, and ``..`` is resolved after it."""
    spec = {"model": {"path": "m", "volume": {"hostPath": path}}}
    assert [v.field for v in pol.check_spec(run(**spec).spec, POLICY, WORKER)] == [
        "spec.model.volume.hostPath"
    ]
    pt = {
        "volumes": [{"name": "extra", "hostPath": {"path": path}}],
        "volumeMounts": [{"name": "extra", "mountPath": "/mnt/extra"}],
    }
    fields = [v.field for v in pol.check_spec(run(podTemplate=pt).spec, POLICY, WORKER)]
    assert "spec.podTemplate.volumes[0].hostPath" in fields


def test_a_plain_host_path_below_the_prefix_still_passes():
    spec = {"model": {"path": "m", "volume": {"hostPath": "/srv/models/qwen"}}}
    assert pol.check_spec(run(**spec).spec, POLICY, WORKER) == []
