"""DRA mode (gpuOperator.allocation dra): a pod's resource claim is a GPU request only when
the ResourceClaimTemplate or ResourceClaim it names selects a GPU DeviceClass.

The builders as tables, OpaGate under Pulumi mocks, and the stack config's refusal of the opa
engine with DRA. The verdicts themselves: tests/opa_gate/test_samples_offline.py (the
Kubernetes CEL libraries) and tests/opa_gate/test_dra_claims_live.py (a real cluster).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components import OpaGate, OpaGateArgs
from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_resources import DRA_DEVICE_CLASSES, DRA_DRIVER
from components.opa_gate.manifests import (
    ALLOCATION_POLICY,
    CLAIM_KINDS,
    DEVICE_CLASSES_KEY,
    admission_policy_spec,
    claim_binding_spec,
    claim_param_kind,
    claim_policy_name,
    claim_policy_spec,
    claim_routing_binding_spec,
    claim_routing_policy_spec,
    claims_looked_up,
    gate_data,
    routing_policy_spec,
)
from components.opa_gate.policies import gpu_scheduler_cel as cel
from components.opa_gate.settings import ADMISSION_ENGINES, claim_lookup_problem
from stack_config import ConfigError, parse_stack_config
from tests.conftest import Recording, component_access, register, run_program
from tools.harness.pulumi_engine import project_config

SCHEDULER = "gpu-binpack-scheduler"
TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}
DRA_DATA = gate_data(
    SCHEDULER, [], [], pool_toleration=TOLERATION, device_classes=DRA_DEVICE_CLASSES
)
PLUGIN_DATA = gate_data(SCHEDULER, [], [], pool_toleration=TOLERATION)
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
MAP = "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicy"
MAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicyBinding"
ALLOCATOR = f"system:serviceaccount:kube-system:{SCHEDULER}"
# What a DRA gate is given besides its device classes: the GPU driver and the allocator.
DRA_GATE = {
    "device_classes": DRA_DEVICE_CLASSES,
    "device_drivers": (DRA_DRIVER,),
    "allocator": ALLOCATOR,
}


def _variables(spec: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in spec["variables"]}


# ------------------------------------------------------------------ the parameter document


def test_dra_claims_gate_data_carries_the_device_classes_only_in_dra_mode() -> None:
    plain = gate_data(SCHEDULER, [], [], pool_toleration=TOLERATION)
    assert DEVICE_CLASSES_KEY not in plain and not claims_looked_up(plain)
    assert DRA_DATA[DEVICE_CLASSES_KEY] == ",".join(sorted(DRA_DEVICE_CLASSES))
    assert claims_looked_up(DRA_DATA)
    # Nothing else of the document changes.
    assert {k: v for k, v in DRA_DATA.items() if k != DEVICE_CLASSES_KEY} == plain


# ------------------------------------------------------------------ the parameter-document policies


@pytest.mark.parametrize("build", [admission_policy_spec, routing_policy_spec])
def test_dra_claims_pod_policies_leave_claims_to_the_claim_policies(build: Any) -> None:
    plugin, dra = _variables(build(PLUGIN_DATA)), _variables(build(DRA_DATA))
    assert "resourceClaims" in plugin["gpuNames"]
    assert "resourceClaims" not in dra["gpuNames"]
    # gpuNames and the written-in document alone differ: every other rule reads the same.
    assert {k: v for k, v in dra.items() if k not in ("gpuNames", "config")} == {
        k: v for k, v in plugin.items() if k not in ("gpuNames", "config")
    }


def test_dra_claims_validations_never_render_the_files_marks() -> None:
    for validation in cel.validations():
        assert set(validation) <= {"expression", "messageExpression", "message", "reason"}


# ------------------------------------------------------------------ the claim policies


@pytest.mark.parametrize("kind", CLAIM_KINDS)
def test_dra_claims_policy_takes_each_object_of_its_kind_as_parameter(kind: str) -> None:
    spec = claim_policy_spec(kind, DRA_DATA)
    assert spec["paramKind"] == {"apiVersion": "resource.k8s.io/v1", "kind": kind}
    # Pod creations only: a claim cannot be added to a running pod.
    assert [r["operations"] for r in spec["matchConstraints"]["resourceRules"]] == [["CREATE"]]
    routing = claim_routing_policy_spec(kind, DRA_DATA)
    assert routing["paramKind"] == spec["paramKind"]


@pytest.mark.parametrize("kind", CLAIM_KINDS)
def test_dra_claims_policy_writes_the_parameter_document_in(kind: str) -> None:
    # Its `params` is the template or claim: the document is the `config` variable itself.
    variables = _variables(claim_policy_spec(kind, DRA_DATA))
    assert json.loads(variables["config"]) == DRA_DATA
    assert "params" not in variables["config"]
    assert "variables.gpuClasses" in variables["selectsGpu"]


def test_dra_claims_policies_follow_the_parameter_document() -> None:
    other = {**DRA_DATA, "scheduler_name": "team-binpack"}
    for kind in CLAIM_KINDS:
        assert claim_policy_spec(kind, other) != claim_policy_spec(kind, DRA_DATA)
        assert json.loads(_variables(claim_policy_spec(kind, other))["config"]) == other


@pytest.mark.parametrize(
    ("kind", "reference", "claim_spec"),
    [
        ("ResourceClaimTemplate", "resourceClaimTemplateName", "params.spec.spec.devices"),
        ("ResourceClaim", "resourceClaimName", "params.spec.devices"),
    ],
)
def test_dra_claims_policy_reads_what_its_kind_names(
    kind: str, reference: str, claim_spec: str
) -> None:
    variables = _variables(claim_policy_spec(kind, DRA_DATA))
    assert f"c.{reference} == params.metadata.name" in variables["namingClaims"]
    assert claim_spec in variables["deviceRequests"]
    assert "$" not in json.dumps(variables)


def test_dra_claims_policy_runs_the_gpu_pod_validations_only() -> None:
    for kind in CLAIM_KINDS:
        validations = claim_policy_spec(kind, DRA_DATA)["validations"]
        assert validations and all(v in cel.validations() for v in validations)
        messages = " ".join(v["messageExpression"] for v in validations)
        assert "variables.firstGpu" in messages
        # The pod's other rules are the parameter-document policy's, judged once.
        assert "NVIDIA_VISIBLE_DEVICES" not in messages and "PodGroup" not in messages


@pytest.mark.parametrize("kind", CLAIM_KINDS)
def test_dra_claims_policy_conditions_name_no_variable(kind: str) -> None:
    # The API server refuses match conditions that name variables: they are inlined.
    for spec in (claim_policy_spec(kind, DRA_DATA), claim_routing_policy_spec(kind, DRA_DATA)):
        for condition in spec["matchConditions"]:
            assert "variables." not in condition["expression"], condition["name"]
    names = [c["name"] for c in claim_routing_policy_spec(kind, DRA_DATA)["matchConditions"]]
    assert names == ["names-this-object", "gpu-claim", "not-bound"]


@pytest.mark.parametrize("kind", CLAIM_KINDS)
def test_dra_claims_routing_patches_as_the_pod_routing_does(kind: str) -> None:
    assert (
        claim_routing_policy_spec(kind, DRA_DATA)["mutations"]
        == routing_policy_spec(DRA_DATA)["mutations"]
    )


def test_dra_claims_bindings_select_every_object_of_the_pods_namespace() -> None:
    for build in (claim_binding_spec, claim_routing_binding_spec):
        spec = build("p", gate_namespace="gpu-admission")
        # No name and no namespace: every object, in the namespace of the request.
        assert spec["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}
        assert spec["policyName"] == "p"


def test_dra_claims_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"claim kind 'DeviceClass' is not one of"):
        claim_param_kind("DeviceClass")


# ------------------------------------------------------------------ OpaGate under mocks


def _make_gate(**overrides: Any) -> Recording:
    def build() -> None:
        args: dict[str, Any] = {
            "access": component_access(),
            "scheduler_name": SCHEDULER,
            "pool_toleration": TOLERATION,
            **overrides,
        }
        OpaGate("gate", OpaGateArgs(**args))

    return register(build)


def _by_name(recording: Recording, typ: str) -> dict[str, dict[str, Any]]:
    return {c.inputs["metadata"]["name"]: c.inputs for c in recording.of_type(typ)}


def test_dra_claims_gate_routes_and_refuses_by_claim_kind() -> None:
    recording = _make_gate(engine="mutating-admission-policy", **DRA_GATE)
    names = {claim_policy_name(k): k for k in CLAIM_KINDS}
    policies, routings = _by_name(recording, VAP), _by_name(recording, MAP)
    assert set(policies) == {"gpu-scheduler-gate", ALLOCATION_POLICY, *names}
    assert set(routings) == {"gpu-scheduler-gate", *names}
    assert set(_by_name(recording, VAP_BINDING)) == set(policies)
    assert set(_by_name(recording, MAP_BINDING)) == set(routings)
    for name, kind in names.items():
        assert policies[name]["spec"] == claim_policy_spec(kind, DRA_DATA)
        assert routings[name]["spec"] == claim_routing_policy_spec(kind, DRA_DATA)
    main = policies["gpu-scheduler-gate"]["spec"]
    assert main == admission_policy_spec(DRA_DATA)


def test_dra_claims_reject_only_gate_has_no_claim_routing() -> None:
    recording = _make_gate(engine="validating-admission-policy", **DRA_GATE)
    assert set(_by_name(recording, VAP)) == {
        "gpu-scheduler-gate",
        ALLOCATION_POLICY,
        *(claim_policy_name(k) for k in CLAIM_KINDS),
    }
    assert recording.of_type(MAP) == []


def test_dra_claims_device_plugin_gate_has_no_claim_policy() -> None:
    recording = _make_gate(engine="mutating-admission-policy")
    assert set(_by_name(recording, VAP)) == {"gpu-scheduler-gate"}
    assert set(_by_name(recording, MAP)) == {"gpu-scheduler-gate"}
    assert _by_name(recording, VAP)["gpu-scheduler-gate"]["spec"] == admission_policy_spec(
        gate_data(SCHEDULER, [], [], pool_toleration=TOLERATION)
    )


# ------------------------------------------------------------------ the stack config


def test_dra_claims_opa_is_refused_with_dra() -> None:
    found = claim_lookup_problem(engine="opa", device_classes=DRA_DEVICE_CLASSES)
    assert found is not None
    assert str(found) == (
        "gpu-cluster:admission.engine: got 'opa'; cannot tell GPU resource claims from others "
        "with gpuOperator.allocation dra: a claim is a GPU request only when the "
        "ResourceClaimTemplate or ResourceClaim it names selects one of the DeviceClasses "
        "gpu.nvidia.com, mig.nvidia.com, and OPA sees only the pod, not those objects; allowed "
        "with dra: mutating-admission-policy or validating-admission-policy (they look the "
        "objects up), or gpuOperator.allocation device-plugin to keep opa"
    )


@pytest.mark.parametrize("engine", ADMISSION_ENGINES)
def test_dra_claims_every_engine_is_fine_with_the_device_plugin(engine: str) -> None:
    classes = GpuOperatorSettings(enabled=True).device_classes()
    assert claim_lookup_problem(engine=engine, device_classes=classes) is None


@pytest.mark.parametrize("engine", [e for e in ADMISSION_ENGINES if e != "opa"])
def test_dra_claims_native_engines_are_fine_with_dra(engine: str) -> None:
    assert claim_lookup_problem(engine=engine, device_classes=DRA_DEVICE_CLASSES) is None


# ------------------------------------------------------------------ the program


@pytest.fixture
def _kubeconfig(empty_kubeconfig_env: Path) -> None:
    """The program reads this throwaway kubeconfig, never the developer's."""


def _dra_operator() -> dict[str, Any]:
    """The local stack's GPU Operator with DRA allocation (the first chart with GPUCluster)."""
    return {**project_config("local")["gpuOperator"], "allocation": "dra", "version": "v26.7.0"}


# The local stack without its monitoring, which needs a password the tests do not set.
NO_MONITORING = {"monitoring": {**project_config("local")["monitoring"], "enabled": False}}


@pytest.mark.usefixtures("_kubeconfig")
def test_dra_claims_program_hands_the_operators_classes_to_the_gate() -> None:
    recording = run_program("local", {**NO_MONITORING, "gpuOperator": _dra_operator()})
    params = recording.gate_document()
    assert params[DEVICE_CLASSES_KEY] == ",".join(sorted(DRA_DEVICE_CLASSES))
    names = {claim_policy_name(k) for k in CLAIM_KINDS}
    assert names <= set(_by_name(recording, VAP)) and names <= set(_by_name(recording, MAP))


@pytest.mark.usefixtures("_kubeconfig")
def test_dra_claims_program_keeps_device_plugin_stacks_as_they_were() -> None:
    recording = run_program("local", NO_MONITORING)
    assert set(_by_name(recording, VAP)) == {"gpu-scheduler-gate"}
    assert DEVICE_CLASSES_KEY not in recording.gate_document()


def test_dra_claims_config_refuses_opa_with_dra() -> None:
    pool = project_config("local")["gpuPool"]
    # A PreferNoSchedule pool strands no pod, so the engine's one problem is the claims'.
    values = {
        **NO_MONITORING,
        "admission": {"engine": "opa"},
        "gpuOperator": _dra_operator(),
        "gpuPool": {**pool, "taint": {"effect": "PreferNoSchedule"}},
    }
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({**project_config("local"), **values})
    problems = [str(p) for p in excinfo.value.problems]
    assert [p for p in problems if p.startswith("gpu-cluster:admission.engine: got 'opa'")] == [
        str(claim_lookup_problem(engine="opa", device_classes=DRA_DEVICE_CLASSES))
    ]


def test_dra_claims_gate_args_refuse_opa_with_device_classes() -> None:
    with pytest.raises(ValueError, match=r"cannot tell GPU resource claims from others"):
        OpaGateArgs(
            access=component_access(),
            engine="opa",
            scheduler_name=SCHEDULER,
            device_classes=DRA_DEVICE_CLASSES,
        )
