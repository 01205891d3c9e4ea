"""OpaGate under Pulumi mocks: certificates, exclusions, ordering and the engine switch.

tests/integration/test_opa_gate_live.py proves both engines against a real kube-apiserver.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pulumi
import pytest

from components import OpaGate, OpaGateArgs
from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_resources import gated_names, gated_prefixes, is_gpu_resource
from components.handoffs import OperatorPods
from components.opa_gate.manifests import (
    admission_policy_binding_spec,
    admission_policy_spec,
    gate_data,
    gate_list,
    namespace_selector,
    opa_run_args,
    routing_binding_spec,
    routing_policy_spec,
    webhook_condition,
    written_document,
)
from components.opa_gate.settings import DEFAULT_GATE_NAMESPACE, load_policies
from tests.conftest import Recording, component_access, register

WEBHOOK = "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def _make_gate(**overrides: Any) -> Recording:
    def build() -> None:
        access = component_access()
        args: dict[str, Any] = {
            "access": access,
            "engine": "opa",
            "scheduler_name": "gpu-binpack-scheduler",
            "gpu_resources": ["example.com/dongle"],
            **overrides,
        }
        gate = OpaGate("gate", OpaGateArgs(**args))
        pulumi.export("servingCertNotAfter", gate.serving_cert_not_after)

    return register(build)


def _config_maps(recording: Recording) -> dict[str, dict[str, Any]]:
    return {
        c.inputs["metadata"]["name"]: c.inputs
        for c in recording.of_type("kubernetes:core/v1:ConfigMap")
    }


def test_opa_gate_ca_reaches_the_webhook_ca_bundle() -> None:
    recording = _make_gate()
    (webhook,) = recording.of_type(WEBHOOK)
    bundle = webhook.inputs["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle).decode() == "-----BEGIN CERTIFICATE-----\ngate-ca\n"


def test_opa_gate_serving_certificate_names_the_service() -> None:
    recording = _make_gate(namespace="gpu-admission")
    (csr,) = recording.of_type("tls:index/certRequest:CertRequest")
    assert csr.inputs["dnsNames"] == [
        "opa.gpu-admission.svc",
        "opa.gpu-admission.svc.cluster.local",
    ]
    (cert,) = recording.of_type("tls:index/locallySignedCert:LocallySignedCert")
    assert cert.inputs["earlyRenewalHours"] == 720


def test_opa_gate_tls_key_is_a_secret_input() -> None:
    recording = _make_gate()
    serving = recording.named("gate-serving")
    assert serving.inputs["type"] == "kubernetes.io/tls"
    assert "stringData" in serving.secret_inputs


BY_NAME = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["gpu-admission", "kube-system"],
        }
    ]
}


def test_opa_gate_touches_no_namespace_it_did_not_create() -> None:
    recording = _make_gate()
    assert recording.of_type("kubernetes:core/v1:NamespacePatch") == []
    (namespace,) = recording.of_type("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["name"] == "gpu-admission"
    assert "openpolicyagent.org/webhook" not in namespace.inputs["metadata"]["labels"]


def test_opa_gate_webhook_excludes_namespaces_by_name_only() -> None:
    recording = _make_gate(namespace="gpu-admission")
    (webhook,) = recording.of_type(WEBHOOK)
    assert webhook.inputs["webhooks"][0]["namespaceSelector"] == BY_NAME


def test_opa_gate_webhook_excludes_its_own_namespace() -> None:
    recording = _make_gate(namespace="gate-ns")
    (webhook,) = recording.of_type(WEBHOOK)
    (expression,) = webhook.inputs["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert expression["values"] == ["gate-ns", "kube-system"]


def test_opa_gate_native_engine_excludes_namespaces_by_name_only() -> None:
    recording = _make_gate(engine="validating-admission-policy", namespace="gpu-admission")
    (policy,) = recording.of_type(VAP)
    (binding,) = recording.of_type(VAP_BINDING)
    assert policy.inputs["spec"]["matchConstraints"]["namespaceSelector"] == BY_NAME
    assert binding.inputs["spec"]["matchResources"]["namespaceSelector"] == BY_NAME


def test_opa_gate_native_engine_excludes_its_own_namespace() -> None:
    recording = _make_gate(engine="validating-admission-policy", namespace="gate-ns")
    (binding,) = recording.of_type(VAP_BINDING)
    (expression,) = binding.inputs["spec"]["matchResources"]["namespaceSelector"][
        "matchExpressions"
    ]
    assert expression["values"] == ["gate-ns", "kube-system"]


def test_opa_gate_spec_functions_default_to_the_components_namespace() -> None:
    # The spec builders' default must be the namespace OpaGate creates by default.
    assert OpaGateArgs.model_fields["namespace"].default == DEFAULT_GATE_NAMESPACE
    assert namespace_selector(DEFAULT_GATE_NAMESPACE) == BY_NAME


def test_opa_gate_webhook_uses_config() -> None:
    recording = _make_gate(failure_policy="Ignore", timeout_seconds=3)
    (webhook,) = recording.of_type(WEBHOOK)
    hook = webhook.inputs["webhooks"][0]
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 3)
    assert [(r["operations"], r["resources"]) for r in hook["rules"]] == [
        (["CREATE"], ["pods"]),
        (["UPDATE"], ["pods"]),
        (["UPDATE"], ["pods/ephemeralcontainers"]),
    ]


def test_opa_gate_webhook_is_registered_after_opa_and_exclusions() -> None:
    recording = _make_gate()
    (webhook,) = recording.of_type(WEBHOOK)
    needed = {
        recording.named("gate-opa").urn,
        recording.named("gate-namespace").urn,
    }
    assert needed <= set(webhook.dependencies)


def test_opa_gate_policies_reach_one_configmap_without_tests() -> None:
    recording = _make_gate()
    maps = _config_maps(recording)
    assert set(maps) == {"opa-policies", "gpu-gate-config"}
    assert set(maps["opa-policies"]["data"]) == {
        "admission.rego",
        "authz.rego",
        "gpu_scheduler.rego",
        "health.rego",
    }
    assert maps["opa-policies"]["data"]["gpu_scheduler.rego"] == load_policies()["gpu_scheduler"]


def test_opa_gate_what_opa_reads_cannot_be_edited_in_place() -> None:
    # An edit of OPA's policies or data (anyone who writes ConfigMaps in the gate's namespace)
    # is refused by the API server; the stack replaces them and rolls OPA instead.
    maps = _config_maps(_make_gate())
    assert {name: m.get("immutable") for name, m in maps.items()} == {
        "opa-policies": True,
        "gpu-gate-config": True,
    }


def test_opa_gate_opa_loads_the_mounted_policies_and_config_at_start() -> None:
    recording = _make_gate()
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    pod = deployment.inputs["spec"]["template"]["spec"]
    (opa,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in opa["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["policies"]["configMap"]["name"] == "opa-policies"
    assert volumes["config"]["configMap"]["name"] == "gpu-gate-config"
    assert opa["args"] == opa_run_args()
    # The directory and the config file OPA loads are the ones mounted.
    assert mounts["policies"] in opa["args"]
    assert f"gpu_cluster.config:{mounts['config']}/gate.json" in opa["args"]
    # The kubelet's ..data link and timestamped directory are not loaded a second time.
    assert "--ignore=..*" in opa["args"]
    assert not any(a.startswith("--watch") for a in opa["args"])


def test_opa_gate_config_is_data_not_rego() -> None:
    recording = _make_gate(scheduler_name="gpu-pack")
    gate = json.loads(_config_maps(recording)["gpu-gate-config"]["data"]["gate.json"])
    assert gate == {
        "scheduler_name": "gpu-pack",
        # Every GPU (components/gpu_resources.py) and the advertised extended resource.
        "gpu_resources": ",".join(gated_names(["example.com/dongle"])),
        "gpu_resource_prefixes": ",".join(gated_prefixes([])),
    }
    assert not any("gpu-pack" in source for source in load_policies().values())


def test_opa_gate_leaves_advertised_resources_ungated_when_told_to() -> None:
    recording = _make_gate(gate_extended_resources=False)
    gate = json.loads(_config_maps(recording)["gpu-gate-config"]["data"]["gate.json"])
    assert gate_list(gate, "gpu_resources") == gated_names([])
    assert "example.com/dongle" not in gate_list(gate, "gpu_resources")


def test_opa_gate_opa_serves_only_https_with_authorization() -> None:
    recording = _make_gate()
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    (opa,) = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert [a for a in opa["args"] if a.startswith("--addr=")] == ["--addr=https://0.0.0.0:8443"]
    assert "--authorization=basic" in opa["args"]
    assert opa["readinessProbe"]["httpGet"] == {
        "scheme": "HTTPS",
        "port": 8443,
        "path": "/health/ready",
    }
    assert opa["image"].startswith("openpolicyagent/opa:1.")


def test_opa_gate_opa_runs_alone_without_api_access() -> None:
    recording = _make_gate()
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    pod = deployment.inputs["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["opa"]
    (account,) = recording.of_type("kubernetes:core/v1:ServiceAccount")
    assert pod["serviceAccountName"] == account.inputs["metadata"]["name"]
    assert account.inputs["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is False
    rbac = [r for r in recording.resources if r.typ.startswith("kubernetes:rbac.")]
    assert rbac == []
    secrets = [s.inputs["metadata"]["name"] for s in recording.of_type("kubernetes:core/v1:Secret")]
    assert secrets == ["opa-serving"]


def _inputs_checksum(recording: Recording) -> str:
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    annotations = deployment.inputs["spec"]["template"]["metadata"]["annotations"]
    checksum: str = annotations["gpu-cluster.io/inputs-sha256"]
    return checksum


def test_opa_gate_policy_change_rolls_opa() -> None:
    # OPA reads its files only at start, so new policies must restart its pods.
    policies = load_policies()
    changed = {**policies, "gpu_scheduler": policies["gpu_scheduler"] + "\n# changed\n"}
    same = _inputs_checksum(_make_gate(policies=policies))
    assert _inputs_checksum(_make_gate(policies=dict(policies))) == same
    assert _inputs_checksum(_make_gate(policies=changed)) != same


def test_opa_gate_config_change_rolls_opa() -> None:
    before = _inputs_checksum(_make_gate(scheduler_name="gpu-pack"))
    assert _inputs_checksum(_make_gate(scheduler_name="gpu-pack-2")) != before


def test_opa_gate_native_engine_has_no_webhook_server() -> None:
    recording = _make_gate(engine="validating-admission-policy")
    assert recording.of_type(WEBHOOK) == []
    assert recording.of_type("kubernetes:apps/v1:Deployment") == []
    assert recording.of_type("tls:index/privateKey:PrivateKey") == []
    (policy,) = recording.of_type(VAP)
    (binding,) = recording.of_type(VAP_BINDING)
    assert binding.inputs["spec"] == admission_policy_binding_spec(
        "gpu-scheduler-gate", gate_namespace="gpu-admission"
    )
    assert binding.inputs["spec"]["validationActions"] == ["Deny"]
    assert policy.inputs["spec"]["failurePolicy"] == "Fail"


def test_opa_gate_native_engine_writes_the_gate_data_into_its_policy() -> None:
    recording = _make_gate(
        engine="validating-admission-policy", scheduler_name="gpu-pack", failure_policy="Ignore"
    )
    (policy,) = recording.of_type(VAP)
    data = gate_data("gpu-pack", ["example.com/dongle"], [])
    assert policy.inputs["spec"] == admission_policy_spec(
        data, "Ignore", gate_namespace="gpu-admission"
    )
    assert written_document(policy.inputs["spec"]) == data


def test_opa_gate_native_engine_has_no_parameter_object_to_edit_or_delete() -> None:
    # A parameter ConfigMap could be deleted (the binding skipped: the gate off) or edited
    # (another scheduler, anyone exempt) by whoever writes ConfigMaps in the gate's namespace.
    recording = _make_gate(engine="mutating-admission-policy", pool_toleration=POOL_TOLERATION)
    for kind in (VAP, MAP):
        (policy,) = recording.of_type(kind)
        assert "paramKind" not in policy.inputs["spec"]
    for kind in (VAP_BINDING, MAP_BINDING):
        (binding,) = recording.of_type(kind)
        assert "paramRef" not in binding.inputs["spec"]
    assert _config_maps(recording) == {}


def test_opa_gate_opa_engine_has_no_admission_policy() -> None:
    recording = _make_gate(engine="opa")
    assert recording.of_type(VAP) == []
    assert len(recording.of_type(WEBHOOK)) == 1


# Blast radius: what reaches OPA, and how OPA survives node maintenance.


def _webhook(recording: Recording) -> dict[str, Any]:
    (webhook,) = recording.of_type(WEBHOOK)
    hook: dict[str, Any] = webhook.inputs["webhooks"][0]
    return hook


def _opa_pod(recording: Recording) -> dict[str, Any]:
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    pod: dict[str, Any] = deployment.inputs["spec"]["template"]["spec"]
    return pod


def test_opa_gate_webhook_only_receives_gpu_pods() -> None:
    recording = _make_gate(gpu_resources=["example.com/dongle"])
    (condition,) = _webhook(recording)["matchConditions"]
    config = gate_data("gpu-binpack-scheduler", ["example.com/dongle"], [])
    assert condition["name"] == "gpu-pod"
    assert condition["expression"] == webhook_condition(config)
    # The parameter document OPA reads is written in; no params or variables are left.
    assert json.dumps(config, sort_keys=True) in condition["expression"]
    assert "variables." not in condition["expression"]


def test_opa_gate_match_condition_is_the_native_policys_cel() -> None:
    # One source: the webhook's condition inlines the native policy's variables.
    config = gate_data("gpu-binpack-scheduler", ["example.com/dongle"], ["vendor.example/"])
    variables = {v["name"]: v["expression"] for v in admission_policy_spec(config)["variables"]}
    condition = webhook_condition(config)
    assert variables["gpuByContainer"].split("variables.")[0] in condition
    assert gate_list(config, "gpu_resource_prefixes")[-1] == "vendor.example/"


def test_opa_gate_budget_keeps_one_replica_up() -> None:
    recording = _make_gate(replicas=2)
    (budget,) = recording.of_type("kubernetes:policy/v1:PodDisruptionBudget")
    spec = budget.inputs["spec"]
    assert spec["minAvailable"] == 1
    assert spec["selector"] == {"matchLabels": {"app.kubernetes.io/name": "opa"}}
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budget.inputs["metadata"]["namespace"] == "gpu-admission"


def test_opa_gate_single_replica_has_no_budget_that_blocks_drains() -> None:
    recording = _make_gate(replicas=1)
    assert recording.of_type("kubernetes:policy/v1:PodDisruptionBudget") == []


def test_opa_gate_native_engine_has_no_budget() -> None:
    recording = _make_gate(engine="validating-admission-policy")
    assert recording.of_type("kubernetes:policy/v1:PodDisruptionBudget") == []


def test_opa_gate_opa_replicas_prefer_different_nodes() -> None:
    pod = _opa_pod(_make_gate())
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "opa"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]
    )


def test_opa_gate_opa_runs_with_cluster_critical_priority() -> None:
    pod = _opa_pod(_make_gate())
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert not any(r.typ.endswith(":PriorityClass") for r in _make_gate().resources)


def test_opa_gate_serving_certificate_expiry_is_an_output() -> None:
    recording = _make_gate()
    (cert,) = recording.of_type("tls:index/locallySignedCert:LocallySignedCert")
    assert recording.outputs["servingCertNotAfter"] == "2028-11-23T11:00:00Z"
    assert cert.inputs["validityPeriodHours"] == 2 * 365 * 24


def test_opa_gate_native_engine_has_no_certificate_expiry() -> None:
    recording = _make_gate(engine="validating-admission-policy")
    assert recording.outputs["servingCertNotAfter"] == ""


# Routing: the default engine.

MAP = "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicy"
MAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicyBinding"
POOL_TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}


def test_opa_gate_routing_is_the_default_engine() -> None:
    assert OpaGateArgs.model_fields["engine"].default == "mutating-admission-policy"


def test_opa_gate_routing_engine_routes_then_refuses_the_rest() -> None:
    recording = _make_gate(engine="mutating-admission-policy", pool_toleration=POOL_TOLERATION)
    (routing,) = recording.of_type(MAP)
    (routing_binding,) = recording.of_type(MAP_BINDING)
    (policy,) = recording.of_type(VAP)
    assert recording.of_type(WEBHOOK) == []
    data = gate_data(
        "gpu-binpack-scheduler", ["example.com/dongle"], [], pool_toleration=POOL_TOLERATION
    )
    assert routing.inputs["spec"] == routing_policy_spec(data, gate_namespace="gpu-admission")
    assert routing_binding.inputs["spec"] == routing_binding_spec(
        "gpu-scheduler-gate", gate_namespace="gpu-admission"
    )
    # What cannot be routed is refused by the same validation as the reject-only engine.
    assert policy.inputs["spec"] == admission_policy_spec(data, gate_namespace="gpu-admission")


def test_opa_gate_routing_adds_the_pools_toleration_as_given() -> None:
    toleration = {**POOL_TOLERATION, "key": "gpu-cluster.io/pool", "value": "a100"}
    recording = _make_gate(engine="mutating-admission-policy", pool_toleration=toleration)
    params = recording.gate_document()
    assert params["pool_pods.taint.key"] == "gpu-cluster.io/pool"
    assert params["pool_pods.taint.value"] == "a100"
    assert params["pool_pods.taint.effect"] == "NoSchedule"


def test_opa_gate_routing_without_a_pool_only_sets_the_scheduler() -> None:
    recording = _make_gate(engine="mutating-admission-policy")
    params = recording.gate_document()
    assert not [k for k in params if k.startswith("pool_pods.")]


def test_opa_gate_routing_leaves_bound_pods_as_they_are() -> None:
    # A node's mirror pod must stay as its kubelet wrote it; other bound pods are refused.
    spec = routing_policy_spec(gate_data("s", [], []))
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    unbound = "!has(object.spec.nodeName) || object.spec.nodeName == ''"
    assert conditions["not-bound"] == f"[{unbound}].exists(v_unbound, v_unbound)"


def test_opa_gate_reject_only_engines_route_nothing() -> None:
    for engine in ("opa", "validating-admission-policy"):
        recording = _make_gate(engine=engine, pool_toleration=POOL_TOLERATION)
        assert recording.of_type(MAP) == [] and recording.of_type(MAP_BINDING) == []


def test_opa_gate_device_resources_are_gated_whatever_gate_extended_resources_says() -> None:
    recording = _make_gate(
        engine="validating-admission-policy",
        gate_extended_resources=False,
        device_resources=["nvidia.com/gpu.shared"],
        gpu_resource_prefixes=["nvidia.com/mig-"],
    )
    params = recording.gate_document()
    assert gate_list(params, "gpu_resources") == gated_names(["nvidia.com/gpu.shared"])
    assert "example.com/dongle" not in gate_list(params, "gpu_resources")


# One definition of a GPU: whatever the scheduler weighs as one is gated, and nothing else.


def _gated(config: dict[str, Any], name: str) -> bool:
    """As the policies match a resource name against the gate data."""
    return name in gate_list(config, "gpu_resources") or any(
        name.startswith(p) for p in gate_list(config, "gpu_resource_prefixes")
    )


@pytest.mark.parametrize(
    "name",
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.5gb",
        "amd.com/gpu",
        "gpu.intel.com/i915",
        "cpu",
        "example.com/dongle",
    ],
)
def test_opa_gate_gates_exactly_what_the_scheduler_weighs_as_a_gpu(name: str) -> None:
    recording = _make_gate(gpu_resources=[])
    gate = json.loads(_config_maps(recording)["gpu-gate-config"]["data"]["gate.json"])
    assert _gated(gate, name) == is_gpu_resource(name)


# NVIDIA_VISIBLE_DEVICES reaches GPUs without a request: OPA must see pods that set it.


def test_opa_gate_webhook_also_receives_pods_that_set_nvidia_visible_devices() -> None:
    (condition,) = _webhook(_make_gate())["matchConditions"]
    assert condition["expression"] == webhook_condition(
        gate_data("gpu-binpack-scheduler", ["example.com/dongle"], [])
    )
    assert "NVIDIA_VISIBLE_DEVICES" in condition["expression"]


# The GPU Operator's own pods: its settings say which, the gate lets them through.

OPERATOR_PODS = GpuOperatorSettings.model_validate({"enabled": True}).operator_pods()
VALIDATOR = '"system:serviceaccount:gpu-operator:nvidia-operator-validator"'


def test_opa_gate_operator_pods_reach_the_policy_data() -> None:
    recording = _make_gate(operator_pods=OPERATOR_PODS)
    gate = json.loads(_config_maps(recording)["gpu-gate-config"]["data"]["gate.json"])
    assert {k: v for k, v in gate.items() if k.startswith("operator_pods.")} == {
        "operator_pods.namespace": "gpu-operator",
        "operator_pods.creators": "system:serviceaccount:gpu-operator:nvidia-operator-validator",
        "operator_pods.daemonset_controllers": (
            "system:kube-controller-manager,system:serviceaccount:kube-system:daemon-set-controller"
        ),
    }


def test_opa_gate_operator_pods_never_reach_opa() -> None:
    # The device plugin's pods set NVIDIA_VISIBLE_DEVICES: an OPA outage must not hold them.
    (condition,) = _webhook(_make_gate(operator_pods=OPERATOR_PODS))["matchConditions"]
    # Not for an exempt pod: the operator's pods (its creators, from the document) included.
    assert "!v_exempt && " in condition["expression"]
    assert VALIDATOR.strip('"') in condition["expression"]


def test_opa_gate_operator_pods_reach_the_native_policy() -> None:
    recording = _make_gate(engine="validating-admission-policy", operator_pods=OPERATOR_PODS)
    params = recording.gate_document()
    assert params["operator_pods.namespace"] == "gpu-operator"
    assert VALIDATOR.strip('"') in gate_list(params, "operator_pods.creators")


def test_opa_gate_without_the_operator_exempts_no_pods() -> None:
    recording = _make_gate(engine="validating-admission-policy")
    params = recording.gate_document()
    assert [k for k in params if k.startswith("operator_pods.")] == []


def test_opa_gate_operator_pods_are_data_of_one_shape() -> None:
    pods = OperatorPods(namespace="ns", creators=("u",), daemonset_controllers=("c",))
    data = gate_data("s", [], [], operator_pods=pods)
    assert {k: v for k, v in data.items() if k.startswith("operator_pods.")} == {
        "operator_pods.namespace": "ns",
        "operator_pods.creators": "u",
        "operator_pods.daemonset_controllers": "c",
    }


# Pool pods: whatever tolerates the pool's taint is placed by the stack's scheduler alone.


def _gate_json(recording: Recording) -> dict[str, Any]:
    gate: dict[str, Any] = json.loads(
        _config_maps(recording)["gpu-gate-config"]["data"]["gate.json"]
    )
    return gate


def test_opa_gate_pool_toleration_names_the_pool_pods_in_the_policy_data() -> None:
    gate = _gate_json(_make_gate(pool_toleration=POOL_TOLERATION))
    assert {k: gate[k] for k in ("pool_pods.taint.key", "pool_pods.taint.value")} == {
        "pool_pods.taint.key": "nvidia.com/gpu",
        "pool_pods.taint.value": "present",
    }
    assert gate["pool_pods.taint.effect"] == "NoSchedule"


def test_opa_gate_without_a_pool_toleration_judges_no_pool_pods() -> None:
    assert [k for k in _gate_json(_make_gate()) if k.startswith("pool_pods.")] == []


def test_opa_gate_webhook_receives_pool_pods() -> None:
    (condition,) = _webhook(_make_gate(pool_toleration=POOL_TOLERATION))["matchConditions"]
    config = gate_data(
        "gpu-binpack-scheduler", ["example.com/dongle"], [], pool_toleration=POOL_TOLERATION
    )
    assert condition["expression"] == webhook_condition(config)
    assert '"pool_pods.taint.key": "nvidia.com/gpu"' in condition["expression"]


@pytest.mark.parametrize("engine", ["validating-admission-policy", "mutating-admission-policy"])
def test_opa_gate_native_engines_refuse_pool_pods_off_the_scheduler(engine: str) -> None:
    recording = _make_gate(engine=engine, pool_toleration=POOL_TOLERATION)
    (policy,) = recording.of_type(VAP)
    assert "variables.poolPod" in policy.inputs["spec"]["validations"][-1]["expression"]
    params = recording.gate_document()
    assert params["pool_pods.taint.key"] == "nvidia.com/gpu"


def test_opa_gate_routing_engine_routes_pool_pods() -> None:
    recording = _make_gate(engine="mutating-admission-policy", pool_toleration=POOL_TOLERATION)
    (routing,) = recording.of_type(MAP)
    conditions = {c["name"]: c["expression"] for c in routing.inputs["spec"]["matchConditions"]}
    assert "v_poolPod" in conditions["gpu-pool-or-gang-pod"]
    assert "variables." not in conditions["gpu-pool-or-gang-pod"]
