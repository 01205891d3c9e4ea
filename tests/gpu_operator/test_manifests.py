"""The GPU Operator's objects as data (components/gpu_operator/manifests.py), without Pulumi."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from components.charts import deep_merge
from components.gpu_operator.manifests import (
    TIME_SLICING_KEY,
    operator_namespace,
    operator_namespace_needs,
    operator_values,
    time_slicing_config,
    time_slicing_config_map,
)
from components.gpu_operator.settings import (
    DCGM_DRA_SERVICE_SELECTOR,
    DCGM_SERVICE_SELECTOR,
    ENVVAR_WHEN_UNPRIVILEGED,
    GpuOperatorSettings,
    TimeSlicing,
    dcgm_service_selector,
)

TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}


@pytest.mark.parametrize(
    ("base", "override", "merged"),
    [
        ({"a": 1}, {}, {"a": 1}),
        ({"a": 1}, {"b": 2}, {"a": 1, "b": 2}),
        ({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}}, {"a": {"x": 1, "y": 3}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": {"x": 1}}, {"a": "flat"}, {"a": "flat"}),
        ({"a": "flat"}, {"a": {"x": 1}}, {"a": {"x": 1}}),
    ],
)
def test_deep_merge_objects_key_by_key_anything_else_replaced(
    base: dict[str, Any], override: dict[str, Any], merged: dict[str, Any]
) -> None:
    assert deep_merge(base, override) == merged


def test_deep_merge_leaves_its_inputs_alone() -> None:
    base = {"a": {"x": [1]}}
    override = {"a": {"y": [2]}}
    merged = deep_merge(base, override)
    merged["a"]["x"].append(9)
    merged["a"]["y"].append(9)
    assert base == {"a": {"x": [1]}} and override == {"a": {"y": [2]}}


def test_operator_namespace_is_privileged_and_the_stacks() -> None:
    assert operator_namespace("gpu-operator") == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "gpu-operator",
            "labels": {
                "app.kubernetes.io/part-of": "gpu-cluster",
                "pod-security.kubernetes.io/enforce": "privileged",
            },
        },
    }


def test_operator_namespace_with_dra_allows_admin_access_claims() -> None:
    """dcgm-exporter's claim on every GPU of its node is an admin-access claim, allowed only
    in a namespace with the admin-access label; nothing else changes."""
    plain = operator_namespace("gpu-operator")
    dra = operator_namespace("gpu-operator", "dra")
    labels = dra["metadata"].pop("labels")
    assert labels.pop("resource.kubernetes.io/admin-access") == "true"
    assert {**dra, "metadata": {**dra["metadata"], "labels": labels}} == plain
    assert operator_namespace("gpu-operator", "device-plugin") == plain


@pytest.mark.parametrize("allocation", ["device-plugin", "dra"])
def test_operator_namespace_carries_what_an_existing_one_must_and_the_stacks_label(
    allocation: Any,
) -> None:
    """One home for the labels the operator's pods need: the namespace the layer creates
    carries exactly those and the stack's part-of label, which alone is not asked of an
    existing namespace (createNamespace false)."""
    needs = {n.key: n.value for n in operator_namespace_needs(allocation)}
    labels = operator_namespace("gpu-operator", allocation)["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/part-of": "gpu-cluster", **needs}
    assert "app.kubernetes.io/part-of" not in needs
    assert all(n.why for n in operator_namespace_needs(allocation))


def test_dcgm_exporter_service_of_each_allocation() -> None:
    assert dcgm_service_selector("device-plugin") == DCGM_SERVICE_SELECTOR
    assert dcgm_service_selector("dra") == DCGM_DRA_SERVICE_SELECTOR != DCGM_SERVICE_SELECTOR


@pytest.mark.parametrize(
    ("time_slicing", "mig_strategy", "flags", "sharing"),
    [
        (
            {"replicas": 4},
            "none",
            {"migStrategy": "none"},
            {"renameByDefault": False, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]},
        ),
        (
            {"replicas": 2, "rename_by_default": True},
            "single",
            {"migStrategy": "single"},
            {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
        ),
    ],
)
def test_time_slicing_config_shares_nvidia_gpu(
    time_slicing: dict[str, Any], mig_strategy: Any, flags: dict[str, Any], sharing: dict[str, Any]
) -> None:
    config = time_slicing_config(TimeSlicing(**time_slicing), mig_strategy)
    assert config == {"version": "v1", "flags": flags, "sharing": {"timeSlicing": sharing}}


def test_time_slicing_config_map_holds_the_document_under_its_key() -> None:
    config_map = time_slicing_config_map(TimeSlicing(replicas=4), "none", "gpu-operator")
    assert config_map["metadata"] == {"name": "time-slicing-config", "namespace": "gpu-operator"}
    assert list(config_map["data"]) == [TIME_SLICING_KEY]
    document = yaml.safe_load(config_map["data"][TIME_SLICING_KEY])
    assert document == time_slicing_config(TimeSlicing(replicas=4), "none")


@pytest.mark.parametrize(
    ("settings", "config_name", "path", "expected"),
    [
        ({}, None, ("devicePlugin",), {"enabled": True}),
        (
            {},
            "time-slicing-config",
            ("devicePlugin", "config"),
            {"create": False, "name": "time-slicing-config", "default": TIME_SLICING_KEY},
        ),
        ({}, None, ("daemonsets", "tolerations"), [TOLERATION]),
        ({}, None, ("node-feature-discovery", "worker", "tolerations"), [TOLERATION]),
        ({}, None, ("cdi",), {"enabled": True}),
        ({}, None, ("operator",), {"upgradeCRD": True}),
        ({"operator": {"upgradeCRD": False}}, None, ("operator",), {"upgradeCRD": False}),
        ({}, None, ("dcgmExporter", "serviceMonitor"), {"enabled": False}),
        ({"dcgm_exporter": {"enabled": False}}, None, ("dcgmExporter", "enabled"), False),
        ({"driver": {"enabled": False}}, None, ("driver",), {"enabled": False}),
        ({"nfd": {"enabled": False}}, None, ("nfd",), {"enabled": False}),
        ({"mig_manager": {"enabled": False}}, None, ("migManager",), {"enabled": False}),
        ({"mig": {"strategy": "mixed"}}, None, ("mig",), {"strategy": "mixed"}),
        (
            {},
            None,
            ("toolkit", "env"),
            [{"name": ENVVAR_WHEN_UNPRIVILEGED, "value": "false"}],
        ),
        (
            {"toolkit": {"env": {ENVVAR_WHEN_UNPRIVILEGED: "true", "CONTAINERD_SOCKET": "/s"}}},
            None,
            ("toolkit", "env"),
            [
                {"name": ENVVAR_WHEN_UNPRIVILEGED, "value": "true"},
                {"name": "CONTAINERD_SOCKET", "value": "/s"},
            ],
        ),
        (
            {"values": {"driver": {"version": "580.95.05"}}},
            None,
            ("driver",),
            {"enabled": True, "version": "580.95.05"},
        ),
        ({"values": {"cdi": {"enabled": False}}}, None, ("cdi",), {"enabled": False}),
    ],
)
def test_operator_values_from_settings(
    settings: dict[str, Any], config_name: str | None, path: tuple[str, ...], expected: Any
) -> None:
    value: Any = operator_values(GpuOperatorSettings(**settings), TOLERATION, config_name)
    for key in path:
        value = value[key]
    assert value == expected


DRA_OPERATOR = {"allocation": "dra", "version": "v26.7.1"}


def test_operator_values_dra_deploys_gpucluster_instead_of_clusterpolicy() -> None:
    settings = GpuOperatorSettings.model_validate(DRA_OPERATOR)
    assert operator_values(settings, TOLERATION, None) == {
        "operator": {"upgradeCRD": True},
        "clusterPolicy": {"deployCR": False},
        "gpuCluster": {"deployCR": True},
        "daemonsets": {"tolerations": [TOLERATION]},
        "driver": {"enabled": True, "nvidiaDriverCRD": {"enabled": True}},
        "devicePlugin": {"enabled": False},
        "draDriver": {"computeDomains": {"enabled": False}},
        "dcgmExporter": {"enabled": True, "serviceMonitor": {"enabled": False}},
        "nfd": {"enabled": True},
        "node-feature-discovery": {"worker": {"tolerations": [TOLERATION]}},
    }


@pytest.mark.parametrize(
    ("operator", "driver"),
    [
        ({}, {"enabled": True, "nvidiaDriverCRD": {"enabled": True}}),
        ({"driver": {"enabled": False}}, {"enabled": False}),
    ],
)
def test_operator_values_dra_driver_from_nvidiadriver_or_the_host(
    operator: dict[str, Any], driver: dict[str, Any]
) -> None:
    settings = GpuOperatorSettings.model_validate({**DRA_OPERATOR, **operator})
    assert operator_values(settings, TOLERATION, None)["driver"] == driver


def test_operator_values_dra_renders_no_clusterpolicy_only_operand() -> None:
    values = operator_values(GpuOperatorSettings.model_validate(DRA_OPERATOR), TOLERATION, None)
    assert not {"toolkit", "cdi", "mig", "migManager"} & set(values)


def test_operator_values_dra_free_form_values_merge_last() -> None:
    settings = GpuOperatorSettings.model_validate(
        {**DRA_OPERATOR, "values": {"draDriver": {"computeDomains": {"enabled": True}}}}
    )
    values = operator_values(settings, TOLERATION, None)
    assert values["draDriver"] == {"computeDomains": {"enabled": True}}
    assert values["gpuCluster"] == {"deployCR": True}


def test_operator_values_device_plugin_mode_is_the_same_with_the_key_spelt_out() -> None:
    operator = {"devicePlugin": {"timeSlicing": {"replicas": 4}}, "mig": {"strategy": "none"}}
    implicit = GpuOperatorSettings.model_validate(operator)
    explicit = GpuOperatorSettings.model_validate({**operator, "allocation": "device-plugin"})
    rendered = operator_values(implicit, TOLERATION, "time-slicing-config")
    assert operator_values(explicit, TOLERATION, "time-slicing-config") == rendered
    assert rendered["devicePlugin"]["enabled"] is True and "gpuCluster" not in rendered
