"""The chart's metrics port, optional Service and ServiceMonitor (Helm's Go engine)."""

from __future__ import annotations

import pytest
import yaml
from chart_util import CHART, by_kind, objects, one, render, validate_k8s

helm_python = pytest.importorskip("helm_python")

METRICS_VALUES = yaml.safe_load((CHART / "ci" / "metrics-values.yaml").read_text())


def _container(objs):
    (c,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_default_serves_metrics_without_service_or_servicemonitor():
    objs = objects(render())
    c = _container(objs)
    assert "--metrics-port=8000" in c["args"]
    assert {"name": "metrics", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
    assert by_kind(objs, "Service") == [] and by_kind(objs, "ServiceMonitor") == []


def test_metrics_can_be_turned_off():
    objs = objects(render({"metrics": {"enabled": False, "port": 8000}}))
    c = _container(objs)
    assert not any(a.startswith("--metrics-port") for a in c["args"])
    assert [p["name"] for p in c["ports"]] == ["health"]


def test_service_and_servicemonitor_select_the_operator():
    objs = objects(render(METRICS_VALUES))
    dep = one(objs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = one(objs, "Service")
    validate_k8s(svc)
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (port,) = svc["spec"]["ports"]
    assert port == {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    assert "--metrics-port=9100" in _container(objs)["args"]
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}

    sm = one(objs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [svc["metadata"]["namespace"]]}
    (ep,) = sm["spec"]["endpoints"]
    assert ep == {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "5s"}
    assert sm["metadata"]["labels"]["release"] == "prometheus"


def test_service_alone():
    objs = objects(
        render({"metrics": {"enabled": True, "port": 8000, "service": {"enabled": True}}})
    )
    assert one(objs, "Service")["spec"]["ports"][0]["port"] == 8000
    assert by_kind(objs, "ServiceMonitor") == []


def test_servicemonitor_without_metrics_fails_to_render():
    with pytest.raises(Exception, match=r"metrics.serviceMonitor.enabled needs metrics.enabled"):
        render({"metrics": {"enabled": False, "port": 8000, "serviceMonitor": {"enabled": True}}})


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"metrics": {"enabled": "yes", "port": 8000}}, "/metrics/enabled"),
        ({"metrics": {"enabled": True, "port": 70000}}, "/metrics/port"),
        (
            {"metrics": {"enabled": True, "port": 8000, "serviceMonitor": {"interval": "often"}}},
            "interval",
        ),
        ({"metrics": {"enabled": True, "port": 8000, "servicemonitor": {}}}, "servicemonitor"),
    ],
)
def test_values_schema_types_the_metrics_values(values, needle):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert needle in str(err.value)
