"""GpuPoolNodesProvider (the pool's taint and labels as one node set) against the fake node API.

tests/integration runs the same provider on a real kube-apiserver and under the real engine.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.providers.node_api import NodeApiError
from components.providers.node_set import failure_message
from components.tainted_gpu_pool.provider import (
    GpuPoolNodesProvider,
    label_ownership_key,
    taint_ownership_key,
)
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


QUARANTINE = {**GPU, "value": "quarantine"}


def _admin_sets_taint(api: FakeNodeApi, node: str, taint: dict[str, Any]) -> None:
    """`kubectl taint node <node> <key>=<value>:<effect> --overwrite`, or an edit of the entry."""

    def edit(n: dict[str, Any]) -> None:
        others = [t for t in n["spec"].get("taints") or [] if t["key"] != taint["key"]]
        n["spec"]["taints"] = [*others, dict(taint)]

    api.edit(node, edit)


def _ownership(api: FakeNodeApi, node: str) -> dict[str, str]:
    annotations = api.nodes[node]["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith("ownership.gpu-cluster.io/")}


def test_pool_nodes_a_failed_node_taken_out_of_the_inventory_is_forgotten() -> None:
    api = _fleet(2)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-000", "gpu-001", "gpu-gone"])))
    assert list(outs["failed"]) == ["gpu-gone"]
    news = _props(["gpu-000", "gpu-001"])
    assert provider.diff("id", outs, news).changes is True
    writes = api.writes
    outs = _outs(provider.update("id", outs, news))
    assert outs["failed"] == {} and api.writes == writes
    assert provider.diff("id", outs, news).changes is False


def test_pool_nodes_destroy_leaves_a_taint_value_set_since_and_drops_the_record() -> None:
    """The pool's taint reused to quarantine a node: destroy keeps the quarantine."""
    api = _fleet(2)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    _admin_sets_taint(api, "gpu-001", QUARANTINE)
    provider.delete("id", outs)
    assert _taints(api, "gpu-001") == [QUARANTINE] and _taints(api, "gpu-000") == []
    assert _ownership(api, "gpu-001") == {} and _labels(api, "gpu-001") == {}


def test_pool_nodes_destroy_does_not_bring_back_what_it_replaced_once_the_entry_changed() -> None:
    """The node had the pool's key before the stack; an admin then turned the stack's entry
    into a NoExecute quarantine: the entry the stack replaced does not come back beside it."""
    api = FakeNodeApi({"gpu-1": {"spec": {"taints": [{**GPU, "value": "old"}]}}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-1"])))
    evict = {**QUARANTINE, "effect": "NoExecute"}
    api.edit("gpu-1", lambda n: n["spec"].update(taints=[dict(evict)]))
    provider.delete("id", outs)
    assert _taints(api, "gpu-1") == [evict] and _ownership(api, "gpu-1") == {}


def test_pool_nodes_destroy_leaves_a_label_value_set_since() -> None:
    api = FakeNodeApi({"gpu-1": {"metadata": {"labels": {"gpu-cluster.io/pool": "cpu"}}}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-1"])))
    api.edit("gpu-1", lambda n: n["metadata"]["labels"].update({"gpu-cluster.io/pool": "drain"}))
    provider.delete("id", outs)
    assert _labels(api, "gpu-1") == {"gpu-cluster.io/pool": "drain"}
    assert _ownership(api, "gpu-1") == {}


def test_pool_nodes_a_label_left_out_of_the_config_keeps_a_value_set_since() -> None:
    api = FakeNodeApi({"gpu-1": {}, "gpu-2": {}})
    provider = _make_provider(api)
    zone = {"example.com/zone": "a"}
    outs = _outs(provider.create(_props(["gpu-1", "gpu-2"], labels={**POOL, **zone})))
    api.edit("gpu-2", lambda n: n["metadata"]["labels"].update({"example.com/zone": "b"}))
    outs = _outs(provider.update("id", outs, _props(["gpu-1", "gpu-2"])))
    assert outs["failed"] == {}
    assert _labels(api, "gpu-1") == POOL
    assert _labels(api, "gpu-2") == {**POOL, "example.com/zone": "b"}
    assert len(_ownership(api, "gpu-2")) == 2  # the taint's and the pool label's


def test_pool_nodes_up_refuses_to_overwrite_a_value_set_since_and_puts_back_a_gone_one() -> None:
    """`up --refresh` after an admin quarantined one node and untainted another: the quarantine
    stays (the node is named as failed), the missing taint comes back; once the quarantined
    node leaves the pool, `up` leaves its taint and forgets it."""
    api = _fleet(3)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes))))
    _admin_sets_taint(api, "gpu-001", QUARANTINE)
    api.edit("gpu-002", lambda n: n["spec"].update(taints=None))
    refreshed = _outs(provider.read("id", outs))
    outs = _outs(provider.update("id", refreshed, _props(sorted(api.nodes))))
    assert list(outs["failed"]) == ["gpu-001"]
    assert "changed since this stack set it" in outs["failed"]["gpu-001"]
    assert "'quarantine'" in outs["failed"]["gpu-001"]
    assert _taints(api, "gpu-001") == [QUARANTINE] and _taints(api, "gpu-002") == [GPU]
    outs = _outs(provider.update("id", outs, _props(["gpu-000", "gpu-002"])))
    assert outs["failed"] == {} and sorted(outs["applied"]) == ["gpu-000", "gpu-002"]
    assert _taints(api, "gpu-001") == [QUARANTINE] and _ownership(api, "gpu-001") == {}


def test_pool_nodes_a_renamed_stack_keeps_its_nodes_through_its_id() -> None:
    api = _fleet(2)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(sorted(api.nodes), owner="id-a", stack=OWNER)))
    renamed = _props(sorted(api.nodes), owner="id-a", stack="org/gpu-cluster/b", value="a100")
    outs = _outs(provider.update("id", outs, renamed))
    assert outs["failed"] == {}
    assert all(_taints(api, n) == [{**GPU, "value": "a100"}] for n in api.nodes)


def test_pool_nodes_records_of_the_former_identity_are_its_own_where_the_state_says_so() -> None:
    """A stack deployed before it had an id recorded organization/project/stack: its first
    `up` with an id takes them as its own on the nodes its state lists, and only there."""
    api = _fleet(3)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-000", "gpu-001"])))
    # The other stack of the same names (another backend) on gpu-002, before either had an id.
    _make_provider(api).create(_props(["gpu-002"]))
    with_id = _props(sorted(api.nodes), owner="id-a", stack=OWNER, value="a100")
    assert provider.diff("id", outs, with_id).changes is True
    outs = _outs(provider.update("id", outs, with_id))
    assert list(outs["failed"]) == ["gpu-002"] and outs["former_owners"] == [OWNER]
    assert "managed by stack 'org/gpu-cluster/a'" in outs["failed"]["gpu-002"]
    assert _taints(api, "gpu-000") == [{**GPU, "value": "a100"}]
    record = json.loads(next(iter(_ownership(api, "gpu-000").values())))
    assert (record["owner"], record["stack"]) == ("id-a", OWNER)


def test_pool_nodes_destroy_undoes_records_of_the_former_identity() -> None:
    """The first `up` with an id changes nothing on a node (no write): its record still names
    organization/project/stack, and destroy undoes it all the same."""
    api = _fleet(1)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-000"])))
    writes = api.writes
    outs = _outs(provider.update("id", outs, _props(["gpu-000"], owner="id-a", stack=OWNER)))
    assert api.writes == writes and outs["former_owners"] == [OWNER]
    provider.delete("id", outs)
    assert _taints(api, "gpu-000") == [] and _ownership(api, "gpu-000") == {}


def test_pool_nodes_another_backend_s_stack_of_the_same_names_is_refused() -> None:
    api = _fleet(1)
    _make_provider(api).create(_props(["gpu-000"], owner="id-a", stack=OWNER))
    other = _props(["gpu-000"], owner="id-b", stack=OWNER)
    outs = _outs(_make_provider(api).create(other))
    assert f"managed by stack '{OWNER}' (stack id id-a)" in outs["failed"]["gpu-000"]
    _make_provider(api).delete("id", outs)
    assert _taints(api, "gpu-000") == [GPU] and _labels(api, "gpu-000") == POOL


def test_pool_nodes_a_value_set_since_that_the_config_now_wants_is_taken_as_it_is() -> None:
    api = _fleet(1)
    provider = _make_provider(api)
    outs = _outs(provider.create(_props(["gpu-000"])))
    _admin_sets_taint(api, "gpu-000", {**GPU, "value": "a100"})
    outs = _outs(provider.update("id", outs, _props(["gpu-000"], value="a100")))
    assert outs["failed"] == {} and _taints(api, "gpu-000") == [{**GPU, "value": "a100"}]
    provider.delete("id", outs)
    assert _taints(api, "gpu-000") == [] and _ownership(api, "gpu-000") == {}


def test_pool_nodes_take_over_the_records_and_state_of_a_version_without_ids() -> None:
    """Records and state exactly as the version before stack ids wrote them (owner
    organization/project/stack, no value): the first `up` with an id writes nothing, and
    destroy takes what the stack set from the state, so a value set since stays."""
    taint_key = taint_ownership_key("nvidia.com/gpu", "NoSchedule")
    label_key = label_ownership_key("gpu-cluster.io/pool")
    old_record = json.dumps({"by": "node-set", "owner": OWNER, "previous": None})
    node = {
        "metadata": {
            "labels": dict(POOL),
            "annotations": {taint_key: old_record, label_key: old_record},
        },
        "spec": {"taints": [dict(GPU)]},
    }
    api = FakeNodeApi({"gpu-1": node, "gpu-2": json.loads(json.dumps(node))})
    applied = {"spec": {"value": "present", "labels": dict(POOL)}, "previous": None, "drift": False}
    nodes = ["gpu-1", "gpu-2"]
    olds = {**_props(nodes), "applied": dict.fromkeys(nodes, applied), "failed": {}}
    provider = _make_provider(api)
    with_id = _props(nodes, owner="id-a", stack=OWNER)
    assert provider.diff("id", olds, with_id).changes is True
    outs = _outs(provider.update("id", olds, with_id))
    assert outs["failed"] == {} and api.writes == 0
    api.edit("gpu-2", lambda n: n["metadata"]["labels"].update({"gpu-cluster.io/pool": "drain"}))
    provider.delete("id", outs)
    assert _taints(api, "gpu-1") == _taints(api, "gpu-2") == []
    assert _labels(api, "gpu-1") == {} and _labels(api, "gpu-2") == {"gpu-cluster.io/pool": "drain"}
    assert _ownership(api, "gpu-1") == _ownership(api, "gpu-2") == {}
