"""The GPU dashboard and alerts with allocation dra, checked with Prometheus' own code, and the
kube-state-metrics configuration that exports what they read.

The series are written as kube-state-metrics' custom resource state exports them from the
stack's configuration (components/monitoring_stack/gpu_series.py): metric <prefix>_<name>,
customresource_group/_version/_kind on every series, the configured labels, value 1.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from components.monitoring_stack import gpu_series
from components.monitoring_stack.manifests import (
    RULES_FILE,
    gpu_dashboard,
    rule_groups,
    stack_values,
)
from components.monitoring_stack.settings import MonitoringStackSettings
from tests.monitoring_stack.test_promql import (
    DRA_CLASSES,
    DRA_RESOURCES,
    METRICS_FIXTURE,
    _panel_expr,
    _promtool_expr,
    _run,
    promtool,
)

__all__ = ["promtool"]  # the fixture, used by name

DRA_TEST_FILE = RULES_FILE.with_name("gpu.rules.dra.test.yaml")
SLICE = (
    'customresource_group="resource.k8s.io", customresource_kind="ResourceSlice", '
    'customresource_version="v1"'
)
CLAIM = (
    'customresource_group="resource.k8s.io", customresource_kind="ResourceClaim", '
    'customresource_version="v1"'
)


def _dashboard() -> dict[str, Any]:
    return gpu_dashboard(DRA_RESOURCES, allocation="dra", device_classes=DRA_CLASSES)


def _rendered_dra_rules(tmp_path: Path, rules_text: str | None = None) -> Path:
    source = RULES_FILE
    if rules_text is not None:
        source = tmp_path / "source.rules.yaml"
        source.write_text(rules_text)
    groups = rule_groups(DRA_RESOURCES, allocation="dra", device_classes=DRA_CLASSES, path=source)
    (tmp_path / RULES_FILE.name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(DRA_TEST_FILE, tmp_path / DRA_TEST_FILE.name)
    return tmp_path / DRA_TEST_FILE.name


def _dra_values(**values: Any) -> dict[str, Any]:
    settings = MonitoringStackSettings.model_validate({"values": values})
    return stack_values(settings, "grafana-admin", "dra")


def test_promql_dra_rules_read_no_node_allocatable() -> None:
    """No node advertises a GPU under DRA: nothing may depend on node capacity/allocatable."""
    text = yaml.safe_dump(rule_groups(DRA_RESOURCES, allocation="dra", device_classes=DRA_CLASSES))
    dashboard = yaml.safe_dump(_dashboard())
    for rendered in (text, dashboard):
        assert "kube_node_status_" not in rendered
        assert "$gpus_" not in rendered
        assert gpu_series.DEVICE_METRIC in rendered


def test_promql_dra_device_plugin_mode_is_the_default() -> None:
    resources = DRA_RESOURCES
    assert rule_groups(resources) == rule_groups(resources, allocation="device-plugin")
    assert gpu_dashboard(resources) == gpu_dashboard(resources, allocation="device-plugin")
    settings = MonitoringStackSettings()
    assert stack_values(settings, "s") == stack_values(settings, "s", "device-plugin")
    assert "customResourceState" not in stack_values(settings, "s")["kube-state-metrics"]


def test_promql_dra_promtool_checks_the_rules_as_deployed(promtool: Path, tmp_path: Path) -> None:
    deployed = tmp_path / "gpu.rules.yaml"
    groups = rule_groups(DRA_RESOURCES, allocation="dra", device_classes=DRA_CLASSES)
    deployed.write_text(yaml.safe_dump({"groups": groups}))
    result = _run(promtool, "check", "rules", "--lint=all", "--lint-fatal", deployed)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promql_dra_promtool_unit_tests_fire_each_alert(promtool: Path, tmp_path: Path) -> None:
    result = _run(promtool, "test", "rules", _rendered_dra_rules(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promql_dra_unit_tests_catch_alerts_on_nodes_taken_out_on_purpose(
    promtool: Path, tmp_path: Path
) -> None:
    changed = RULES_FILE.read_text().replace(
        "$gpus_unusable_nodes\n          unless on (node)\n          kube_node_labels{$operands_disabled}",
        "$gpus_unusable_nodes",
    )
    assert changed != RULES_FILE.read_text()
    result = _run(promtool, "test", "rules", _rendered_dra_rules(tmp_path, changed))
    assert result.returncode != 0
    assert "gpu-2" in result.stdout + result.stderr


def test_promql_dra_capacity_panels_count_published_and_allocated_devices(
    promtool: Path, tmp_path: Path
) -> None:
    """Per node and resource (gpu, mig-<profile>): devices the driver publishes, and those
    allocated to workloads' claims; dcgm-exporter's admin-access claim on every GPU and
    another driver's devices count for nothing."""
    dashboard = _dashboard()
    series: dict[str, str] = {}
    devices = {
        "gpu-1": [("gpu-0", "gpu", ""), ("gpu-1", "gpu", ""), ("gpu-2", "gpu", "")],
        "gpu-2": [("mig-1g-10gb-0", "mig", "1g.10gb"), ("mig-1g-10gb-1", "mig", "1g.10gb")],
    }
    for node, listed in devices.items():
        for device, kind, profile in listed:
            labels = f'{SLICE}, node="{node}", driver="gpu.nvidia.com", pool="{node}", device="{device}", type="{kind}"'
            if profile:
                labels += f', profile="{profile}"'
            series[f"{gpu_series.DEVICE_METRIC}{{{labels}}}"] = "1x2"
            # dcgm-exporter's admin-access claim holds every device of its node.
            admin = f'{CLAIM}, namespace="gpu-operator", claim="dcgm-{node}", request="admin-gpus"'
            series[
                f'{gpu_series.ALLOCATED_METRIC}{{{admin}, driver="gpu.nvidia.com", pool="{node}", '
                f'device="{device}", admin_access="true"}}'
            ] = "1x2"
    series[
        f'{gpu_series.DEVICE_METRIC}{{{SLICE}, node="gpu-1", driver="nic.example.com", '
        'pool="gpu-1", device="nic-0"}'
    ] = "1x2"
    for claim, node, device in [
        ("train-0-gpu", "gpu-1", "gpu-0"),
        ("train-1-gpu", "gpu-1", "gpu-2"),
        ("infer-0-mig", "gpu-2", "mig-1g-10gb-1"),
    ]:
        workload = f'{CLAIM}, namespace="ml", claim="{claim}", request="gpu"'
        series[
            f'{gpu_series.ALLOCATED_METRIC}{{{workload}, driver="gpu.nvidia.com", pool="{node}", '
            f'device="{device}"}}'
        ] = "1x2"
    capacity = {
        '{node="gpu-1", resource="gpu"}': 3.0,
        '{node="gpu-2", resource="mig-1g.10gb"}': 2.0,
    }
    allocated = {
        '{node="gpu-1", resource="gpu"}': 2.0,
        '{node="gpu-2", resource="mig-1g.10gb"}': 1.0,
    }
    free = {k: capacity[k] - allocated[k] for k in capacity}
    for title, ref_id, expected in [
        ("Allocated vs allocatable GPUs per node and resource", "A", capacity),
        ("Allocated vs allocatable GPUs per node and resource", "B", allocated),
        ("Free GPUs per node and resource", "A", free),
    ]:
        expr = _panel_expr(dashboard, title, ref_id)
        result = _promtool_expr(promtool, tmp_path, series, expr, expected)
        assert result.returncode == 0, f"{title} {ref_id}: {result.stdout}{result.stderr}"


def test_promql_dra_values_add_custom_resource_state_to_the_users() -> None:
    own = {"groupVersionKind": {"group": "example.com", "version": "v1", "kind": "Foo"}}
    rule = {"apiGroups": ["example.com"], "resources": ["foos"], "verbs": ["list", "watch"]}
    chart = _dra_values(
        **{
            "kube-state-metrics": {
                "customResourceState": {"config": {"spec": {"resources": [own]}}},
                "rbac": {"extraRules": [rule]},
            }
        }
    )["kube-state-metrics"]
    config = chart["customResourceState"]
    assert config["enabled"] is True
    resources = config["config"]["spec"]["resources"]
    assert resources[0] == own
    kinds = {r["groupVersionKind"]["kind"] for r in resources[1:]}
    assert kinds == {"ResourceSlice", "ResourceClaim"}
    assert chart["rbac"]["extraRules"][0] == rule
    # The allow-listed node label the alerts read stays.
    assert chart["metricLabelsAllowlist"] == ["nodes=[nvidia.com/gpu.deploy.operands]"]


def test_promql_dra_kube_state_metrics_may_only_list_and_watch_what_it_exports() -> None:
    chart = _dra_values()["kube-state-metrics"]
    rules = chart["rbac"]["extraRules"]
    assert {verb for r in rules for verb in r["verbs"]} == {"list", "watch"}
    read = {
        (group, resource) for r in rules for group in r["apiGroups"] for resource in r["resources"]
    }
    exported = {
        ("resource.k8s.io", r["groupVersionKind"]["kind"].lower() + "s")
        for r in chart["customResourceState"]["config"]["spec"]["resources"]
    }
    assert read == exported
    assert "collectors" not in chart  # the chart's default --resources stay


def test_promql_dra_fixture_names_the_metrics_the_configuration_exports() -> None:
    known = yaml.safe_load(METRICS_FIXTURE.read_text())["metrics"]
    from_fixture = {
        name
        for name, entry in known.items()
        if entry["source"] == "kube-state-metrics custom resource state"
    }
    assert from_fixture == gpu_series.exported_metrics()
    # Every label the rules and dashboard match on these metrics is one the configuration sets.
    config = gpu_series.custom_resource_state()["spec"]["resources"]
    labels = {"customresource_group", "customresource_version", "customresource_kind"}
    for resource in config:
        labels |= set(resource["labelsFromPath"])
        for metric in resource["metrics"]:
            labels |= set(metric.get("labelsFromPath", {}))
            labels |= set(metric["each"]["info"]["labelsFromPath"])
    rendered = yaml.safe_dump(
        rule_groups(DRA_RESOURCES, allocation="dra", device_classes=DRA_CLASSES)
    ) + yaml.safe_dump(_dashboard())
    for used in ("admin_access", "device_class", "pod", "driver", "pool", "device", "type"):
        assert used in labels and used in rendered, used
