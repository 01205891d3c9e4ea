"""A GPU Operator installed outside the stack (admission.externalGpuOperatorNamespace): its own
pods pass the gate as the stack's operator's do, and a config naming it beside the stack's own
operator is refused.

tests/integration/test_opa_gate_live.py runs the sample table's operator rows on a real
kube-apiserver with the gate data of either operator, on every engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components.gpu_operator.settings import GpuOperatorSettings
from components.handoffs import OperatorPods
from components.opa_gate.manifests import (
    admission_policy_spec,
    gate_data,
    gate_list,
    webhook_condition,
    written_document,
)
from components.opa_gate.settings import OpaGateSettings
from components.settings import Problem
from stack_config import ConfigError, StackConfig, parse_stack_config
from tests.conftest import run_program
from tests.opa_gate.gate_config import load_sections, operator_conflict_of

EXTERNAL = "nvidia-gpu-operator"
VALIDATOR = f"system:serviceaccount:{EXTERNAL}:nvidia-operator-validator"


def test_gate_external_operator_pods_are_the_installed_operators_shape() -> None:
    external = GpuOperatorSettings().operator_pods(EXTERNAL)
    installed = GpuOperatorSettings.model_validate(
        {"enabled": True, "namespace": EXTERNAL}
    ).operator_pods()
    assert external == installed
    assert external == OperatorPods(namespace=EXTERNAL, creators=(VALIDATOR,))


def test_gate_external_operator_none_without_either_operator() -> None:
    assert GpuOperatorSettings().operator_pods() is None
    assert GpuOperatorSettings().operator_pods("") is None


def test_gate_external_operator_is_not_taken_beside_the_installed_one() -> None:
    installed = GpuOperatorSettings.model_validate({"enabled": True})
    with pytest.raises(ValueError, match=r"gpuOperator\.enabled false"):
        installed.operator_pods(EXTERNAL)


@pytest.mark.parametrize("engine", ["validating-admission-policy", "opa"])
def test_gate_external_operator_pods_reach_every_engines_data(engine: str) -> None:
    config = gate_data("s", [], [], operator_pods=GpuOperatorSettings().operator_pods(EXTERNAL))
    assert config["operator_pods.namespace"] == EXTERNAL
    assert gate_list(config, "operator_pods.creators") == [VALIDATOR]
    if engine == "opa":
        # The webhook's condition carries the document written into the native policies.
        assert json.dumps(config, sort_keys=True) in webhook_condition(config)
    else:
        spec = admission_policy_spec(config)
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        assert "variables.config['operator_pods.namespace']" in variables["operatorPod"]
        assert written_document(spec)["operator_pods.namespace"] == EXTERNAL


# ------------------------------------------------------------------ the setting


def _parse(**values: Any) -> StackConfig:
    return parse_stack_config(values)


def _problems(**values: Any) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        _parse(**values)
    return [str(p) for p in excinfo.value.problems]


def test_gate_external_operator_setting_defaults_to_none() -> None:
    assert OpaGateSettings().external_gpu_operator_namespace == ""


def test_gate_external_operator_setting_is_read() -> None:
    config = _parse(admission={"externalGpuOperatorNamespace": EXTERNAL})
    assert config.admission.external_gpu_operator_namespace == EXTERNAL


@pytest.mark.parametrize("value", ["GPU_Operator", "gpu-admission", 7])
def test_gate_external_operator_setting_refuses_what_cannot_be_its_namespace(value: Any) -> None:
    assert _problems(admission={"externalGpuOperatorNamespace": value}) == [
        f"gpu-cluster:admission.externalGpuOperatorNamespace: got {value!r}; expected the "
        "namespace (DNS-1123 label) of a GPU Operator installed outside the stack, or empty; "
        "not the gate's own (gpu-admission)"
    ]


# ------------------------------------------------------------------ beside the rest of the config
#
# stack_config.py applies operator_conflict_problem() to the loaded config
# (tests/opa_gate/gate_config.py, operator_conflict_of()).


def _conflict(**values: Any) -> Problem | None:
    return operator_conflict_of(load_sections(values))


def test_gate_external_operator_beside_the_installed_one_is_refused() -> None:
    found = _conflict(
        gpuOperator={"enabled": True},
        admission={"externalGpuOperatorNamespace": EXTERNAL},
    )
    assert str(found) == (
        "gpu-cluster:admission.externalGpuOperatorNamespace: got 'nvidia-gpu-operator'; names a "
        "GPU Operator installed outside the stack, but the stack installs one "
        "(gpuOperator.enabled true, gpuOperator.namespace gpu-operator), whose pods the gate "
        "already lets through; a cluster runs one GPU Operator: leave this empty, or set "
        "gpuOperator.enabled false to keep the one installed outside"
    )


def test_gate_external_operator_in_the_installed_ones_namespace_is_refused_too() -> None:
    found = _conflict(
        gpuOperator={"enabled": True},
        admission={"externalGpuOperatorNamespace": "gpu-operator"},
    )
    assert found is not None
    assert "gpuOperator.namespace gpu-operator (the same namespace)" in found.allowed


def test_gate_external_operator_in_a_namespace_the_stack_creates_is_refused() -> None:
    found = _conflict(
        monitoring={"enabled": True, "namespace": "ops"},
        admission={"externalGpuOperatorNamespace": "ops"},
    )
    assert str(found) == (
        "gpu-cluster:admission.externalGpuOperatorNamespace: got 'ops'; is "
        "monitoring.namespace, a namespace the stack creates and `pulumi destroy` deletes; "
        "expected the namespace the GPU Operator installed outside the stack runs in"
    )


@pytest.mark.parametrize(
    "values",
    [
        {"admission": {"externalGpuOperatorNamespace": EXTERNAL}},
        {"gpuOperator": {"enabled": True}},
        {},
    ],
)
def test_gate_external_operator_consistent_configs_pass(values: dict[str, Any]) -> None:
    assert _conflict(**values) is None


def test_gate_external_operator_in_a_namespace_the_stack_uses_without_creating_passes() -> None:
    values = {"enabled": True, "namespace": "ops", "createNamespace": False}
    assert _conflict(monitoring=values, admission={"externalGpuOperatorNamespace": "ops"}) is None


# ------------------------------------------------------------------ the whole program


@pytest.fixture
def _kubeconfig(empty_kubeconfig_env: Path) -> None:
    """The program reads this throwaway kubeconfig, never the developer's."""


@pytest.mark.usefixtures("_kubeconfig")
@pytest.mark.parametrize("engine", ["validating-admission-policy", "opa"])
def test_gate_external_operator_reaches_the_applied_gate(engine: str) -> None:
    recording = run_program(
        "dev",
        {
            "gpuOperator": {"enabled": False},
            "admission": {"engine": engine, "externalGpuOperatorNamespace": EXTERNAL},
        },
    )
    if engine == "opa":
        (config_map,) = [
            c
            for c in recording.of_type("kubernetes:core/v1:ConfigMap")
            if c.inputs["metadata"]["name"] == "gpu-gate-config"
        ]
        data = json.loads(config_map.inputs["data"]["gate.json"])
    else:
        data = recording.gate_document()
    assert data["operator_pods.namespace"] == EXTERNAL
    assert gate_list(data, "operator_pods.creators") == [VALIDATOR]
    # Nothing of the operator is the stack's.
    assert recording.of_type("gpu-cluster:index:GpuOperator") == []
