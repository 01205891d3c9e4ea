"""OpaGate's builders as tables: settings in, the objects every engine renders out.

No Pulumi: each builder is a plain function of plain values. tests/opa_gate/test_component.py covers
the component's wiring; tests/integration/test_opa_gate_live.py creates these objects on a
real kube-apiserver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from components.gpu_resources import gated_names, gated_prefixes
from components.handoffs import OperatorPods
from components.kubernetes_names import DAEMONSET_CONTROLLERS
from components.opa_gate.manifests import (
    admission_policy_binding_spec,
    admission_policy_spec,
    allocation_objects,
    ephemeral_containers_rule,
    excluded_namespaces,
    gate_config_json,
    gate_data,
    gate_metadata,
    inputs_checksum,
    judged_rules,
    namespace_selector,
    native_objects,
    opa_container,
    opa_deployment_spec,
    opa_disruption_budget,
    opa_pod_spec,
    opa_run_args,
    opa_service_spec,
    pod_create_rule,
    pod_update_rule,
    policy_files,
    routing_binding_spec,
    routing_policy_spec,
    serving_dns_names,
    webhook_client_config,
    webhook_spec,
)

CONFIG = gate_data("gpu-binpack-scheduler", ["example.com/dongle"], [])
TOLERATION = {"key": "gpu-cluster.io/gpu", "operator": "Exists", "effect": "NoSchedule"}
POD_CREATE = {
    "operations": ["CREATE"],
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods"],
}
# A pod's tolerations may grow through an update of the pod itself.
POD_UPDATE = {
    "operations": ["UPDATE"],
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods"],
}
# `kubectl debug` adds an ephemeral container to a running pod through this subresource.
EPHEMERAL_CONTAINERS_UPDATE = {
    "operations": ["UPDATE"],
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods/ephemeralcontainers"],
}
LABELS = {
    "app.kubernetes.io/name": "gpu-scheduler-gate",
    "app.kubernetes.io/part-of": "gpu-cluster",
}


def _webhook(namespace: str = "gpu-admission", **settings: Any) -> dict[str, Any]:
    return webhook_spec(
        config=CONFIG,
        client_config=webhook_client_config("pem", namespace, "opa"),
        gate_namespace=namespace,
        **settings,
    )


# Each engine's object that selects namespaces, and where in it the selector sits.
SELECTORS: dict[str, Callable[[str], Any]] = {
    "webhook": lambda ns: _webhook(ns)["namespaceSelector"],
    "validating-policy": lambda ns: admission_policy_spec(CONFIG, gate_namespace=ns)[
        "matchConstraints"
    ]["namespaceSelector"],
    "validating-binding": lambda ns: admission_policy_binding_spec(gate_namespace=ns)[
        "matchResources"
    ]["namespaceSelector"],
    "routing-policy": lambda ns: routing_policy_spec(CONFIG, gate_namespace=ns)["matchConstraints"][
        "namespaceSelector"
    ],
    "routing-binding": lambda ns: routing_binding_spec(gate_namespace=ns)["matchResources"][
        "namespaceSelector"
    ],
}


@pytest.mark.parametrize(
    ("gate_namespace", "excluded"),
    [
        ("gpu-admission", ["gpu-admission", "kube-system"]),
        ("zz-gate", ["kube-system", "zz-gate"]),
        ("kube-system", ["kube-system"]),
    ],
)
@pytest.mark.parametrize("selected_by", sorted(SELECTORS))
def test_opa_gate_manifests_every_engine_excludes_kube_system_and_the_gate_by_name(
    selected_by: str, gate_namespace: str, excluded: list[str]
) -> None:
    assert excluded_namespaces(gate_namespace) == excluded
    expected = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}
        ]
    }
    assert namespace_selector(gate_namespace) == expected
    assert SELECTORS[selected_by](gate_namespace) == expected


@pytest.mark.parametrize(
    ("engine", "rules", "expected"),
    [
        (
            "opa",
            lambda: _webhook()["rules"],
            [
                {**POD_CREATE, "scope": "Namespaced"},
                {**POD_UPDATE, "scope": "Namespaced"},
                {**EPHEMERAL_CONTAINERS_UPDATE, "scope": "Namespaced"},
            ],
        ),
        (
            "validating-admission-policy",
            lambda: admission_policy_spec(CONFIG)["matchConstraints"]["resourceRules"],
            [POD_CREATE, POD_UPDATE, EPHEMERAL_CONTAINERS_UPDATE],
        ),
        # Routing mutates only what is being created.
        (
            "mutating-admission-policy",
            lambda: routing_policy_spec(CONFIG)["matchConstraints"]["resourceRules"],
            [POD_CREATE],
        ),
    ],
)
def test_opa_gate_manifests_every_engine_judges_pod_creates_updates_and_added_ephemeral_containers(
    engine: str, rules: Callable[[], list[dict[str, Any]]], expected: list[dict[str, Any]]
) -> None:
    assert pod_create_rule() == POD_CREATE
    assert ephemeral_containers_rule() == EPHEMERAL_CONTAINERS_UPDATE
    assert pod_update_rule() == POD_UPDATE
    assert judged_rules() == [POD_CREATE, POD_UPDATE, EPHEMERAL_CONTAINERS_UPDATE]
    assert rules() == expected


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
@pytest.mark.parametrize(
    ("engine", "render"),
    [
        ("opa", lambda fp: _webhook(failure_policy=fp)),
        ("validating-admission-policy", lambda fp: admission_policy_spec(CONFIG, fp)),
        ("mutating-admission-policy", lambda fp: routing_policy_spec(CONFIG, fp)),
    ],
)
def test_opa_gate_manifests_failure_policy_reaches_each_engine(
    engine: str, render: Callable[[str], dict[str, Any]], failure_policy: str
) -> None:
    assert render(failure_policy)["failurePolicy"] == failure_policy


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {},
            {
                "name": "gpu-scheduler.gpu-cluster.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "matchPolicy": "Equivalent",
            },
        ),
        (
            {"failure_policy": "Ignore", "timeout_seconds": 30},
            {
                "name": "gpu-scheduler.gpu-cluster.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 30,
                "matchPolicy": "Equivalent",
            },
        ),
    ],
)
def test_opa_gate_manifests_webhook_settings(
    settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    webhook = _webhook(**settings)
    assert {k: webhook[k] for k in expected} == expected
    assert [c["name"] for c in webhook["matchConditions"]] == ["gpu-pod"]


@pytest.mark.parametrize(
    ("ca_pem", "namespace", "service", "expected"),
    [
        (
            "pem",
            "gpu-admission",
            "opa",
            {
                "caBundle": "cGVt",
                "service": {"namespace": "gpu-admission", "name": "opa", "path": "/", "port": 443},
            },
        ),
        (
            "",
            "gate",
            "other",
            {
                "caBundle": "",
                "service": {"namespace": "gate", "name": "other", "path": "/", "port": 443},
            },
        ),
    ],
)
def test_opa_gate_manifests_webhook_calls_the_service_trusting_the_ca(
    ca_pem: str, namespace: str, service: str, expected: dict[str, Any]
) -> None:
    assert webhook_client_config(ca_pem, namespace, service) == expected


@pytest.mark.parametrize(
    ("binding", "expected"),
    [
        (
            admission_policy_binding_spec,
            {
                "policyName": "gpu-scheduler-gate",
                "validationActions": ["Deny"],
            },
        ),
        (routing_binding_spec, {"policyName": "gpu-scheduler-gate"}),
    ],
)
def test_opa_gate_manifests_bindings_name_the_gate_policy(
    binding: Callable[..., dict[str, Any]], expected: dict[str, Any]
) -> None:
    spec = binding()
    assert {k: v for k, v in spec.items() if k != "matchResources"} == expected
    assert binding("policy-x")["policyName"] == "policy-x"


def test_opa_gate_manifests_routing_policy_patches_unbound_gpu_pods() -> None:
    spec = routing_policy_spec(CONFIG)
    assert spec["reinvocationPolicy"] == "IfNeeded"
    assert "paramKind" not in spec
    assert [c["name"] for c in spec["matchConditions"]] == ["gpu-pool-or-gang-pod", "not-bound"]
    # The scheduler, then the pool's toleration (only with a valid pool in the parameters).
    assert len(spec["mutations"]) == 2
    assert {m["patchType"] for m in spec["mutations"]} == {"JSONPatch"}


@pytest.mark.parametrize(
    ("resources", "prefixes", "operator_pods", "expected"),
    [
        (
            [],
            [],
            None,
            {
                "scheduler_name": "s",
                "gpu_resources": ",".join(gated_names([])),
                "gpu_resource_prefixes": ",".join(gated_prefixes([])),
            },
        ),
        (
            ["nvidia.com/gpu", "example.com/dongle"],
            ["nvidia.com/mig-", ""],
            OperatorPods(
                namespace="gpu-operator", creators=("b", "a"), daemonset_controllers=("d",)
            ),
            {
                "scheduler_name": "s",
                # Every GPU (components/gpu_resources.py), and what the layers add, once each.
                "gpu_resources": ",".join(gated_names(["example.com/dongle"])),
                "gpu_resource_prefixes": ",".join(gated_prefixes(["nvidia.com/mig-"])),
                "operator_pods.namespace": "gpu-operator",
                "operator_pods.creators": "a,b",
                "operator_pods.daemonset_controllers": "d",
            },
        ),
    ],
)
def test_opa_gate_manifests_gate_data(
    resources: list[str],
    prefixes: list[str],
    operator_pods: OperatorPods | None,
    expected: dict[str, Any],
) -> None:
    assert gate_data("s", resources, prefixes, operator_pods=operator_pods) == expected


def test_opa_gate_manifests_gate_data_names_the_pool_taint_of_the_pools_toleration() -> None:
    toleration = {
        "key": "gpu-cluster.io/pool",
        "operator": "Equal",
        "value": "a100",
        "effect": "PreferNoSchedule",
    }
    data = gate_data("s", [], [], pool_toleration=toleration)
    assert {k: v for k, v in data.items() if k.startswith("pool_pods.")} == {
        "pool_pods.taint.key": "gpu-cluster.io/pool",
        "pool_pods.taint.value": "a100",
        "pool_pods.taint.effect": "PreferNoSchedule",
        # Who creates a DaemonSet's pods: their pool pods stay with the cluster's scheduler.
        "pool_pods.daemonset_controllers": ",".join(sorted(DAEMONSET_CONTROLLERS)),
    }
    assert [k for k in gate_data("s", [], []) if k.startswith("pool_pods.")] == []


def test_opa_gate_manifests_gate_data_names_the_stacks_priority_classes() -> None:
    data = gate_data(
        "s",
        [],
        [],
        priority_classes=["gpu-training", "gpu-inference"],
        priority_class_namespaces=["web", "ml-serving", "web"],
    )
    assert data["priority_classes"] == "gpu-inference,gpu-training"
    assert data["priority_class_namespaces"] == "ml-serving,web"
    # Without layer 8's classes the document is as it was, namespaces or not; without
    # namespaces, no key for them.
    assert gate_data("s", [], [], priority_class_namespaces=["web"]) == gate_data("s", [], [])
    only = gate_data("s", [], [], priority_classes=["gpu-batch"])
    assert "priority_class_namespaces" not in only


def test_opa_gate_manifests_native_policies_judge_priority_classes_on_creation_only() -> None:
    variables = {v["name"]: v["expression"] for v in admission_policy_spec(CONFIG)["variables"]}
    assert variables["stackPriorityClass"].startswith("variables.creating &&")
    (rule,) = [
        v
        for v in admission_policy_spec(CONFIG)["validations"]
        if "spec.priorityClassName" in v["messageExpression"]
    ]
    assert "!variables.priorityClassMisused" in rule["expression"]
    # OPA is sent what it refuses: a CPU pod naming one of the stack's classes.
    (webhook,) = webhook_spec(config=CONFIG, client_config={})["matchConditions"]
    assert "v_priorityClassMisused" in webhook["expression"]


def test_opa_gate_manifests_native_policies_read_the_pool_from_their_parameter() -> None:
    validations = admission_policy_spec(CONFIG)["validations"]
    (pool_rule,) = [
        v for v in validations if "(one scheduler places every pod" in v["messageExpression"]
    ]
    assert "!variables.poolPod" in pool_rule["expression"]


@pytest.mark.parametrize(
    ("name", "namespace", "expected"),
    [
        ("gpu-scheduler-gate", None, {"name": "gpu-scheduler-gate", "labels": LABELS}),
        ("opa", "gpu-admission", {"name": "opa", "namespace": "gpu-admission", "labels": LABELS}),
    ],
)
def test_opa_gate_manifests_metadata(
    name: str, namespace: str | None, expected: dict[str, Any]
) -> None:
    assert gate_metadata(name, namespace) == expected


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        (0, None),
        (1, None),
        (
            2,
            {
                "minAvailable": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": "opa"}},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        ),
        (
            5,
            {
                "minAvailable": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": "opa"}},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        ),
    ],
)
def test_opa_gate_manifests_budget(replicas: int, expected: dict[str, Any] | None) -> None:
    assert opa_disruption_budget(replicas, {"app.kubernetes.io/name": "opa"}) == expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (
            {},
            {
                "serviceAccountName": "opa",
                "certs": "opa-serving",
                "policies": "opa-policies",
                "config": "gpu-gate-config",
            },
        ),
        (
            {
                "service_account": "sa",
                "serving_secret": "tls",
                "policies_configmap": "p",
                "config_configmap": "c",
            },
            {"serviceAccountName": "sa", "certs": "tls", "policies": "p", "config": "c"},
        ),
    ],
)
def test_opa_gate_manifests_pod_mounts_what_it_is_given(
    names: dict[str, str], expected: dict[str, str]
) -> None:
    spec = opa_pod_spec("opa:1", **names)
    volumes = {
        v["name"]: v.get("secret", {}).get("secretName") or v["configMap"]["name"]
        for v in spec["volumes"]
    }
    assert {"serviceAccountName": spec["serviceAccountName"], **volumes} == expected
    assert spec["automountServiceAccountToken"] is False
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["containers"] == [opa_container("opa:1")]


@pytest.mark.parametrize("image", ["openpolicyagent/opa:1.22.2", "registry.invalid/opa:1"])
def test_opa_gate_manifests_container_runs_opa_over_https(image: str) -> None:
    container = opa_container(image)
    assert container["image"] == image
    assert container["args"] == opa_run_args()
    assert container["ports"] == [{"name": "https", "containerPort": 8443}]
    assert container["readinessProbe"]["httpGet"] == {
        "scheme": "HTTPS",
        "port": 8443,
        "path": "/health/ready",
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/certs", "/policies", "/config"]


@pytest.mark.parametrize("replicas", [1, 3])
def test_opa_gate_manifests_deployment_rolls_on_its_inputs(replicas: int) -> None:
    spec = opa_deployment_spec(replicas, {"containers": []}, "abc")
    assert spec == {
        "replicas": replicas,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "opa"}},
        "template": {
            "metadata": {
                "labels": {**LABELS, "app.kubernetes.io/name": "opa"},
                "annotations": {"gpu-cluster.io/inputs-sha256": "abc"},
            },
            "spec": {"containers": []},
        },
    }


def test_opa_gate_manifests_service_sends_443_to_opa() -> None:
    assert opa_service_spec() == {
        "selector": {"app.kubernetes.io/name": "opa"},
        "ports": [{"name": "https", "port": 443, "targetPort": 8443}],
    }


@pytest.mark.parametrize(
    ("cert", "config", "files", "digest"),
    [
        (
            "CERT",
            {"scheduler_name": "s"},
            {"a.rego": "package a"},
            "cd5f9bac38d3bd7b38e0dd4873bbe26a6253abb84019b8c5e52c6d00a2c591b8",
        ),
        (
            "CERT2",
            {"scheduler_name": "s"},
            {"a.rego": "package a"},
            "5938f5c5ffdb7cb9a3cf582a2299462c42c3f9aea557175dc91777038c447ad0",
        ),
    ],
)
def test_opa_gate_manifests_inputs_checksum(
    cert: str, config: dict[str, Any], files: dict[str, str], digest: str
) -> None:
    assert inputs_checksum(cert, config, files) == digest


@pytest.mark.parametrize(
    ("changed", "value"),
    [("cert", "other"), ("config", {"scheduler_name": "t"}), ("files", {"a.rego": "package b"})],
)
def test_opa_gate_manifests_any_input_changes_the_checksum(changed: str, value: Any) -> None:
    inputs: dict[str, Any] = {
        "cert": "CERT",
        "config": {"scheduler_name": "s"},
        "files": {"a.rego": "package a"},
    }
    before = inputs_checksum(inputs["cert"], inputs["config"], inputs["files"])
    inputs[changed] = value
    assert inputs_checksum(inputs["cert"], inputs["config"], inputs["files"]) != before


@pytest.mark.parametrize(
    ("config", "text"),
    [({"b": 1, "a": [1, 2]}, '{"a": [1, 2], "b": 1}'), ({}, "{}")],
)
def test_opa_gate_manifests_gate_config_json(config: dict[str, Any], text: str) -> None:
    assert gate_config_json(config) == text


@pytest.mark.parametrize(
    ("policies", "files"),
    [
        ({"b": "package b", "a": "package a"}, {"a.rego": "package a", "b.rego": "package b"}),
        ({}, {}),
    ],
)
def test_opa_gate_manifests_policy_files(policies: dict[str, str], files: dict[str, str]) -> None:
    assert policy_files(policies) == files
    assert list(policy_files(policies)) == sorted(files)


@pytest.mark.parametrize(
    ("service", "namespace", "names"),
    [
        ("opa", "gpu-admission", ["opa.gpu-admission.svc", "opa.gpu-admission.svc.cluster.local"]),
        ("gate", "x", ["gate.x.svc", "gate.x.svc.cluster.local"]),
    ],
)
def test_opa_gate_manifests_serving_dns_names(
    service: str, namespace: str, names: list[str]
) -> None:
    assert serving_dns_names(service, namespace) == names


@pytest.mark.parametrize(
    ("routing", "expected"),
    [
        (False, ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]),
        (
            True,
            [
                "validatingadmissionpolicies",
                "validatingadmissionpolicybindings",
                "mutatingadmissionpolicies",
                "mutatingadmissionpolicybindings",
            ],
        ),
    ],
)
def test_opa_gate_manifests_native_objects_list_each_engines_policies_then_bindings(
    routing: bool, expected: list[str]
) -> None:
    objects = native_objects(CONFIG, routing=routing)
    assert [collection for collection, _, _ in objects] == expected
    assert {name for _, name, _ in objects} == {"gpu-scheduler-gate"}
    assert objects[0][2] == admission_policy_spec(CONFIG)


def test_opa_gate_manifests_native_objects_add_the_claim_policies_in_dra_mode() -> None:
    dra = gate_data("s", [], [], device_classes=["gpu.nvidia.com"])
    names = [(c, n) for c, n, _ in native_objects(dra, routing=True)]
    for kind in ("resourceclaimtemplates", "resourceclaims"):
        name = f"gpu-scheduler-gate-{kind}"
        for collection in (
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings",
        ):
            assert (collection, name) in names
    allocation = allocation_objects(allocator="u", scheduler_name="s", drivers=["gpu.nvidia.com"])
    assert [(c, n) for c, n, _ in allocation] == [
        ("validatingadmissionpolicies", "gpu-scheduler-gate-allocations"),
        ("validatingadmissionpolicybindings", "gpu-scheduler-gate-allocations"),
    ]
