"""MonitoringStack under Pulumi mocks, alone and wired into the whole program.

The dashboard and rule files themselves are checked with Prometheus' parser and promtool in
tests/monitoring_stack/test_promql.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from components import ClusterAccess, DcgmTarget, MonitoringStack, MonitoringStackArgs
from components.gpu_operator.settings import (
    DCGM_PORT_NAME,
    DCGM_SERVICE_SELECTOR,
    GpuOperatorSettings,
)
from components.gpu_resources import GpuResources
from components.monitoring_stack.manifests import (
    gpu_dashboard,
    gpu_resource_regex,
    rule_groups,
)
from components.monitoring_stack.settings import DEFAULT_VERSION
from stack_config import ConfigError
from tests.conftest import Recording, Registration, component_access, register, run_program
from tests.fake_cluster import claimed_cluster

RELEASE = "kubernetes:helm.sh/v3:Release"
SERVICE_MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
PASSWORD = "correct-horse-battery-staple"
# A label matcher on `resource` in PromQL.
_RESOURCE_MATCHER = re.compile(r'\bresource\s*(?:=~|!~|!=|=)\s*"[^"]*"')
# What the stack monitors when no GPU resources are handed in: whole GPUs only.
_PLAIN_GPUS = GpuResources(names=("nvidia.com/gpu",), prefixes=())


@pytest.fixture
def kubeconfig(empty_kubeconfig_env: Path) -> None:
    """Program runs read this throwaway kubeconfig, never the developer's."""


def _make_monitoring_stack(**overrides: Any) -> Recording:
    def build() -> None:
        access = component_access()
        args: dict[str, Any] = {
            "access": access,
            "grafana_admin_password": PASSWORD,
            "dcgm": DcgmTarget(
                namespace="gpu-operator", selector=DCGM_SERVICE_SELECTOR, port=DCGM_PORT_NAME
            ),
            **overrides,
        }
        MonitoringStack("mon", MonitoringStackArgs(**args))

    return register(build)


def _release(recording: Recording, name: str = "mon-release") -> Registration:
    return recording.named(name)


def _plain_inputs_text(recording: Recording) -> str:
    """Every input that is not marked secret, as one JSON text."""
    return json.dumps(
        [
            {k: v for k, v in r.inputs.items() if k not in r.secret_inputs}
            for r in recording.resources
        ],
        default=str,
    )


def test_monitoring_stack_chart_is_pinned_by_default() -> None:
    release = _release(_make_monitoring_stack())
    assert release.inputs["chart"] == "kube-prometheus-stack"
    assert release.inputs["version"] == DEFAULT_VERSION == "88.2.0"
    assert release.inputs["repositoryOpts"] == {
        "repo": "https://prometheus-community.github.io/helm-charts"
    }


def test_monitoring_stack_prometheus_selects_every_monitor_and_rule() -> None:
    spec = _release(_make_monitoring_stack()).inputs["values"]["prometheus"]["prometheusSpec"]
    assert spec["serviceMonitorSelectorNilUsesHelmValues"] is False
    assert spec["podMonitorSelectorNilUsesHelmValues"] is False
    assert spec["ruleSelectorNilUsesHelmValues"] is False


def test_monitoring_stack_grafana_password_is_a_secret_and_never_plain() -> None:
    recording = _make_monitoring_stack()
    secret = recording.named("mon-grafana-admin")
    assert "stringData" in secret.secret_inputs
    assert secret.inputs["stringData"]["value"]["admin-password"] == PASSWORD  # one secret map
    assert PASSWORD not in _plain_inputs_text(recording)
    admin = _release(recording).inputs["values"]["grafana"]["admin"]
    assert admin == {
        "existingSecret": secret.inputs["metadata"]["name"],
        "userKey": "admin-user",
        "passwordKey": "admin-password",
    }
    assert secret.urn in _release(recording).dependencies


def test_monitoring_stack_existing_secret_creates_no_secret() -> None:
    recording = _make_monitoring_stack(
        grafana_admin_password=None, grafana_admin_secret="grafana-x"
    )
    assert recording.of_type("kubernetes:core/v1:Secret") == []
    admin = _release(recording).inputs["values"]["grafana"]["admin"]
    assert admin["existingSecret"] == "grafana-x"


def test_monitoring_stack_leaves_an_existing_namespace_to_its_owner() -> None:
    """createNamespace false (the Secret was created in a namespace made beforehand): no
    Namespace is declared, and the release goes into the existing one."""
    existing = _make_monitoring_stack(
        grafana_admin_password=None, grafana_admin_secret="g", create_namespace=False
    )
    assert existing.of_type("kubernetes:core/v1:Namespace") == []
    assert _release(existing).inputs["namespace"] == "monitoring"
    created = _make_monitoring_stack()
    (namespace,) = created.of_type("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["name"] == "monitoring"


@pytest.mark.parametrize(
    ("password", "secret"), [(None, None), (PASSWORD, "grafana-admin")], ids=["none", "both"]
)
def test_monitoring_stack_needs_exactly_one_password_source(
    password: str | None, secret: str | None
) -> None:
    access = ClusterAccess.__new__(ClusterAccess)
    with pytest.raises(ValueError, match="set exactly one of grafana_admin_password"):
        MonitoringStackArgs(
            access=access, grafana_admin_password=password, grafana_admin_secret=secret
        )


def test_monitoring_stack_grafana_sidecar_loads_the_labelled_dashboard() -> None:
    recording = _make_monitoring_stack()
    sidecar = _release(recording).inputs["values"]["grafana"]["sidecar"]["dashboards"]
    assert sidecar == {"enabled": True, "label": "grafana_dashboard", "labelValue": "1"}
    dashboard = recording.named("mon-gpu-dashboard")
    assert dashboard.inputs["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard.inputs["data"]["gpu.json"]) == gpu_dashboard(_PLAIN_GPUS)


def test_monitoring_stack_dcgm_service_monitor_keeps_workload_labels_apart_from_the_exporters() -> (
    None
):
    """honorLabels false: the target's pod/namespace/container (the exporter pod) are set on
    every series, and dcgm-exporter's own, naming the workload using a GPU, become exported_*;
    with honorLabels true an idle GPU, which has none, took the exporter pod's as its workload.
    The job is fixed, for the alerts that notice it missing."""
    (monitor,) = _make_monitoring_stack().of_type(SERVICE_MONITOR)
    spec = monitor.inputs["spec"]
    assert spec["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    assert spec["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == "gpu-metrics"
    assert endpoint["honorLabels"] is False
    assert endpoint["relabelings"] == [
        {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
            "action": "replace",
        },
        {"targetLabel": "job", "replacement": "dcgm-exporter", "action": "replace"},
    ]
    assert endpoint["metricRelabelings"] == [{"action": "labeldrop", "regex": "Hostname"}]


def test_monitoring_stack_custom_resources_come_after_the_release() -> None:
    recording = _make_monitoring_stack()
    release = _release(recording)
    (monitor,) = recording.of_type(SERVICE_MONITOR)
    (rule,) = recording.of_type(PROMETHEUS_RULE)
    assert release.urn in monitor.dependencies
    assert release.urn in rule.dependencies


def test_monitoring_stack_rule_carries_the_rendered_rule_file() -> None:
    (rule,) = _make_monitoring_stack().of_type(PROMETHEUS_RULE)
    assert rule.inputs["spec"] == {"groups": rule_groups(_PLAIN_GPUS)}
    alerts = {r["alert"] for g in rule.inputs["spec"]["groups"] for r in g["rules"]}
    assert alerts == {
        "GpuXidError",
        "GpuXidApplicationError",
        "GpuTemperatureHigh",
        "GpuPodPendingTooLong",
        "GpuNodeNoAllocatableGpus",
        "GpuNodeMetricsMissing",
        "DcgmExporterTargetsMissing",
    }
    assert "$" not in json.dumps([r["expr"] for g in rule_groups(_PLAIN_GPUS) for r in g["rules"]])


def test_monitoring_stack_without_dcgm_has_no_service_monitor() -> None:
    recording = _make_monitoring_stack(dcgm=None)
    assert recording.of_type(SERVICE_MONITOR) == []
    assert recording.of_type(PROMETHEUS_RULE)


def test_monitoring_stack_without_dcgm_does_not_alert_on_missing_dcgm_metrics() -> None:
    """Without dcgm-exporter (operator off, or its exporter disabled) nothing scrapes it, and
    alerts on its absence would fire for good."""
    (rule,) = _make_monitoring_stack(dcgm=None).of_type(PROMETHEUS_RULE)
    alerts = {r["alert"] for g in rule.inputs["spec"]["groups"] for r in g["rules"]}
    assert "GpuNodeMetricsMissing" not in alerts
    assert "DcgmExporterTargetsMissing" not in alerts
    assert "GpuNodeNoAllocatableGpus" in alerts


def test_monitoring_stack_missing_metrics_alerts_select_the_service_monitors_job() -> None:
    recording = _make_monitoring_stack()
    (monitor,) = recording.of_type(SERVICE_MONITOR)
    (job,) = [
        r["replacement"]
        for r in monitor.inputs["spec"]["endpoints"][0]["relabelings"]
        if r["targetLabel"] == "job"
    ]
    (rule,) = recording.of_type(PROMETHEUS_RULE)
    rules = {r["alert"]: r["expr"] for g in rule.inputs["spec"]["groups"] for r in g["rules"]}
    assert f'up{{job="{job}"}}' in rules["DcgmExporterTargetsMissing"]
    assert f'DCGM_FI_DEV_GPU_TEMP{{job="{job}"}}' in rules["GpuNodeMetricsMissing"]


@pytest.mark.parametrize(
    ("operator", "regex"),
    [
        ({}, "nvidia_com_gpu"),
        (
            {
                "devicePlugin": {"timeSlicing": {"replicas": 4, "renameByDefault": True}},
                "mig": {"strategy": "none"},
            },
            "nvidia_com_gpu|nvidia_com_gpu_shared",
        ),
        ({"mig": {"strategy": "mixed"}}, "nvidia_com_gpu|nvidia_com_mig_.+"),
    ],
    ids=["whole", "time-slicing-renamed", "mig-mixed"],
)
def test_monitoring_stack_gpu_resource_regex_uses_kube_state_metrics_names(
    operator: dict[str, Any], regex: str
) -> None:
    """kube-state-metrics exports `nvidia.com/gpu.shared` as `nvidia_com_gpu_shared` and each
    MIG profile (`nvidia.com/mig-1g.10gb`) as `nvidia_com_mig_1g_10gb`."""
    resources = GpuOperatorSettings.model_validate({"enabled": True, **operator}).gpu_resources()
    assert gpu_resource_regex(resources) == regex


def test_monitoring_stack_rules_and_dashboard_select_the_operators_gpu_resources() -> None:
    """Pods asking for time-sliced or MIG GPUs count in alerts and panels as the gate and the
    scheduler count them: the resource names come from the GPU Operator's settings."""
    resources = GpuResources(
        names=("nvidia.com/gpu", "nvidia.com/gpu.shared"), prefixes=("nvidia.com/mig-",)
    )
    selector = 'resource=~"nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_mig_.+"'
    recording = _make_monitoring_stack(gpu_resources=resources)
    (rule,) = recording.of_type(PROMETHEUS_RULE)
    exprs = [r["expr"] for g in rule.inputs["spec"]["groups"] for r in g["rules"]]
    matchers = [m for e in exprs for m in _RESOURCE_MATCHER.findall(e)]
    assert len(matchers) == 4
    assert set(matchers) == {selector}
    dashboard = json.loads(recording.named("mon-gpu-dashboard").inputs["data"]["gpu.json"])
    (constant,) = [v for v in dashboard["templating"]["list"] if v["type"] == "constant"]
    assert constant["query"] == "nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_mig_.+"
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [
        v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"
    ]
    matchers = [m for e in queries for m in _RESOURCE_MATCHER.findall(e)]
    assert len(matchers) == 6
    assert set(matchers) == {f'resource=~"${constant["name"]}"'}


def test_monitoring_stack_free_form_values_are_merged_last() -> None:
    values = _release(
        _make_monitoring_stack(values={"grafana": {"sidecar": {"dashboards": {"enabled": False}}}})
    ).inputs["values"]
    assert values["grafana"]["sidecar"]["dashboards"]["enabled"] is False
    assert values["grafana"]["sidecar"]["dashboards"]["label"] == "grafana_dashboard"


def test_monitoring_stack_kube_state_metrics_exports_the_label_the_gpu_alerts_read() -> None:
    """The GPU alerts leave out nodes labelled nvidia.com/gpu.deploy.operands=false, which
    kube_node_labels carries only once allow-listed; the user's own entries stay."""
    values = _release(
        _make_monitoring_stack(
            values={"kube-state-metrics": {"metricLabelsAllowlist": ["nodes=[kubernetes.io/os]"]}}
        )
    ).inputs["values"]
    assert values["kube-state-metrics"]["metricLabelsAllowlist"] == [
        "nodes=[kubernetes.io/os,nvidia.com/gpu.deploy.operands]"
    ]
    (rule,) = _make_monitoring_stack().of_type(PROMETHEUS_RULE)
    exprs = [r["expr"] for g in rule.inputs["spec"]["groups"] for r in g["rules"]]
    assert sum('label_nvidia_com_gpu_deploy_operands="false"' in e for e in exprs) == 3


# --------------------------------------------------------------------------- the whole program


def _dcgm_monitors(recording: Recording) -> list[Registration]:
    return [
        m
        for m in recording.of_type(SERVICE_MONITOR)
        if m.inputs["spec"]["selector"]["matchLabels"].get("app") == "nvidia-dcgm-exporter"
    ]


@pytest.mark.usefixtures("kubeconfig")
def test_monitoring_stack_dev_program_has_exactly_one_dcgm_service_monitor() -> None:
    recording = run_program("dev")
    (monitor,) = _dcgm_monitors(recording)
    operator = recording.named("gpu-operator-release")
    # The chart's own ServiceMonitor stays off, so this is the only one.
    assert operator.inputs["values"]["dcgmExporter"]["serviceMonitor"] == {"enabled": False}
    assert monitor.inputs["spec"]["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    # Its namespace is the operator release's, and its CRD comes with the stack's release.
    assert operator.urn in monitor.dependencies
    assert recording.named("monitoring-release").urn in monitor.dependencies


@pytest.mark.usefixtures("kubeconfig")
def test_monitoring_stack_dev_program_orders_the_operator_after_the_pool() -> None:
    recording = run_program("dev")
    operator = recording.named("gpu-operator-release")
    (pool,) = recording.of_type("pulumi-python:dynamic/gpu-cluster:GpuPoolNodes")
    assert pool.urn in operator.dependencies
    tolerations = operator.inputs["values"]["daemonsets"]["tolerations"]
    assert tolerations == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    ]
    assert recording.outputs["gpuOperatorNamespace"] == "gpu-operator"
    assert recording.outputs["dcgmServiceMonitor"] == "dcgm-exporter"


@pytest.mark.usefixtures("kubeconfig")
def test_monitoring_stack_program_password_from_config_stays_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # How the CLI tells the program which config values were stored with --secret.
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", '["gpu-cluster:grafanaAdminPassword"]')
    recording = run_program(
        "prod",
        {
            "monitoring": {"enabled": True},
            "grafanaAdminPassword": PASSWORD,
        },
        cluster=claimed_cluster(),
    )
    secret = recording.named("monitoring-grafana-admin")
    assert "stringData" in secret.secret_inputs
    assert PASSWORD not in _plain_inputs_text(recording)
    assert PASSWORD not in json.dumps(recording.outputs, default=str)


@pytest.mark.usefixtures("kubeconfig")
def test_monitoring_stack_prod_program_hands_mig_and_driver_values_to_the_chart() -> None:
    values = run_program("prod").named("gpu-operator-release").inputs["values"]
    assert values["driver"]["enabled"] is True
    assert values["mig"] == {"strategy": "single"}
    assert {"name": "CONTAINERD_SET_AS_DEFAULT", "value": "true"} in values["toolkit"]["env"]
    assert values["daemonsets"]["tolerations"][0]["effect"] == "NoSchedule"


@pytest.mark.usefixtures("kubeconfig")
def test_monitoring_stack_program_refuses_a_password_stored_in_plain_text() -> None:
    recording = Recording()
    overrides = {"monitoring": {"enabled": True}, "grafanaAdminPassword": PASSWORD}
    with pytest.raises(ConfigError, match=r"grafanaAdminPassword: got '\[plain text, not shown\]'"):
        run_program("prod", overrides, recording)
    assert recording.resources == []


def test_monitoring_stack_upgrades_its_crds_before_the_release_and_the_objects_using_them() -> None:
    """Helm installs a chart's CRDs once and never upgrades them; kube-prometheus-stack's
    hook Job applies the new version's CRDs server-side before the release's objects, and the
    stack's PrometheusRule and ServiceMonitor wait for the release."""
    recording = _make_monitoring_stack()
    release = _release(recording)
    assert release.inputs["values"]["crds"] == {"enabled": True, "upgradeJob": {"enabled": True}}
    for kind in (SERVICE_MONITOR, PROMETHEUS_RULE):
        (obj,) = recording.of_type(kind)
        assert release.urn in obj.dependencies


def test_monitoring_stack_crd_upgrade_can_be_left_to_the_operator() -> None:
    values = _release(_make_monitoring_stack(upgrade_crds=False)).inputs["values"]
    assert values["crds"]["upgradeJob"] == {"enabled": False}


# OPA's serving certificate: the stack publishes its expiry and alerts before it.


def test_monitoring_stack_publishes_the_opa_certificate_expiry_with_its_alerts() -> None:
    recording = _make_monitoring_stack(opa_serving_cert_not_after="2028-11-23T11:00:00Z")
    rule = recording.named("mon-gate-alerts")
    assert rule.inputs["metadata"]["name"] == "gpu-gate-alerts"
    (published, alerts) = rule.inputs["spec"]["groups"]
    assert published["rules"] == [
        {
            "record": "gpu_cluster:opa_serving_cert_not_after:timestamp_seconds",
            # 2028-11-23T11:00:00Z in Unix seconds.
            "expr": "vector(1858590000)",
            "labels": {"certificate": "opa-serving"},
        }
    ]
    assert [r["alert"] for r in alerts["rules"]] == [
        "OpaServingCertificateExpiresSoon",
        "OpaServingCertificateExpiring",
    ]
    assert recording.named("mon-release").urn in rule.dependencies


def test_monitoring_stack_without_opa_has_no_gate_alerts() -> None:
    recording = _make_monitoring_stack()
    assert [r.name for r in recording.resources if r.name == "mon-gate-alerts"] == []
