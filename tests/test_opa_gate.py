"""OpaGate under Pulumi mocks: certificates, exclusions, ordering and the engine switch.

tests/integration/test_opa_gate_live.py proves both engines against a real kube-apiserver.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from components import ClusterAccess, OpaGate, OpaGateArgs
from components.opa_gate import (
    admission_policy_binding_spec,
    admission_policy_spec,
    gate_data,
    ignore_selector,
    load_policies,
    opa_run_args,
)
from tests.conftest import Recording, register

WEBHOOK = "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def _make_gate(**overrides: Any) -> Recording:
    def build() -> None:
        access = ClusterAccess.create("cluster", "apiVersion: v1\nkind: Config\n", None)
        args: dict[str, Any] = {
            "access": access,
            "scheduler_name": "gpu-binpack-scheduler",
            "gpu_resources": ["example.com/dongle"],
            **overrides,
        }
        OpaGate("gate", OpaGateArgs(**args))

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


def test_opa_gate_labels_its_namespace_and_kube_system_ignore() -> None:
    recording = _make_gate()
    (namespace,) = recording.of_type("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["labels"]["openpolicyagent.org/webhook"] == "ignore"
    (patch,) = recording.of_type("kubernetes:core/v1:NamespacePatch")
    assert patch.inputs["metadata"] == {
        "name": "kube-system",
        "labels": {"openpolicyagent.org/webhook": "ignore"},
    }


def test_opa_gate_webhook_skips_ignored_namespaces_and_uses_config() -> None:
    recording = _make_gate(failure_policy="Ignore", timeout_seconds=3)
    (webhook,) = recording.of_type(WEBHOOK)
    hook = webhook.inputs["webhooks"][0]
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "openpolicyagent.org/webhook", "operator": "NotIn", "values": ["ignore"]}
        ]
    }
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 3)
    assert hook["rules"][0]["operations"] == ["CREATE"]
    assert hook["rules"][0]["resources"] == ["pods"]


def test_opa_gate_webhook_is_registered_after_opa_and_exclusions() -> None:
    recording = _make_gate()
    (webhook,) = recording.of_type(WEBHOOK)
    needed = {
        recording.named("gate-opa").urn,
        recording.named("gate-namespace").urn,
        recording.named("gate-kube-system-label").urn,
    }
    assert needed <= set(webhook.dependencies)


def test_opa_gate_policies_reach_configmaps_without_tests() -> None:
    recording = _make_gate()
    maps = _config_maps(recording)
    labelled = {
        n
        for n, c in maps.items()
        if c["metadata"]["labels"].get("openpolicyagent.org/policy") == "rego"
    }
    assert labelled == {"policy-admission", "policy-gpu-scheduler"}
    assert set(maps["opa-startup-policies"]["data"]) == {"authz.rego", "health.rego"}
    assert not any("_test" in key for c in maps.values() for key in c["data"])
    assert (
        maps["policy-gpu-scheduler"]["data"]["gpu_scheduler.rego"]
        == load_policies()["gpu_scheduler"]
    )


def test_opa_gate_config_is_data_not_rego() -> None:
    recording = _make_gate(scheduler_name="gpu-pack")
    gate = json.loads(_config_maps(recording)["gpu-gate-config"]["data"]["gate.json"])
    assert gate == {
        "scheduler_name": "gpu-pack",
        "gpu_resources": ["example.com/dongle", "nvidia.com/gpu"],
        "gpu_resource_prefixes": ["nvidia.com/mig-"],
    }
    assert not any("gpu-pack" in source for source in load_policies().values())


def test_opa_gate_leaves_advertised_resources_ungated_when_told_to() -> None:
    recording = _make_gate(gate_extended_resources=False)
    gate = json.loads(_config_maps(recording)["gpu-gate-config"]["data"]["gate.json"])
    assert gate["gpu_resources"] == ["nvidia.com/gpu"]


def test_opa_gate_management_api_is_loopback_only() -> None:
    recording = _make_gate()
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    opa = deployment.inputs["spec"]["template"]["spec"]["containers"][0]
    addrs = [a for a in opa["args"] if a.startswith("--addr=")]
    assert addrs == ["--addr=https://0.0.0.0:8443", "--addr=http://127.0.0.1:8181"]
    assert {"--authentication=token", "--authorization=basic"} <= set(opa["args"])
    assert opa["readinessProbe"]["httpGet"] == {
        "scheme": "HTTPS",
        "port": 8443,
        "path": "/health/ready",
    }
    assert opa["image"].startswith("openpolicyagent/opa:1.")
    assert opa["args"] == opa_run_args()


def test_opa_gate_kube_mgmt_and_opa_share_the_management_token() -> None:
    recording = _make_gate()
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    opa, kube_mgmt = deployment.inputs["spec"]["template"]["spec"]["containers"]
    (secret,) = [
        s for s in recording.of_type("kubernetes:core/v1:Secret") if s.name == "gate-mgmt-token"
    ]
    assert "stringData" in secret.secret_inputs
    token = secret.inputs["stringData"]["value"]  # the whole map is one secret
    assert json.loads(token["token.json"]) == {"token": token["token"]}
    assert len(token["token"]) == 64
    assert "--opa-auth-token-file=/mgmt/token" in kube_mgmt["args"]
    assert "gpu_cluster.mgmt:/mgmt/token.json" in opa["args"]


def test_opa_gate_rbac_is_configmaps_in_its_namespace() -> None:
    recording = _make_gate()
    (role,) = recording.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert role.inputs["metadata"]["namespace"] == "gpu-admission"
    assert role.inputs["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "update", "patch"],
        }
    ]
    assert recording.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding") == []


def test_opa_gate_native_engine_has_no_webhook_server() -> None:
    recording = _make_gate(engine="validating-admission-policy")
    assert recording.of_type(WEBHOOK) == []
    assert recording.of_type("kubernetes:apps/v1:Deployment") == []
    assert recording.of_type("tls:index/privateKey:PrivateKey") == []
    (policy,) = recording.of_type(VAP)
    (binding,) = recording.of_type(VAP_BINDING)
    assert binding.inputs["spec"] == admission_policy_binding_spec("gpu-scheduler-gate")
    assert binding.inputs["spec"]["validationActions"] == ["Deny"]
    assert policy.inputs["spec"]["matchConstraints"]["namespaceSelector"] == ignore_selector()


def test_opa_gate_native_engine_writes_gate_data_into_the_policy() -> None:
    recording = _make_gate(
        engine="validating-admission-policy", scheduler_name="gpu-pack", failure_policy="Ignore"
    )
    (policy,) = recording.of_type(VAP)
    spec = policy.inputs["spec"]
    assert spec == admission_policy_spec(
        gate_data("gpu-pack", ["example.com/dongle"], []), "Ignore"
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["requiredScheduler"] == '"gpu-pack"'
    assert variables["gpuResources"] == '["example.com/dongle", "nvidia.com/gpu"]'
    assert variables["gpuPrefixes"] == '["nvidia.com/mig-"]'


def test_opa_gate_native_engine_needs_no_parameter_object() -> None:
    # A binding whose parameter object is missing denies every pod it matches, CPU pods too.
    recording = _make_gate(engine="validating-admission-policy")
    (policy,) = recording.of_type(VAP)
    (binding,) = recording.of_type(VAP_BINDING)
    assert "paramKind" not in policy.inputs["spec"]
    assert "paramRef" not in binding.inputs["spec"]
    assert _config_maps(recording) == {}


def test_opa_gate_opa_engine_has_no_admission_policy() -> None:
    recording = _make_gate(engine="opa")
    assert recording.of_type(VAP) == []
    assert len(recording.of_type(WEBHOOK)) == 1
