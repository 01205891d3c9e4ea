"""MonitoringStack's objects as data (components/monitoring_stack/manifests.py), without Pulumi.

The PromQL in the dashboard and the rules is checked with Prometheus' own code in
tests/monitoring_stack/test_promql.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.gpu_resources import GpuResources
from components.handoffs import DcgmTarget
from components.monitoring_stack.manifests import (
    CERT_NOT_AFTER_METRIC,
    DCGM_ABSENCE_GROUP,
    DCGM_JOB,
    GRAFANA_PASSWORD_KEY,
    GRAFANA_USER_KEY,
    dashboard_config_map,
    dcgm_endpoint,
    dcgm_service_monitor,
    gate_rule_groups,
    gpu_alerts_rule,
    gpu_dashboard,
    gpu_resource_regex,
    grafana_admin_secret,
    grafana_secret_prerequisites,
    kube_state_metrics_label,
    kube_state_metrics_resource,
    monitoring_namespace,
    monitoring_namespace_needs,
    prometheus_rule,
    rule_groups,
    stack_values,
)
from components.monitoring_stack.settings import MonitoringStackSettings

PART_OF = {"app.kubernetes.io/part-of": "gpu-cluster"}
WHOLE = GpuResources(names=("nvidia.com/gpu",), prefixes=())


@pytest.mark.parametrize(
    ("resource", "label"),
    [
        ("nvidia.com/gpu", "nvidia_com_gpu"),
        ("nvidia.com/gpu.shared", "nvidia_com_gpu_shared"),
        ("nvidia.com/mig-1g.10gb", "nvidia_com_mig_1g_10gb"),
        ("gpu.intel.com/i915", "gpu_intel_com_i915"),
    ],
)
def test_kube_state_metrics_resource_replaces_every_other_character(
    resource: str, label: str
) -> None:
    assert kube_state_metrics_resource(resource) == label


@pytest.mark.parametrize(
    ("names", "prefixes", "regex"),
    [
        (("nvidia.com/gpu",), (), "nvidia_com_gpu"),
        (
            ("nvidia.com/gpu", "nvidia.com/gpu.shared"),
            (),
            "nvidia_com_gpu|nvidia_com_gpu_shared",
        ),
        (("nvidia.com/gpu",), ("nvidia.com/mig-",), "nvidia_com_gpu|nvidia_com_mig_.+"),
        (("nvidia.com/gpu", "nvidia.com/gpu"), (), "nvidia_com_gpu"),
    ],
)
def test_gpu_resource_regex_names_and_prefixes(
    names: tuple[str, ...], prefixes: tuple[str, ...], regex: str
) -> None:
    assert gpu_resource_regex(GpuResources(names=names, prefixes=prefixes)) == regex


@pytest.mark.parametrize(
    ("settings", "path", "expected"),
    [
        ({}, ("crds",), {"enabled": True, "upgradeJob": {"enabled": True}}),
        ({"upgradeCRDs": False}, ("crds", "upgradeJob"), {"enabled": False}),
        (
            {},
            ("grafana", "admin"),
            {"existingSecret": "s", "userKey": "admin-user", "passwordKey": "admin-password"},
        ),
        (
            {},
            ("grafana", "sidecar", "dashboards"),
            {"enabled": True, "label": "grafana_dashboard", "labelValue": "1"},
        ),
        ({}, ("prometheus", "prometheusSpec", "ruleSelectorNilUsesHelmValues"), False),
        (
            {"values": {"grafana": {"admin": {"userKey": "u"}}}},
            ("grafana", "admin", "userKey"),
            "u",
        ),
        ({"values": {"alertmanager": {"enabled": False}}}, ("alertmanager",), {"enabled": False}),
    ],
)
def test_stack_values_from_settings(
    settings: dict[str, Any], path: tuple[str, ...], expected: Any
) -> None:
    value: Any = stack_values(MonitoringStackSettings(**settings), "s")
    for key in path:
        value = value[key]
    assert value == expected


@pytest.mark.parametrize(
    ("key", "label"),
    [
        ("nvidia.com/gpu.deploy.operands", "label_nvidia_com_gpu_deploy_operands"),
        ("topology.kubernetes.io/zone", "label_topology_kubernetes_io_zone"),
        ("example.com/nodeGroup", "label_example_com_node_group"),
    ],
)
def test_kube_state_metrics_label_sanitises_then_snake_cases(key: str, label: str) -> None:
    assert kube_state_metrics_label(key) == label


OPERANDS = "nvidia.com/gpu.deploy.operands"


@pytest.mark.parametrize(
    ("user", "allowlist"),
    [
        (None, [f"nodes=[{OPERANDS}]"]),
        ([], [f"nodes=[{OPERANDS}]"]),
        (["pods=[app]"], ["pods=[app]", f"nodes=[{OPERANDS}]"]),
        (
            ["nodes=[topology.kubernetes.io/zone],pods=[app]"],
            [f"nodes=[topology.kubernetes.io/zone,{OPERANDS}]", "pods=[app]"],
        ),
        # kube-state-metrics keeps the last group of a resource named twice.
        (["nodes=[a]", "nodes=[b]"], [f"nodes=[b,{OPERANDS}]"]),
        ([f"nodes=[{OPERANDS},a]"], [f"nodes=[{OPERANDS},a]"]),
        (["nodes=[*]"], ["nodes=[*]"]),
    ],
    ids=["default", "empty", "pods-only", "user-node-labels", "node-group-twice", "has-it", "all"],
)
def test_stack_values_allow_list_the_operands_label_beside_the_users(
    user: list[str] | None, allowlist: list[str]
) -> None:
    """kube_node_labels carries nvidia.com/gpu.deploy.operands, which the GPU alerts read,
    whatever the user allow-lists: one `nodes` group, since a second would replace the first."""
    values = {} if user is None else {"kube-state-metrics": {"metricLabelsAllowlist": user}}
    chart = stack_values(MonitoringStackSettings(values=values), "s")["kube-state-metrics"]
    assert chart["metricLabelsAllowlist"] == allowlist


def test_stack_values_keep_the_users_other_kube_state_metrics_values() -> None:
    values = {"kube-state-metrics": {"resources": {"limits": {"memory": "256Mi"}}}}
    chart = stack_values(MonitoringStackSettings(values=values), "s")["kube-state-metrics"]
    assert chart == {
        "resources": {"limits": {"memory": "256Mi"}},
        "metricLabelsAllowlist": [f"nodes=[{OPERANDS}]"],
    }


def test_rule_groups_leave_out_nodes_labelled_without_operands() -> None:
    """The three alerts that ask which nodes should have GPUs read the operator's label as
    kube-state-metrics exports it."""
    matcher = 'kube_node_labels{label_nvidia_com_gpu_deploy_operands="false"}'
    scoped = [r["alert"] for g in rule_groups(WHOLE) for r in g["rules"] if matcher in r["expr"]]
    assert scoped == [
        "GpuNodeNoAllocatableGpus",
        "GpuNodeMetricsMissing",
        "DcgmExporterTargetsMissing",
    ]


def test_monitoring_namespace_is_the_stacks_and_admits_the_node_exporter() -> None:
    assert monitoring_namespace("monitoring")["metadata"] == {
        "name": "monitoring",
        "labels": {**PART_OF, "pod-security.kubernetes.io/enforce": "privileged"},
    }


def test_monitoring_namespace_asks_an_existing_one_for_pod_security_privileged() -> None:
    """The part-of label is the stack's bookkeeping: a namespace the layer uses without
    creating it (createNamespace false) needs only the level the node exporter runs at."""
    (needed,) = monitoring_namespace_needs()
    assert (needed.key, needed.value) == ("pod-security.kubernetes.io/enforce", "privileged")
    assert "node-exporter" in needed.why


def test_grafana_admin_secret_holds_the_password_as_given() -> None:
    password = object()  # the component hands in a Pulumi secret: passed through untouched
    secret = grafana_admin_secret("monitoring", password)
    assert secret["metadata"] == {
        "name": "grafana-admin",
        "namespace": "monitoring",
        "labels": PART_OF,
    }
    assert secret["type"] == "Opaque"
    assert secret["stringData"] == {"admin-user": "admin", "admin-password": password}


def test_dashboard_config_map_is_labelled_for_the_sidecar() -> None:
    dashboard = gpu_dashboard(WHOLE)
    config_map = dashboard_config_map(dashboard, "monitoring")
    assert config_map["metadata"] == {
        "name": "gpu-dashboard",
        "namespace": "monitoring",
        "labels": {**PART_OF, "grafana_dashboard": "1"},
    }
    assert json.loads(config_map["data"]["gpu.json"]) == dashboard


@pytest.mark.parametrize(
    ("dcgm_scraped", "groups"),
    [
        (True, ["gpu-cluster.gpu", DCGM_ABSENCE_GROUP]),
        (False, ["gpu-cluster.gpu"]),
    ],
)
def test_gpu_alerts_rule_drops_the_absence_group_without_dcgm(
    dcgm_scraped: bool, groups: list[str]
) -> None:
    rule = gpu_alerts_rule(WHOLE, "monitoring", dcgm_scraped=dcgm_scraped)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"] == {"name": "gpu-alerts", "namespace": "monitoring", "labels": PART_OF}
    assert [g["name"] for g in rule["spec"]["groups"]] == groups
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all("$" not in e for e in exprs)


@pytest.mark.parametrize(
    ("not_after", "epoch"),
    [
        ("2030-01-01T00:00:00Z", 1893456000),
        ("2030-01-01T01:00:00+01:00", 1893456000),
    ],
)
def test_gate_rule_groups_publish_the_expiry_first(not_after: str, epoch: int) -> None:
    published, *alerts = gate_rule_groups(not_after)
    assert published["rules"] == [
        {
            "record": CERT_NOT_AFTER_METRIC,
            "expr": f"vector({epoch})",
            "labels": {"certificate": "opa-serving"},
        }
    ]
    assert [g["name"] for g in alerts] == ["gpu-cluster.gate"]


def test_prometheus_rule_wraps_its_groups() -> None:
    rule = prometheus_rule("gpu-gate-alerts", "monitoring", [{"name": "g", "rules": []}])
    assert rule == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gpu-gate-alerts", "namespace": "monitoring", "labels": PART_OF},
        "spec": {"groups": [{"name": "g", "rules": []}]},
    }


@pytest.mark.parametrize(
    ("selector", "target", "port", "interval"),
    [
        ({"app": "nvidia-dcgm-exporter"}, "gpu-operator", "gpu-metrics", "15s"),
        ({"app": "dcgm", "tier": "gpu"}, "nvidia", "metrics", "1m"),
    ],
)
def test_dcgm_service_monitor_selects_the_exporter_service(
    selector: dict[str, str], target: str, port: str, interval: str
) -> None:
    monitor = dcgm_service_monitor(
        "monitoring", DcgmTarget(namespace=target, selector=selector, port=port), interval
    )
    assert (monitor["apiVersion"], monitor["kind"]) == (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    )
    assert monitor["metadata"] == {
        "name": "dcgm-exporter",
        "namespace": "monitoring",
        "labels": PART_OF,
    }
    assert monitor["spec"] == {
        "selector": {"matchLabels": selector},
        "namespaceSelector": {"matchNames": [target]},
        "endpoints": [dcgm_endpoint(port, interval)],
    }
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["interval"], endpoint["honorLabels"]) == (
        port,
        interval,
        False,
    )
    assert {"targetLabel": "job", "replacement": DCGM_JOB, "action": "replace"} in endpoint[
        "relabelings"
    ]


def test_grafana_secret_prerequisites_are_what_the_layer_reads() -> None:
    namespace, secret = grafana_secret_prerequisites("metrics", "grafana-admin", "pw")
    assert namespace == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "metrics",
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
        },
    }
    assert secret["metadata"] == {"name": "grafana-admin", "namespace": "metrics"}
    assert secret["stringData"] == {GRAFANA_USER_KEY: "admin", GRAFANA_PASSWORD_KEY: "pw"}
