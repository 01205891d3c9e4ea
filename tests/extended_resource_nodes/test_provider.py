"""ExtendedResourceNodesProvider (every node's extended resources as one node set), fake node API.

tests/integration runs the same provider on a real kube-apiserver and under the real engine.
"""

from __future__ import annotations

from typing import Any

import pytest

from components.extended_resource_nodes.provider import ExtendedResourceNodesProvider
from components.providers.node_api import NodeApiError
from tests.fake_node_api import SERVER, FakeNodeApi, configured

DONGLE = "example.com/dongle"
FPGA = "example.com/fpga"
OWNER = "org/gpu-cluster/a"


def _make_provider(api: FakeNodeApi) -> ExtendedResourceNodesProvider:
    return configured(ExtendedResourceNodesProvider(lambda _kubeconfig, _context: api))


def _props(nodes: dict[str, dict[str, int]], **overrides: Any) -> dict[str, Any]:
    return {"nodes": nodes, "owner": OWNER, **overrides}


def _outs(result: Any) -> dict[str, Any]:
    assert result.outs is not None
    return dict(result.outs)


def _status(api: FakeNodeApi, node: str, field: str = "capacity") -> dict[str, str]:
    return dict(api.nodes[node]["status"].get(field, {}))


def test_extended_resource_node_set_create_sets_capacity_and_allocatable_on_every_node() -> None:
    api = FakeNodeApi({"w-1": {}, "w-2": {}})
    outs = _outs(
        _make_provider(api).create(_props({"w-1": {DONGLE: 4, FPGA: 1}, "w-2": {DONGLE: 2}}))
    )
    assert _status(api, "w-1") == {"cpu": "8", "memory": "32Gi", DONGLE: "4", FPGA: "1"}
    assert _status(api, "w-1", "allocatable") == {DONGLE: "4", FPGA: "1"}
    assert _status(api, "w-2", "allocatable") == {DONGLE: "2"}
    assert outs["applied"]["w-2"]["spec"] == {DONGLE: 2} and outs["failed"] == {}
    assert api.writes == 2  # one write per node: the counts and their ownership records


def test_extended_resource_node_set_rerun_changes_nothing_and_writes_nothing() -> None:
    api = FakeNodeApi({f"w-{i}": {} for i in range(20)})
    provider = _make_provider(api)
    wanted = {n: {DONGLE: 4} for n in api.nodes}
    outs = _outs(provider.create(_props(wanted)))
    assert provider.diff("id", outs, _props(wanted)).changes is False
    writes = api.writes
    provider.update("id", outs, _props(wanted))
    assert api.writes == writes


def test_extended_resource_node_set_update_changes_counts_and_drops_a_removed_resource() -> None:
    api = FakeNodeApi({"w-1": {}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4, FPGA: 1}})))
    outs = _outs(provider.update("id", outs, _props({"w-1": {DONGLE: 6}})))
    assert _status(api, "w-1", "allocatable") == {DONGLE: "6"}
    assert list(api.nodes["w-1"]["metadata"]["annotations"]) == [
        k for k in api.nodes["w-1"]["metadata"]["annotations"] if "capacity" in k
    ]
    assert len(api.nodes["w-1"]["metadata"]["annotations"]) == 1


def test_extended_resource_node_set_destroy_puts_back_what_was_advertised_before() -> None:
    api = FakeNodeApi(
        {"w-1": {"status": {"capacity": {DONGLE: "1"}, "allocatable": {DONGLE: "1"}}}, "w-2": {}}
    )
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}, "w-2": {DONGLE: 4}})))
    provider.delete("id", outs)
    assert _status(api, "w-1")[DONGLE] == _status(api, "w-1", "allocatable")[DONGLE] == "1"
    assert DONGLE not in _status(api, "w-2") and DONGLE not in _status(api, "w-2", "allocatable")
    assert not any(api.nodes[n]["metadata"].get("annotations") for n in api.nodes)


def test_extended_resource_node_set_node_removed_from_the_layer_is_released() -> None:
    api = FakeNodeApi({"w-1": {}, "w-2": {}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}, "w-2": {DONGLE: 4}})))
    outs = _outs(provider.update("id", outs, _props({"w-1": {DONGLE: 4}})))
    assert DONGLE not in _status(api, "w-2") and list(outs["applied"]) == ["w-1"]


def test_extended_resource_node_set_failed_nodes_are_all_named_and_the_others_applied() -> None:
    api = FakeNodeApi({f"w-{i}": {} for i in range(10)})

    def refuse(node: str) -> None:
        if node in ("w-3", "w-8"):
            raise NodeApiError(f"cannot patch node {node!r} on API server {SERVER} (HTTP 500)")

    api.before_write = refuse
    outs = _outs(_make_provider(api).create(_props({n: {DONGLE: 1} for n in api.nodes})))
    assert sorted(outs["failed"]) == ["w-3", "w-8"]
    assert [n for n in api.nodes if DONGLE in _status(api, n)] == [
        n for n in api.nodes if n not in ("w-3", "w-8")
    ]


def test_extended_resource_node_set_refresh_sees_what_the_kubelet_dropped_and_up_puts_it_back() -> (
    None
):
    api = FakeNodeApi({"w-1": {}, "w-2": {}})
    provider = _make_provider(api)
    wanted = _props({"w-1": {DONGLE: 4}, "w-2": {DONGLE: 4}})
    outs = _outs(provider.create(wanted))
    api.edit("w-2", lambda node: node["status"]["capacity"].pop(DONGLE))
    del api.nodes["w-1"]  # decommissioned
    refreshed = _outs(provider.read("id", outs))
    assert refreshed["applied"]["w-2"]["live"] == {DONGLE: None}
    assert list(refreshed["applied"]) == ["w-2"]
    provider.update("id", refreshed, _props({"w-2": {DONGLE: 4}}))
    assert _status(api, "w-2")[DONGLE] == "4"
    provider.delete("id", refreshed)


def test_extended_resource_node_set_of_another_stack_are_refused_and_left_alone() -> None:
    api = FakeNodeApi({"w-1": {}})
    _make_provider(api).create(_props({"w-1": {DONGLE: 4}}))
    other = _outs(
        _make_provider(api).create(_props({"w-1": {DONGLE: 9}}, owner="org/gpu-cluster/b"))
    )
    assert "managed by stack 'org/gpu-cluster/a'" in other["failed"]["w-1"]
    _make_provider(api).delete("id", other)
    assert _status(api, "w-1")[DONGLE] == "4"


def test_extended_resource_node_set_delete_of_vanished_nodes_is_done() -> None:
    api = FakeNodeApi({"w-1": {}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}})))
    del api.nodes["w-1"]
    provider.delete("id", outs)
    with pytest.raises(KeyError):
        api.nodes["w-1"]


def test_extended_resource_node_set_write_from_one_list_and_reread_only_after_a_conflict() -> None:
    api = FakeNodeApi({f"w-{i}": {} for i in range(10)})
    raced: list[str] = []

    def kubelet_writes(node: str) -> None:
        if node == "w-6" and not raced:
            raced.append(node)  # a status update between our LIST and our patch
            api.edit(node, lambda n: n["status"]["capacity"].update(pods="110"))

    api.before_write = kubelet_writes
    outs = _outs(_make_provider(api).create(_props({n: {DONGLE: 1} for n in api.nodes})))
    assert outs["failed"] == {} and (api.lists, api.reads) == (1, 1)
    assert _status(api, "w-6") == {"cpu": "8", "memory": "32Gi", "pods": "110", DONGLE: "1"}


def _set_count(api: FakeNodeApi, node: str, resource: str, count: str | None) -> None:
    """A status write by someone else (an admin's patch, the kubelet re-registering)."""

    def edit(n: dict[str, Any]) -> None:
        for field in ("capacity", "allocatable"):
            values = n["status"].setdefault(field, {})
            if count is None:
                values.pop(resource, None)
            else:
                values[resource] = count

    api.edit(node, edit)


def _ownership(api: FakeNodeApi, node: str) -> dict[str, str]:
    return dict(api.nodes[node]["metadata"].get("annotations") or {})


def test_extended_resource_node_set_destroy_leaves_a_count_set_since_and_drops_the_record() -> None:
    api = FakeNodeApi({"w-1": {"status": {"capacity": {DONGLE: "1"}, "allocatable": {}}}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}})))
    _set_count(api, "w-1", DONGLE, "8")
    provider.delete("id", outs)
    assert _status(api, "w-1")[DONGLE] == _status(api, "w-1", "allocatable")[DONGLE] == "8"
    assert _ownership(api, "w-1") == {}


def test_extended_resource_node_set_destroy_does_not_bring_back_a_count_gone_since() -> None:
    """The kubelet re-registered and dropped every count: the one the stack replaced is not
    advertised again by destroy."""
    api = FakeNodeApi({"w-1": {"status": {"capacity": {DONGLE: "1"}, "allocatable": {}}}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}})))
    _set_count(api, "w-1", DONGLE, None)
    provider.delete("id", outs)
    assert DONGLE not in _status(api, "w-1") and _ownership(api, "w-1") == {}


def test_extended_resource_node_set_a_resource_left_out_keeps_a_count_set_since() -> None:
    api = FakeNodeApi({"w-1": {}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4, FPGA: 1}})))
    _set_count(api, "w-1", FPGA, "2")
    outs = _outs(provider.update("id", outs, _props({"w-1": {DONGLE: 4}})))
    assert outs["failed"] == {} and _status(api, "w-1", "allocatable") == {DONGLE: "4", FPGA: "2"}
    assert len(_ownership(api, "w-1")) == 1  # the dongle's


def test_extended_resource_node_set_up_refuses_to_overwrite_a_count_set_since() -> None:
    api = FakeNodeApi({"w-1": {}, "w-2": {}})
    provider = _make_provider(api)
    wanted = _props({"w-1": {DONGLE: 4}, "w-2": {DONGLE: 4}})
    outs = _outs(provider.create(wanted))
    _set_count(api, "w-1", DONGLE, "8")
    _set_count(api, "w-2", DONGLE, None)
    outs = _outs(provider.update("id", _outs(provider.read("id", outs)), wanted))
    assert list(outs["failed"]) == ["w-1"]
    assert (
        "changed since this stack set it (the stack set '4', the node has '8')"
        in (outs["failed"]["w-1"])
    )
    assert _status(api, "w-1")[DONGLE] == "8" and _status(api, "w-2")[DONGLE] == "4"


def test_extended_resource_node_set_up_puts_back_a_count_the_kubelet_reset_to_zero() -> None:
    """A reimaged host re-registers under its Node: the kubelet sets every extended resource to
    0 in capacity and allocatable, keeping the Node's annotations. That is no one's edit: the
    next `up` advertises the stack's count again, with the record it had; an admin's count on
    another node in the same run stays refused."""
    api = FakeNodeApi(
        {"w-1": {"status": {"capacity": {DONGLE: "1"}, "allocatable": {}}}, "w-2": {}}
    )
    provider = _make_provider(api)
    wanted = _props({"w-1": {DONGLE: 4}, "w-2": {DONGLE: 4}})
    outs = _outs(provider.create(wanted))
    records = _ownership(api, "w-1")
    _set_count(api, "w-1", DONGLE, "0")
    _set_count(api, "w-2", DONGLE, "8")

    refreshed = _outs(provider.read("id", outs))
    assert refreshed["applied"]["w-1"]["live"] == {DONGLE: 0}
    outs = _outs(provider.update("id", refreshed, wanted))

    assert list(outs["failed"]) == ["w-2"] and "the node has '8'" in outs["failed"]["w-2"]
    assert _status(api, "w-1")[DONGLE] == _status(api, "w-1", "allocatable")[DONGLE] == "4"
    assert _ownership(api, "w-1") == records  # what was advertised before is still known
    provider.delete("id", outs)
    assert _status(api, "w-1")[DONGLE] == "1"


def test_extended_resource_node_set_a_zero_in_capacity_alone_is_an_edit_and_refused() -> None:
    """The kubelet resets capacity and allocatable together; 0 in capacity beside the stack's
    count in allocatable was written by someone else."""
    api = FakeNodeApi({"w-1": {}})
    provider = _make_provider(api)
    wanted = _props({"w-1": {DONGLE: 4}})
    outs = _outs(provider.create(wanted))
    api.edit("w-1", lambda node: node["status"]["capacity"].update({DONGLE: "0"}))

    outs = _outs(provider.update("id", _outs(provider.read("id", outs)), wanted))

    assert "the stack set '4', the node has '0'" in outs["failed"]["w-1"]
    assert _status(api, "w-1")[DONGLE] == "0"


def test_extended_resource_node_set_destroy_after_the_kubelet_reset_leaves_no_resource_behind() -> (
    None
):
    """Destroy after the kubelet's reset: a resource the stack brought goes (its 0 is the
    stack's count, reset); a count that was there before is not advertised again."""
    api = FakeNodeApi(
        {"w-1": {}, "w-2": {"status": {"capacity": {DONGLE: "1"}, "allocatable": {}}}}
    )
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}, "w-2": {DONGLE: 4}})))
    for node in ("w-1", "w-2"):
        _set_count(api, node, DONGLE, "0")

    provider.delete("id", outs)

    assert DONGLE not in _status(api, "w-1") and DONGLE not in _status(api, "w-1", "allocatable")
    assert _status(api, "w-2")[DONGLE] == _status(api, "w-2", "allocatable")[DONGLE] == "0"
    assert _ownership(api, "w-1") == _ownership(api, "w-2") == {}


def test_extended_resource_node_set_a_failed_node_taken_out_of_the_layer_is_forgotten() -> None:
    api = FakeNodeApi({"w-1": {}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}, "w-gone": {DONGLE: 4}})))
    assert list(outs["failed"]) == ["w-gone"]
    news = _props({"w-1": {DONGLE: 4}})
    assert provider.diff("id", outs, news).changes is True
    outs = _outs(provider.update("id", outs, news))
    assert outs["failed"] == {} and provider.diff("id", outs, news).changes is False


def test_extended_resource_node_set_another_backend_s_stack_of_the_same_names_is_refused() -> None:
    api = FakeNodeApi({"w-1": {}})
    _make_provider(api).create(_props({"w-1": {DONGLE: 4}}, owner="id-a", stack=OWNER))
    other = _props({"w-1": {DONGLE: 4}}, owner="id-b", stack=OWNER)
    outs = _outs(_make_provider(api).create(other))
    assert f"managed by stack '{OWNER}' (stack id id-a)" in outs["failed"]["w-1"]
    _make_provider(api).delete("id", outs)
    assert _status(api, "w-1")[DONGLE] == "4"


def test_extended_resource_node_set_records_of_the_former_identity_are_its_own() -> None:
    api = FakeNodeApi({"w-1": {}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props({"w-1": {DONGLE: 4}})))
    with_id = _props({"w-1": {DONGLE: 6}}, owner="id-a", stack=OWNER)
    outs = _outs(provider.update("id", outs, with_id))
    assert outs["failed"] == {} and _status(api, "w-1")[DONGLE] == "6"
    provider.delete("id", outs)
    assert DONGLE not in _status(api, "w-1") and _ownership(api, "w-1") == {}
