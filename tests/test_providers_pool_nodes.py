"""GpuPoolNodesProvider (the pool's taint and labels as one node set) against the fake node API.

tests/integration runs the same provider on a real kube-apiserver and under the real engine.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.providers.node_api import NodeApiError
from components.providers.node_set import failure_message
from components.providers.node_taint import NodeTaintProvider
from components.providers.pool_nodes import GpuPoolNodesProvider
from tests.fake_node_api import SERVER, FakeNodeApi, configured

UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
POOL = {"gpu-cluster.io/pool": "gpu"}
OWNER = "org/gpu-cluster/a"


def _make_provider(api: FakeNodeApi) -> GpuPoolNodesProvider:
    return configured(GpuPoolNodesProvider(lambda _kubeconfig, _context: api))


def _props(nodes: list[str], **overrides: Any) -> dict[str, Any]:
    return {"nodes": nodes, "owner": OWNER, "labels": dict(POOL), **GPU, **overrides}


def _outs(result: Any) -> dict[str, Any]:
    assert result.outs is not None
    return dict(result.outs)


def _fleet(n: int, **node: Any) -> FakeNodeApi:
    return FakeNodeApi({f"gpu-{i:03d}": dict(node) for i in range(n)})


def _taints(api: FakeNodeApi, node: str) -> list[dict[str, Any]]:
    return list(api.nodes[node]["spec"].get("taints") or [])


def _entries(taints: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(t, sort_keys=True) for t in taints)


def _labels(api: FakeNodeApi, node: str) -> dict[str, str]:
    return dict(api.nodes[node]["metadata"].get("labels") or {})


def _refuse(api: FakeNodeApi, nodes: set[str]) -> None:
    def before_write(node: str) -> None:
        if node in nodes:
            raise NodeApiError(f"cannot patch node {node!r} on API server {SERVER} (HTTP 500)")

    api.before_write = before_write


def test_pool_nodes_create_taints_and_labels_every_node_keeping_other_taints() -> None:
    api = FakeNodeApi({"gpu-1": {"spec": {"taints": [dict(UNSCHEDULABLE)]}}, "gpu-2": {}})
    outs = _outs(_make_provider(api).create(_props(["gpu-1", "gpu-2"])))
    assert _taints(api, "gpu-1") == [UNSCHEDULABLE, GPU]
    assert _taints(api, "gpu-2") == [GPU]
    assert _labels(api, "gpu-1") == _labels(api, "gpu-2") == POOL
    assert sorted(outs["applied"]) == ["gpu-1", "gpu-2"] and outs["failed"] == {}


def test_pool_nodes_rerun_changes_nothing_and_writes_nothing() -> None:
    api = _fleet(20)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    assert provider.diff("id", outs, _props(sorted(api.nodes))).changes is False
    writes = api.writes
    again = _outs(provider.update("id", outs, _props(sorted(api.nodes))))
    assert api.writes == writes
    assert again["applied"] == outs["applied"]


def test_pool_nodes_destroy_puts_back_what_each_node_had() -> None:
    api = FakeNodeApi(
        {
            "gpu-1": {"spec": {"taints": [{**GPU, "value": "old"}, dict(UNSCHEDULABLE)]}},
            "gpu-2": {"metadata": {"labels": {"gpu-cluster.io/pool": "cpu", "zone": "a"}}},
        }
    )
    before = {name: api.get_node(name) for name in api.nodes}
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-1", "gpu-2"])))
    assert _labels(api, "gpu-2") == {"gpu-cluster.io/pool": "gpu", "zone": "a"}
    provider.delete("id", outs)
    for name, node in before.items():
        # The same entries (the restored one goes back at the end of the list).
        assert _entries(_taints(api, name)) == _entries(node["spec"].get("taints") or [])
        assert _labels(api, name) == (node["metadata"].get("labels") or {})
        assert not api.nodes[name]["metadata"].get("annotations")


def test_pool_nodes_node_removed_from_the_inventory_is_released() -> None:
    api = _fleet(3)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-000", "gpu-001", "gpu-002"])))
    news = _props(["gpu-000", "gpu-002"])
    assert provider.diff("id", outs, news).changes is True
    outs = _outs(provider.update("id", outs, news))
    assert _taints(api, "gpu-001") == [] and _labels(api, "gpu-001") == {}
    assert sorted(outs["applied"]) == ["gpu-000", "gpu-002"]
    assert _taints(api, "gpu-000") == [GPU]


def test_pool_nodes_value_change_updates_in_place_and_key_change_replaces() -> None:
    api = _fleet(2)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    diff = provider.diff("id", outs, _props(sorted(api.nodes), value="a100"))
    assert (diff.changes, diff.replaces) == (True, [])
    provider.update("id", outs, _props(sorted(api.nodes), value="a100"))
    assert _taints(api, "gpu-001") == [{**GPU, "value": "a100"}]
    replace = provider.diff("id", outs, _props(sorted(api.nodes), key="example.com/gpu"))
    assert replace.replaces == ["key"] and replace.delete_before_replace


def test_pool_nodes_failed_nodes_are_all_named_and_the_others_applied() -> None:
    api = _fleet(30)
    _refuse(api, {"gpu-007", "gpu-021"})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    assert sorted(outs["failed"]) == ["gpu-007", "gpu-021"]
    assert "HTTP 500" in outs["failed"]["gpu-007"]
    assert all(_taints(api, n) == [GPU] for n in api.nodes if n not in outs["failed"])
    assert _taints(api, "gpu-007") == _taints(api, "gpu-021") == []
    message = failure_message("GPU pool taint and labels", outs["failed"], 30)
    assert message.splitlines()[0].endswith("2 of 30 nodes failed, the others are done:")
    assert "gpu-007: cannot patch node 'gpu-007'" in message and "gpu-021" in message
    # The next up retries just those nodes.
    api.before_write = None
    assert provider.diff("id", outs, _props(sorted(api.nodes))).changes is True
    writes = api.writes
    outs = _outs(provider.update("id", outs, _props(sorted(api.nodes))))
    assert outs["failed"] == {} and api.writes - writes == 2
    assert _taints(api, "gpu-007") == [GPU]


def test_pool_nodes_of_another_stack_are_refused_and_left_alone() -> None:
    api = _fleet(2)
    _make_provider(api).create(_props(["gpu-000", "gpu-001"]))
    other = _outs(_make_provider(api).create(_props(["gpu-001"], owner="org/gpu-cluster/b")))
    assert "managed by stack 'org/gpu-cluster/a'" in other["failed"]["gpu-001"]
    assert other["applied"] == {}
    _make_provider(api).delete("id", other)
    assert _taints(api, "gpu-001") == [GPU] and _labels(api, "gpu-001") == POOL


def test_pool_nodes_refresh_lists_once_drops_vanished_nodes_and_marks_drift() -> None:
    api = _fleet(4)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    del api.nodes["gpu-003"]
    api.edit("gpu-001", lambda node: node["spec"].pop("taints"))
    reads, lists = api.reads, api.lists
    refreshed = _outs(provider.read("id", outs))
    assert (api.lists - lists, api.reads - reads) == (1, 0)
    assert sorted(refreshed["applied"]) == ["gpu-000", "gpu-001", "gpu-002"]
    assert [n for n, r in refreshed["applied"].items() if r["drift"]] == ["gpu-001"]
    provider.delete("id", refreshed)  # the vanished node does not block destroy
    assert all(_taints(api, n) == [] for n in api.nodes)


def test_pool_nodes_drift_is_put_back_by_the_next_up() -> None:
    api = _fleet(2)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    api.edit("gpu-000", lambda node: node["metadata"]["labels"].pop("gpu-cluster.io/pool"))
    refreshed = _outs(provider.read("id", outs))
    assert provider.diff("id", refreshed, _props(sorted(api.nodes))).changes is True
    provider.update("id", refreshed, _props(sorted(api.nodes)))
    assert _labels(api, "gpu-000") == POOL


def test_pool_nodes_delete_names_every_node_it_could_not_release() -> None:
    api = _fleet(5)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    _refuse(api, {"gpu-001", "gpu-004"})
    with pytest.raises(NodeApiError, match=r"2 of 5 nodes failed") as failure:
        provider.delete("id", outs)
    assert "gpu-001: " in str(failure.value) and "gpu-004: " in str(failure.value)
    assert _taints(api, "gpu-000") == [] and _taints(api, "gpu-001") == [GPU]


def test_pool_nodes_take_over_from_per_node_taints_whose_delete_then_leaves_them() -> None:
    """A stack deployed with one NodeTaint per node: the engine creates the pool, then deletes
    the per-node resources; the taint stays, and destroy later restores the original entry."""
    api = FakeNodeApi({"gpu-1": {"spec": {"taints": [{**GPU, "value": "old"}]}}})
    per_node = configured(NodeTaintProvider(lambda _kubeconfig, _context: api))
    old = _outs(per_node.create({"node": "gpu-1", "owner": OWNER, **GPU}))
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-1"])))
    per_node.delete("id", old)
    assert _taints(api, "gpu-1") == [GPU]
    provider.delete("id", outs)
    assert _taints(api, "gpu-1") == [{**GPU, "value": "old"}]


def test_pool_nodes_refuse_to_run_unconfigured() -> None:
    provider = GpuPoolNodesProvider(lambda _kubeconfig, _context: FakeNodeApi())
    with pytest.raises(NodeApiError, match="no cluster credentials"):
        provider.create(_props(["gpu-1"]))


def test_pool_nodes_write_from_one_list_and_reread_only_after_a_conflict() -> None:
    api = _fleet(30)
    raced: list[str] = []

    def someone_else_writes(node: str) -> None:
        if node == "gpu-004" and not raced:
            raced.append(node)  # a cordon between our LIST and our patch
            api.edit(node, lambda n: n["spec"].update(taints=[dict(UNSCHEDULABLE)]))

    api.before_write = someone_else_writes
    outs = _outs(_make_provider(api).create(_props(sorted(api.nodes))))
    assert outs["failed"] == {}
    assert (api.lists, api.reads) == (1, 1)  # one GET: the node that changed under us
    assert _taints(api, "gpu-004") == [UNSCHEDULABLE, GPU]


def test_pool_nodes_missing_node_is_named_and_the_others_applied() -> None:
    api = _fleet(3)
    outs = _outs(_make_provider(api).create(_props(["gpu-000", "gpu-gone", "gpu-002"])))
    assert outs["failed"] == {"gpu-gone": f"node 'gpu-gone' not found on API server {SERVER}"}
    assert sorted(outs["applied"]) == ["gpu-000", "gpu-002"]
