"""The node dynamic providers against the real kube-apiserver, with Node objects the test creates.

The providers' create/read/update/delete run exactly as the Pulumi engine would call them,
through the production `KubeNodeApi` (the official kubernetes client), against etcd +
kube-apiserver from the harness.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client

from components.extended_resource_nodes.provider import ExtendedResourceNodesProvider
from components.providers import node_api
from components.providers.node_api import (
    KubeNodeApi,
    NodeApiError,
)
from components.tainted_gpu_pool.provider import GpuPoolNodesProvider
from tests.fake_node_api import stack_config_request
from tools.harness import LocalControlPlane

DONGLE = "example.com/dongle"
P = TypeVar("P")
UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def kubeconfig(control_plane: LocalControlPlane) -> str:
    """The admin kubeconfig as content, the way the stack hands it to the providers."""
    return control_plane.kubeconfig_yaml()


@pytest.fixture
def core(api_client: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def node(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh Node with cpu/memory and one extended resource that is not ours."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": {"cpu": "8", "memory": "32Gi", "example.org/other": "2"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "example.org/other": "2"},
            }
        },
    )
    try:
        yield name
    finally:
        core.delete_node(name)


def _configure(provider: P, kubeconfig: str) -> P:
    """The provider as the engine starts it: configured with the stack's kubeconfig."""
    provider.configure(stack_config_request(kubeconfig))  # type: ignore[attr-defined]
    return provider


def _live(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    node: dict[str, Any] = client.ApiClient().sanitize_for_serialization(core.read_node(name))
    return node


def test_refused_credentials_name_node_and_server(
    control_plane: LocalControlPlane, node: str
) -> None:
    api = KubeNodeApi(control_plane.kubeconfig_yaml(user={"token": "not-a-valid-token"}), None)

    with pytest.raises(NodeApiError) as caught:
        api.get_node(node)

    message = str(caught.value)
    assert "refused the credentials" in message and "HTTP 401" in message
    assert repr(node) in message and control_plane.server in message


@pytest.fixture
def fleet(core: client.CoreV1Api) -> Iterator[list[str]]:
    """Five fresh Nodes with a kubelet's capacity, the first one cordoned."""
    names = [f"fleet-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    status = {"capacity": {"cpu": "8", "memory": "32Gi"}, "allocatable": {"cpu": "8"}}
    for name in names:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
        core.patch_node_status(name, {"status": status})
    core.patch_node(names[0], {"spec": {"taints": [UNSCHEDULABLE]}})
    try:
        yield names
    finally:
        for name in names:
            core.delete_node(name)


def test_node_sets_apply_refresh_and_undo_a_fleet(
    kubeconfig: str, core: client.CoreV1Api, fleet: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_api, "LIST_PAGE", 2)  # refresh reads the nodes in pages
    before = {name: _live(core, name) for name in fleet}
    pool = _configure(GpuPoolNodesProvider(), kubeconfig)
    advertised = _configure(ExtendedResourceNodesProvider(), kubeconfig)
    owner = "org/gpu-cluster/a"
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    pool_props = {"nodes": fleet, "labels": {"gpu-cluster.io/pool": "gpu"}, "owner": owner, **taint}
    pool_outs = dict(pool.create(pool_props).outs or {})
    counts = {name: {DONGLE: 2} for name in fleet}
    advertised_outs = dict(advertised.create({"nodes": counts, "owner": owner}).outs or {})

    assert pool_outs["failed"] == advertised_outs["failed"] == {}
    for name in fleet:
        live = _live(core, name)
        assert taint in live["spec"]["taints"]
        assert live["metadata"]["labels"]["gpu-cluster.io/pool"] == "gpu"
        assert live["status"]["allocatable"][DONGLE] == "2"
    assert UNSCHEDULABLE in _live(core, fleet[0])["spec"]["taints"]

    refreshed = dict(pool.read("id", pool_outs).outs or {})
    assert sorted(refreshed["applied"]) == sorted(fleet)
    assert not any(record["drift"] for record in refreshed["applied"].values())

    pool.delete("id", refreshed)
    advertised.delete("id", advertised_outs)
    for name in fleet:
        live, earlier = _live(core, name), before[name]
        assert live["spec"].get("taints") == earlier["spec"].get("taints")
        assert live["metadata"].get("labels") == earlier["metadata"].get("labels")
        assert DONGLE not in (live.get("status") or {}).get("capacity", {})
        assert not live["metadata"].get("annotations")


def test_pool_leaves_a_quarantine_set_since_on_up_and_destroy(
    kubeconfig: str, core: client.CoreV1Api, fleet: list[str]
) -> None:
    """An admin reuses the pool's taint key to quarantine a node (`kubectl taint --overwrite`,
    another value): `up` after a refresh refuses to overwrite it, naming the node, and
    `destroy` leaves it and drops the stack's records."""
    before = _live(core, fleet[1])
    pool = _configure(GpuPoolNodesProvider(), kubeconfig)
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    props = {
        "nodes": fleet[1:3],
        "labels": {"gpu-cluster.io/pool": "gpu"},
        "owner": "3f5c0d1e9a7b4c21",
        "stack": "org/gpu-cluster/a",
        **taint,
    }
    outs = dict(pool.create(props).outs or {})
    quarantine = {**taint, "value": "quarantine"}
    core.patch_node(fleet[2], {"spec": {"taints": [quarantine]}})

    refreshed = dict(pool.read("id", outs).outs or {})
    outs = dict(pool.update("id", refreshed, props).outs or {})
    assert list(outs["failed"]) == [fleet[2]]
    assert "changed since this stack set it" in outs["failed"][fleet[2]]
    pool.delete("id", outs)

    quarantined, released = _live(core, fleet[2]), _live(core, fleet[1])
    assert quarantined["spec"]["taints"] == [quarantine]
    assert not quarantined["metadata"].get("annotations")
    assert released["spec"].get("taints") == before["spec"].get("taints")
    assert released["metadata"].get("labels") == before["metadata"].get("labels")
    assert not released["metadata"].get("annotations")


def test_extended_resources_of_a_thousand_or_more_stay_the_stack_s_own(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    """The API server keeps a count in canonical form (1000 as "1k"): `refresh` reads it as
    the count the stack set, a new count is no overwrite of someone else's, and `destroy`
    takes it back."""
    advertised = _configure(ExtendedResourceNodesProvider(), kubeconfig)
    props = {"nodes": {node: {DONGLE: 1000}}, "owner": "org/gpu-cluster/a"}
    outs = dict(advertised.create(props).outs or {})
    assert _live(core, node)["status"]["capacity"][DONGLE] == "1k"

    refreshed = dict(advertised.read("id", outs).outs or {})
    assert refreshed["applied"][node]["live"] == {DONGLE: 1000}
    assert refreshed["applied"][node]["drift"] is False
    changed = {**props, "nodes": {node: {DONGLE: 2000}}}
    outs = dict(advertised.update("id", refreshed, changed).outs or {})

    assert outs["failed"] == {} and _live(core, node)["status"]["allocatable"][DONGLE] == "2k"
    advertised.delete("id", outs)
    assert DONGLE not in _live(core, node)["status"]["capacity"]
