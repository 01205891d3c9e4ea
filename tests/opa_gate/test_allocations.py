"""The allocation policy of DRA mode: only the stack's scheduler allocates GPU devices.

Its builders as tables, OpaGate under Pulumi mocks and the program's hand-off of the
scheduler's identity. Its verdicts on a real API server: test_allocations_live.py; the routes
that lead a GPU pod to another scheduler, with real schedulers: tests/e2e/test_dra.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components import OpaGate, OpaGateArgs
from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_resources import DRA_DEVICE_CLASSES, DRA_DRIVER
from components.handoffs import OperatorPods
from components.kubernetes_names import service_account_user
from components.opa_gate.manifests import (
    ALLOCATION_POLICY,
    allocation_binding_spec,
    allocation_policy_spec,
)
from components.opa_gate.settings import DEFAULT_GATE_NAMESPACE
from tests.conftest import Recording, component_access, register, run_program
from tools.harness.pulumi_engine import project_config

SCHEDULER = "gpu-binpack-scheduler"
ALLOCATOR = service_account_user("kube-system", SCHEDULER)
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def _spec(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "allocator": ALLOCATOR,
        "scheduler_name": SCHEDULER,
        "drivers": [DRA_DRIVER],
        "gate_namespace": "gpu-admission",
        "operator_namespace": "gpu-operator",
        **overrides,
    }
    return allocation_policy_spec(**args)


def _variables(spec: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in spec["variables"]}


# ------------------------------------------------------------------ builders


def test_allocations_policy_judges_the_write_that_allocates() -> None:
    rules = _spec()["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "operations": ["UPDATE"],
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "resources": ["resourceclaims/status"],
        }
    ]
    # A write in another served version is judged as v1.
    assert _spec()["matchConstraints"]["matchPolicy"] == "Equivalent"


def test_allocations_policy_has_no_parameter_an_edit_could_open() -> None:
    spec = _spec()
    assert "paramKind" not in spec
    assert "paramRef" not in allocation_binding_spec()
    assert allocation_binding_spec()["validationActions"] == ["Deny"]


def test_allocations_policy_writes_in_the_allocator_the_scheduler_and_the_drivers() -> None:
    variables = _variables(_spec(drivers=["gpu.nvidia.com", "b.example.com"]))
    assert variables["allocator"] == f'"{ALLOCATOR}"'
    assert variables["schedulerName"] == f'"{SCHEDULER}"'
    assert variables["drivers"] == '["gpu.nvidia.com", "b.example.com"]'
    # The written values come first: every expression after them may read them.
    assert list(variables)[:3] == ["allocator", "schedulerName", "drivers"]


def test_allocations_policy_leaves_out_the_system_the_gate_and_the_operators_namespaces() -> None:
    for selector in (
        _spec()["matchConstraints"]["namespaceSelector"],
        allocation_binding_spec(gate_namespace="gpu-admission", operator_namespace="gpu-operator")[
            "matchResources"
        ]["namespaceSelector"],
    ):
        assert selector == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["gpu-admission", "gpu-operator", "kube-system"],
                }
            ]
        }


def test_allocations_policy_without_an_operator_leaves_out_only_the_system_and_the_gate() -> None:
    selector = _spec(operator_namespace="")["matchConstraints"]["namespaceSelector"]
    assert selector["matchExpressions"][0]["values"] == ["gpu-admission", "kube-system"]


# ------------------------------------------------------------------ OpaGate under mocks


def _make_gate(**overrides: Any) -> Recording:
    def build() -> None:
        args: dict[str, Any] = {
            "access": component_access(),
            "engine": "mutating-admission-policy",
            "scheduler_name": SCHEDULER,
            "device_classes": DRA_DEVICE_CLASSES,
            "device_drivers": (DRA_DRIVER,),
            "allocator": ALLOCATOR,
            **overrides,
        }
        OpaGate("gate", OpaGateArgs(**args))

    return register(build)


def _by_name(recording: Recording, typ: str) -> dict[str, dict[str, Any]]:
    return {c.inputs["metadata"]["name"]: c.inputs for c in recording.of_type(typ)}


@pytest.mark.parametrize("engine", ["mutating-admission-policy", "validating-admission-policy"])
def test_allocations_gate_declares_the_policy_in_dra_mode(engine: str) -> None:
    operator = OperatorPods(namespace="gpu-operator", creators=("v",))
    recording = _make_gate(engine=engine, operator_pods=operator)
    policy = _by_name(recording, VAP)[ALLOCATION_POLICY]
    assert policy["spec"] == _spec(gate_namespace=DEFAULT_GATE_NAMESPACE)
    binding = _by_name(recording, VAP_BINDING)[ALLOCATION_POLICY]
    assert binding["spec"]["policyName"] == ALLOCATION_POLICY
    assert "paramRef" not in binding["spec"]


def test_allocations_gate_declares_none_with_the_device_plugin() -> None:
    recording = _make_gate(device_classes=(), device_drivers=(), allocator=None)
    assert ALLOCATION_POLICY not in _by_name(recording, VAP)


@pytest.mark.parametrize(
    "missing", [{"device_drivers": ()}, {"allocator": None}], ids=["drivers", "allocator"]
)
def test_allocations_gate_args_refuse_dra_without_an_allocator(missing: dict[str, Any]) -> None:
    args: dict[str, Any] = {
        "access": component_access(),
        "scheduler_name": SCHEDULER,
        "device_classes": DRA_DEVICE_CLASSES,
        "device_drivers": (DRA_DRIVER,),
        "allocator": ALLOCATOR,
    }
    OpaGateArgs(**args)  # whole, it is fine
    with pytest.raises(ValueError, match=r"need device_drivers and allocator"):
        OpaGateArgs(**{**args, **missing})


# ------------------------------------------------------------------ the program


@pytest.fixture
def _kubeconfig(empty_kubeconfig_env: Path) -> None:
    """The program reads this throwaway kubeconfig, never the developer's."""


@pytest.mark.usefixtures("_kubeconfig")
def test_allocations_program_hands_the_schedulers_identity_to_the_gate() -> None:
    local = project_config("local")
    operator = {**local["gpuOperator"], "allocation": "dra", "version": "v26.7.0"}
    recording = run_program(
        "local",
        {"monitoring": {**local["monitoring"], "enabled": False}, "gpuOperator": operator},
    )
    (account,) = [
        c.inputs["metadata"]
        for c in recording.of_type("kubernetes:core/v1:ServiceAccount")
        if c.inputs["metadata"]["name"] == SCHEDULER
    ]
    policy = _by_name(recording, VAP)[ALLOCATION_POLICY]
    variables = _variables(policy["spec"])
    assert variables["allocator"] == f'"{service_account_user(account["namespace"], SCHEDULER)}"'
    assert variables["drivers"] == f'["{DRA_DRIVER}"]'
    excluded = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    operator_namespace = GpuOperatorSettings.model_validate(operator).namespace
    assert operator_namespace in excluded["values"]


@pytest.mark.usefixtures("_kubeconfig")
def test_allocations_program_declares_none_for_a_device_plugin_stack() -> None:
    local = project_config("local")
    recording = run_program("local", {"monitoring": {**local["monitoring"], "enabled": False}})
    assert ALLOCATION_POLICY not in _by_name(recording, VAP)
