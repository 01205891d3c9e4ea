"""bench/local_stack.py and bench/floor.py: the floor taken from a state, node writes,
readiness, goals.

The bench itself needs the built tools and a local cluster; it is run by hand
(bench/README.md), not here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.floor import (
    SECRET_SIGNATURE,
    Rendered,
    crd_established,
    deployment_available,
    floor_units,
    has_ready_endpoint,
    node_writes,
    reveal,
    waits_for_endpoints,
)
from bench.local_stack import (
    EMPTY_UP,
    FLOOR_UP,
    NOOP_UP,
    UP,
    Row,
    add_ratios,
    cold_builds,
    failure_reason,
    verdicts,
)
from components.cluster_access import HELM_RELEASE

STACK = "urn:pulumi:local::gpu-cluster::pulumi:pulumi:Stack::gpu-cluster-local"


def _secret(value: Any) -> dict[str, str]:
    return {SECRET_SIGNATURE: "1b47061264138c4ac30d75fd1eb44270", "plaintext": json.dumps(value)}


def _resource(urn: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"urn": urn, "type": kind, "custom": True, "parent": STACK, **fields}


def _node(**overrides: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "taints": [],
        "labels": {"kubernetes.io/hostname": "n1"},
        "annotations": {},
        "capacity": {"cpu": "8"},
        "allocatable": {"cpu": "8"},
    }
    return {**state, **overrides}


def test_cold_builds_reads_the_last_time_of_each_tool() -> None:
    log = "building pulumi ...\nbuilt pulumi in 300 s\nbuilt etcd in 44 s\nbuilt pulumi in 12 s\n"

    assert cold_builds(log) == {"pulumi": 12, "etcd": 44}


def test_reveal_unwraps_nested_secrets() -> None:
    state = {"stringData": _secret({"password": _secret("hunter2")}), "plain": [1, _secret(2)]}

    assert reveal(state) == {"stringData": {"password": "hunter2"}, "plain": [1, 2]}


def test_reveal_refuses_a_secret_without_its_plaintext() -> None:
    with pytest.raises(ValueError, match="--show-secrets"):
        reveal({SECRET_SIGNATURE: "x", "ciphertext": "..."})


def test_floor_units_keep_kubernetes_objects_in_state_order_without_internal_keys() -> None:
    resources = [
        {"urn": STACK, "type": "pulumi:pulumi:Stack", "custom": False},
        _resource("p", "pulumi:providers:kubernetes"),
        _resource("nodes", "pulumi-python:dynamic:Resource"),
        _resource(
            "ns",
            "kubernetes:core/v1:Namespace",
            inputs={
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "gate", "__defaults": ["name"]},
                "__fieldsByName": {},
            },
        ),
        _resource(
            "secret",
            "kubernetes:core/v1:Secret",
            inputs={
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s", "namespace": "gate"},
                "stringData": _secret({"k": "v"}),
            },
        ),
    ]

    units = floor_units(resources, {})

    assert [u.urn for u in units] == ["ns", "secret"]
    assert units[0].objects == [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gate"}}
    ]
    assert units[1].objects[0]["stringData"] == {"k": "v"}


def test_floor_units_replace_a_helm_release_by_what_its_chart_rendered() -> None:
    values = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r-values"}}
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition"}
    resources = [_resource("release", HELM_RELEASE, inputs={"chart": "/charts/x"})]

    (unit,) = floor_units(resources, {"release": Rendered(crds=[crd], objects=[values])})

    assert (unit.objects, unit.chart_crds) == ([values], [crd])


def test_floor_units_refuse_a_helm_release_that_was_not_read() -> None:
    with pytest.raises(ValueError, match="release"):
        floor_units([_resource("release", HELM_RELEASE, inputs={})], {})


def test_floor_units_expand_a_dependency_on_a_component_to_its_resources() -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    resources = [
        {"urn": "gate", "type": "gpu-cluster:index:OpaGate", "custom": False, "parent": STACK},
        _resource("ns", "kubernetes:core/v1:Namespace", parent="gate", inputs=body),
        _resource("map", "kubernetes:core/v1:ConfigMap", parent="gate", inputs=body),
        _resource("rule", "kubernetes:core/v1:ConfigMap", dependencies=["gate"], inputs=body),
    ]

    units = floor_units(resources, {})

    assert units[-1].dependencies == frozenset({"ns", "map"})


def test_floor_units_mark_patch_resources() -> None:
    patch = _resource(
        "p",
        "kubernetes:core/v1:ConfigMapPatch",
        inputs={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kubeadm-config"}},
    )

    assert floor_units([patch], {})[0].patch


def test_node_writes_take_labels_taints_and_resources_there_and_back() -> None:
    before = {"n1": _node()}
    after = {
        "n1": _node(
            taints=[("nvidia.com/gpu", "present", "NoSchedule")],
            labels={"kubernetes.io/hostname": "n1", "pool": "gpu"},
            capacity={"cpu": "8", "example.com/dongle": "4"},
            allocatable={"cpu": "8", "example.com/dongle": "4"},
        )
    }

    (write,), (undo,) = node_writes(before, after)

    assert write.metadata_spec == {
        "metadata": {"labels": {"pool": "gpu"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
    }
    assert write.status == {
        "status": {
            "capacity": {"example.com/dongle": "4"},
            "allocatable": {"example.com/dongle": "4"},
        }
    }
    assert undo.metadata_spec == {"metadata": {"labels": {"pool": None}}, "spec": {"taints": None}}
    assert undo.status == {
        "status": {
            "capacity": {"example.com/dongle": None},
            "allocatable": {"example.com/dongle": None},
        }
    }


def test_node_writes_leave_out_unchanged_nodes() -> None:
    assert node_writes({"n1": _node()}, {"n1": _node()}) == ([], [])


def test_deployment_available_needs_the_current_generation_and_every_replica() -> None:
    deployment = {"metadata": {"generation": 2}, "spec": {"replicas": 2}}
    old = {"observedGeneration": 1, "availableReplicas": 2}
    short = {"observedGeneration": 2, "availableReplicas": 1}

    assert not deployment_available({**deployment, "status": old})
    assert not deployment_available({**deployment, "status": short})
    assert deployment_available({**deployment, "status": {**short, "availableReplicas": 2}})


def test_crd_established_reads_the_condition() -> None:
    pending = {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"}]}}
    established = {"status": {"conditions": [{"type": "Established", "status": "True"}]}}

    assert (crd_established(pending), crd_established(established)) == (False, True)


def test_only_services_that_select_pods_wait_for_endpoints() -> None:
    assert waits_for_endpoints({"spec": {"selector": {"app": "opa"}}})
    assert not waits_for_endpoints({"spec": {"ports": [{"port": 443}]}})
    assert not waits_for_endpoints({"spec": {"selector": {"a": "b"}, "type": "ExternalName"}})


def test_has_ready_endpoint_counts_an_unset_ready_as_ready() -> None:
    not_ready = {"endpoints": [{"conditions": {"ready": False}}]}
    unknown: dict[str, Any] = {"endpoints": [{"conditions": {}}]}

    assert not has_ready_endpoint([not_ready, {"endpoints": None}])
    assert has_ready_endpoint([not_ready, unknown])


def test_goals_compare_each_step_with_its_reference() -> None:
    rows = [
        Row(UP, 30.0),
        Row(FLOOR_UP, 10.0),
        Row(NOOP_UP, 9.0),
        Row(EMPTY_UP, 5.0),
    ]

    add_ratios(rows)

    assert [(r.ratio, r.against) for r in rows[::2]] == [(3.0, FLOOR_UP), (1.8, EMPTY_UP)]
    assert [line.split()[-2] for line in verdicts(rows)] == ["MISS", "PASS"]


def test_goals_are_not_judged_without_the_reference() -> None:
    rows = [Row(UP, 30.0), Row(FLOOR_UP, None, note="FAILED")]

    add_ratios(rows)

    assert "not judged" in verdicts(rows)[0]


def test_failure_reason_is_the_cli_error_line() -> None:
    message = "code: 255\n stdout: Updating\n stderr: error: update failed\n  more detail\n"

    assert failure_reason(RuntimeError(message)) == "RuntimeError: stderr: error: update failed"
