"""The GPU Operator's allocation model (components/gpu_operator/settings.py): where DRA mode is
refused at config load, what pods then ask for, and one model per cluster."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_resources import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    DRA_DEVICE_CLASSES,
    GPU_DEVICE_CLASS,
    MIG_DEVICE_CLASS,
    MIG_PREFIX,
    WHOLE_GPU,
)
from stack_config import ConfigError, parse_stack_config

DRA_CHART = "v26.7.1"
DRA = {"enabled": True, "allocation": "dra", "version": DRA_CHART}


def _problems(operator: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"gpuOperator": operator})
    return [str(p) for p in excinfo.value.problems]


def test_gpu_operator_settings_allocation_defaults_to_the_device_plugin() -> None:
    assert GpuOperatorSettings().allocation == "device-plugin"
    assert GpuOperatorSettings(enabled=True).device_classes() == ()


def test_gpu_operator_settings_refuses_an_unknown_allocation() -> None:
    (problem,) = _problems({"enabled": True, "allocation": "gpu"})
    assert problem == ("gpu-cluster:gpuOperator.allocation: got 'gpu'; allowed: device-plugin, dra")


def test_gpu_operator_settings_dra_refuses_a_chart_without_gpucluster() -> None:
    (problem,) = _problems({**DRA, "version": "v26.3.3"})
    assert problem.startswith("gpu-cluster:gpuOperator.version: got 'v26.3.3'; allocation dra")
    assert "v26.7.0 or later" in problem
    assert GpuOperatorSettings.model_validate({**DRA, "version": "v26.7.0"}).allocation == "dra"


@pytest.mark.parametrize(
    ("kubernetes", "refused"),
    [("v1.33.9", True), ("v1.34.1", True), ("v1.34.2", False), ("v1.37.2", False)],
)
def test_gpu_operator_settings_dra_needs_the_drivers_kubernetes(
    kubernetes: str, refused: bool
) -> None:
    context = {"kubernetes_version": kubernetes}
    if not refused:
        assert GpuOperatorSettings.model_validate(DRA, context=context).allocation == "dra"
        return
    with pytest.raises(ValidationError) as excinfo:
        GpuOperatorSettings.model_validate(DRA, context=context)
    (error,) = excinfo.value.errors()
    assert error["loc"] == () and error["ctx"]["at"] == ".allocation"
    assert "v1.34.2 or later" in error["msg"] and kubernetes in error["msg"]


@pytest.mark.parametrize(
    ("operator", "key", "shown"),
    [
        (
            {"devicePlugin": {"timeSlicing": {"replicas": 4}}},
            "devicePlugin.timeSlicing",
            "'replicas': 4",
        ),
        ({"mig": {"strategy": "none"}}, "mig.strategy", "'none'"),
        ({"mig": {"strategy": "single"}}, "mig.strategy", "'single'"),
        ({"mig": {"strategy": "mixed"}}, "mig.strategy", "'mixed'"),
        ({"migManager": {"enabled": True}}, "migManager.enabled", "True"),
        ({"toolkit": {"enabled": True}}, "toolkit.enabled", "True"),
        (
            {"toolkit": {"env": {"CONTAINERD_CONFIG": "/etc/c.toml"}}},
            "toolkit.env",
            "CONTAINERD_CONFIG",
        ),
    ],
)
def test_gpu_operator_settings_dra_refuses_what_only_clusterpolicy_honours(
    operator: dict[str, Any], key: str, shown: str
) -> None:
    (problem,) = _problems({**DRA, **operator})
    assert problem.startswith(f"gpu-cluster:gpuOperator.{key}: got ")
    assert shown in problem.split(";", 1)[0]
    # Accepted the same without allocation dra.
    accepted = GpuOperatorSettings.model_validate({"enabled": True, **operator})
    assert accepted.allocation == "device-plugin"


def test_gpu_operator_settings_dra_accepts_the_switches_turned_off() -> None:
    settings = GpuOperatorSettings.model_validate(
        {**DRA, "toolkit": {"enabled": False}, "migManager": {"enabled": False}}
    )
    assert settings.device_classes() == (GPU_DEVICE_CLASS, MIG_DEVICE_CLASS)


@pytest.mark.parametrize(
    ("allocation", "values", "key"),
    [
        ("dra", {"devicePlugin": {"enabled": True}}, "devicePlugin.enabled"),
        ("dra", {"clusterPolicy": {"deployCR": True}}, "clusterPolicy.deployCR"),
        ("dra", {"gpuCluster": {"deployCR": False}}, "gpuCluster.deployCR"),
        ("device-plugin", {"gpuCluster": {"deployCR": True}}, "gpuCluster.deployCR"),
        ("device-plugin", {"clusterPolicy": {"deployCR": False}}, "clusterPolicy.deployCR"),
        ("device-plugin", {"draDriver": {"gpus": {"enabled": True}}}, "draDriver.gpus.enabled"),
    ],
)
def test_gpu_operator_settings_one_allocation_model_per_cluster(
    allocation: str, values: dict[str, Any], key: str
) -> None:
    version = DRA_CHART if allocation == "dra" else "v26.3.3"
    operator = {"enabled": True, "allocation": allocation, "version": version, "values": values}
    (problem,) = _problems(operator)
    assert problem.startswith(f"gpu-cluster:gpuOperator.values.{key}: got ")


@pytest.mark.parametrize(
    ("allocation", "values"),
    [
        ("dra", {"devicePlugin": {"enabled": False}, "gpuCluster": {"deployCR": True}}),
        ("dra", {"draDriver": {"computeDomains": {"enabled": True}}}),
        ("device-plugin", {"devicePlugin": {"enabled": True}, "clusterPolicy": {"deployCR": True}}),
    ],
)
def test_gpu_operator_settings_values_that_keep_one_model_are_accepted(
    allocation: str, values: dict[str, Any]
) -> None:
    version = DRA_CHART if allocation == "dra" else "v26.3.3"
    operator = {"enabled": True, "allocation": allocation, "version": version, "values": values}
    assert parse_stack_config({"gpuOperator": operator}).gpu_operator.values == values


def test_gpu_operator_settings_dra_pods_ask_for_the_device_classes_names() -> None:
    resources = GpuOperatorSettings.model_validate(DRA).gpu_resources()
    assert resources.names == (
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
        "deviceclass.resource.kubernetes.io/mig.nvidia.com",
    )
    assert resources.names == tuple(DEVICE_CLASS_RESOURCE_PREFIX + c for c in DRA_DEVICE_CLASSES)
    # The device plugin's names are advertised by no node in DRA mode.
    assert WHOLE_GPU not in resources.names
    assert MIG_PREFIX not in resources.prefixes and resources.shared == ()


def test_gpu_operator_settings_dra_disabled_claims_only_the_plain_name() -> None:
    settings = GpuOperatorSettings.model_validate({**DRA, "enabled": False})
    assert settings.device_classes() == ()
    assert settings.gpu_resources().names == (WHOLE_GPU,)


def test_gpu_operator_settings_device_plugin_resources_unchanged_by_the_allocation_key() -> None:
    base = {"enabled": True, "mig": {"strategy": "mixed"}}
    implicit = GpuOperatorSettings.model_validate(base).gpu_resources()
    explicit = GpuOperatorSettings.model_validate({**base, "allocation": "device-plugin"})
    assert explicit.gpu_resources() == implicit
    assert implicit.names == (WHOLE_GPU,) and implicit.prefixes == (MIG_PREFIX,)


def test_gpu_operator_settings_dra_whole_program_gates_and_weighs_the_device_classes() -> None:
    """The dev stack with allocation dra under mocks: GPUCluster values reach the release, the
    gate and the scheduler's weights get the DeviceClasses' names, not the device plugin's."""
    from components.opa_gate.manifests import gate_list
    from tests.conftest import run_program

    operator = {**DRA, "driver": {"enabled": False}, "toolkit": {"enabled": False}}
    recording = run_program(
        "dev", {"gpuOperator": operator, "admission": {"engine": "mutating-admission-policy"}}
    )
    (release,) = [
        r
        for r in recording.of_type("kubernetes:helm.sh/v3:Release")
        if r.inputs["name"] == "gpu-operator"
    ]
    assert release.inputs["values"]["gpuCluster"] == {"deployCR": True}
    assert release.inputs["values"]["driver"] == {"enabled": False}
    gated = gate_list(recording.gate_document(), "gpu_resources")
    for device_class in DRA_DEVICE_CLASSES:
        assert DEVICE_CLASS_RESOURCE_PREFIX + device_class in gated
    config = yaml.safe_load(
        recording.named("binpack-scheduler-config").inputs["data"]["config.yaml"]
    )
    args = config["profiles"][0]["pluginConfig"][0]["args"]
    weighted = [r["name"] for r in args["scoringStrategy"]["resources"]]
    assert DEVICE_CLASS_RESOURCE_PREFIX + GPU_DEVICE_CLASS in weighted
    assert "nvidia.com/gpu.shared" not in weighted
