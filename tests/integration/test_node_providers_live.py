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

from components.providers import node_api
from components.providers.advertised_resources import AdvertisedResourcesProvider
from components.providers.extended_resource import ExtendedResourceProvider
from components.providers.node_api import (
    Conflict,
    KubeNodeApi,
    NodeApi,
    NodeApiError,
    NodeNotFound,
    connect,
)
from components.providers.node_taint import NodeTaintProvider
from components.providers.pool_nodes import GpuPoolNodesProvider
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


def _resource_props(kubeconfig: str, node: str, quantity: int) -> dict[str, Any]:
    return {"node": node, "resource": DONGLE, "quantity": quantity, "owner": "org/gpu-cluster/a"}


def _taint_props(
    kubeconfig: str, node: str, value: str = "present", owner: str = "org/gpu-cluster/a"
) -> dict[str, Any]:
    return {
        "node": node,
        "key": "nvidia.com/gpu",
        "value": value,
        "effect": "NoSchedule",
        "owner": owner,
    }


def test_extended_resource_appears_in_capacity_and_allocatable(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    _configure(ExtendedResourceProvider(), kubeconfig).create(_resource_props(kubeconfig, node, 4))

    status = _live(core, node)["status"]
    assert status["capacity"][DONGLE] == "4"
    assert status["allocatable"][DONGLE] == "4"


def test_extended_resource_update_changes_the_count(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    provider = _configure(ExtendedResourceProvider(), kubeconfig)
    created = provider.create(_resource_props(kubeconfig, node, 4))

    provider.update(str(created.id), created.outs or {}, _resource_props(kubeconfig, node, 6))

    status = _live(core, node)["status"]
    assert (status["capacity"][DONGLE], status["allocatable"][DONGLE]) == ("6", "6")


def test_extended_resource_delete_removes_only_its_key(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    provider = _configure(ExtendedResourceProvider(), kubeconfig)
    props = _resource_props(kubeconfig, node, 4)
    created = provider.create(props)

    provider.delete(str(created.id), props)

    status = _live(core, node)["status"]
    for field in ("capacity", "allocatable"):
        assert DONGLE not in status[field]
        assert status[field]["example.org/other"] == "2"
        assert status[field]["cpu"] == "8"


def test_extended_resource_read_sees_a_change_behind_its_back(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    provider = _configure(ExtendedResourceProvider(), kubeconfig)
    props = _resource_props(kubeconfig, node, 4)
    created = provider.create(props)
    # What the kubelet does on re-registration: the manually advertised resource is gone.
    core.patch_node_status(
        node,
        [{"op": "remove", "path": "/status/capacity/example.com~1dongle"}],
        _content_type="application/json-patch+json",
    )

    read = provider.read(str(created.id), props)

    assert (read.outs or {})["quantity"] is None
    provider.create(props)  # the next `pulumi up` puts it back
    assert _live(core, node)["status"]["capacity"][DONGLE] == "4"


def test_extended_resource_missing_node_names_node_and_server(
    kubeconfig: str, control_plane: LocalControlPlane
) -> None:
    with pytest.raises(NodeNotFound) as caught:
        _configure(ExtendedResourceProvider(), kubeconfig).create(
            _resource_props(kubeconfig, "no-such-node", 1)
        )

    assert "'no-such-node'" in str(caught.value)
    assert control_plane.server in str(caught.value)


def test_refused_credentials_name_node_and_server(
    control_plane: LocalControlPlane, node: str
) -> None:
    api = KubeNodeApi(control_plane.kubeconfig_yaml(user={"token": "not-a-valid-token"}), None)

    with pytest.raises(NodeApiError) as caught:
        api.get_node(node)

    message = str(caught.value)
    assert "refused the credentials" in message and "HTTP 401" in message
    assert repr(node) in message and control_plane.server in message


def test_node_taint_keeps_taints_kubernetes_manages(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    core.patch_node(node, {"spec": {"taints": [UNSCHEDULABLE]}})
    provider = _configure(NodeTaintProvider(), kubeconfig)
    props = _taint_props(kubeconfig, node)

    created = provider.create(props)
    after_create = _live(core, node)["spec"]["taints"]
    provider.update(str(created.id), created.outs or {}, _taint_props(kubeconfig, node, "shared"))
    after_update = _live(core, node)["spec"]["taints"]
    provider.delete(str(created.id), created.outs or {})
    after_delete = _live(core, node)["spec"].get("taints")

    ours = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    assert after_create == [UNSCHEDULABLE, {**ours, "value": "present"}]
    assert after_update == [UNSCHEDULABLE, {**ours, "value": "shared"}]
    assert after_delete == [UNSCHEDULABLE]


def test_node_taint_delete_restores_a_taint_that_predates_the_stack(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    theirs = {"key": "nvidia.com/gpu", "value": "reserved", "effect": "NoSchedule"}
    core.patch_node(node, {"spec": {"taints": [theirs]}})
    provider = _configure(NodeTaintProvider(), kubeconfig)

    created = provider.create(_taint_props(kubeconfig, node))
    assert _live(core, node)["spec"]["taints"] == [{**theirs, "value": "present"}]
    provider.delete(str(created.id), created.outs or {})

    assert _live(core, node)["spec"]["taints"] == [theirs]


def test_node_taint_read_sees_removal_behind_its_back(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    provider = _configure(NodeTaintProvider(), kubeconfig)
    props = _taint_props(kubeconfig, node)
    created = provider.create(props)
    core.patch_node(node, {"spec": {"taints": None}})

    read = provider.read(str(created.id), created.outs or {})

    assert (read.outs or {})["present"] is False
    assert provider.diff(str(created.id), read.outs or {}, props).changes


class _RacingApi:
    """The real NodeApi, with another writer sneaking in between our read and our write.

    The first merge patch is preceded by a concurrent taint added through a separate client,
    so the API server must reject our stale resourceVersion with 409 Conflict.
    """

    def __init__(self, api: NodeApi, core: client.CoreV1Api) -> None:
        self._api = api
        self._core = core
        self.server = api.server
        self.conflicts = 0
        self.raced = False

    def get_node(self, name: str) -> dict[str, Any]:
        return self._api.get_node(name)

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._api.list_nodes()

    def patch_status(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return self._api.patch_status(name, ops)

    def merge_patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if not self.raced:
            self.raced = True
            racer = {"key": "example.org/maintenance", "effect": "PreferNoSchedule"}
            self._core.patch_node(name, {"spec": {"taints": [racer]}})
        try:
            return self._api.merge_patch(name, patch)
        except Conflict:
            self.conflicts += 1
            raise


def test_node_taint_concurrent_write_is_retried_not_lost(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    racing: list[_RacingApi] = []

    def connect_racing(config: str, context: str | None) -> NodeApi:
        racing.append(_RacingApi(connect(config, context), core))
        return racing[-1]

    _configure(NodeTaintProvider(connect_racing), kubeconfig).create(_taint_props(kubeconfig, node))

    taints = _live(core, node)["spec"]["taints"]
    assert [r.conflicts for r in racing] == [1]
    assert {"key": "example.org/maintenance", "effect": "PreferNoSchedule"} in taints
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints


def test_two_stacks_on_one_cluster_never_undo_each_other(
    kubeconfig: str, core: client.CoreV1Api, node: str
) -> None:
    """The owner is recorded on the Node itself: a second stack is refused, and destroying it
    (or re-running the first after an interruption) leaves the first stack's taint as it is."""
    first = _configure(NodeTaintProvider(), kubeconfig)
    outs = dict(first.create(_taint_props(kubeconfig, node)).outs or {})
    again = dict(first.create(_taint_props(kubeconfig, node)).outs or {})
    assert again["previous"] is None  # its own taint is not taken for a prior one

    second = _configure(NodeTaintProvider(), kubeconfig)
    with pytest.raises(NodeApiError, match="managed by stack 'org/gpu-cluster/a'"):
        second.create(_taint_props(kubeconfig, node, "b", owner="org/gpu-cluster/b"))
    second.delete(
        "id", {**_taint_props(kubeconfig, node, "b", owner="org/gpu-cluster/b"), "previous": None}
    )
    taints = _live(core, node)["spec"]["taints"]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints

    first.delete("id", outs)
    live = _live(core, node)
    assert all(t["key"] != "nvidia.com/gpu" for t in live["spec"].get("taints") or [])
    assert not any(
        k.startswith("ownership.gpu-cluster.io/") for k in live["metadata"].get("annotations") or {}
    )


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
    advertised = _configure(AdvertisedResourcesProvider(), kubeconfig)
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
