"""The node-set mechanics shared by the node layers' providers (components/providers/node_set.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from components.providers.node_api import NodeApiError
from components.providers.node_set import (
    SET_MARK,
    NodeSetProvider,
    Owner,
    Plan,
    failure_message,
    for_each_node,
    merge_patches,
    owner_of,
)


def test_node_set_runs_every_node_and_collects_each_failure_by_node() -> None:
    def patch(node: str) -> str:
        if node == "gpu-2":
            raise NodeApiError("cannot patch node 'gpu-2' (HTTP 500)")
        if node == "gpu-4":
            raise KeyError("status")
        return node.upper()

    done, failed = for_each_node([f"gpu-{i}" for i in range(6)], patch)
    assert sorted(done) == ["gpu-0", "gpu-1", "gpu-3", "gpu-5"] and done["gpu-0"] == "GPU-0"
    assert failed == {
        "gpu-2": "cannot patch node 'gpu-2' (HTTP 500)",
        "gpu-4": "KeyError: 'status'",
    }


def test_node_set_keeps_at_most_the_given_number_of_calls_in_flight() -> None:
    lock, running, peak = threading.Lock(), [0], [0]

    def patch(_node: str) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1

    for_each_node([str(i) for i in range(40)], patch, workers=4)
    assert 1 < peak[0] <= 4


def test_node_set_failure_message_names_every_node_sorted_one_per_line() -> None:
    message = failure_message("undo it", {"gpu-9": "gone", "gpu-10": "refused"}, 12)
    assert message.splitlines() == [
        "undo it: 2 of 12 nodes failed, the others are done:",
        "  gpu-10: refused",
        "  gpu-9: gone",
    ]


def test_node_set_merge_patches_merges_nested_maps_and_keeps_removals() -> None:
    merged = merge_patches(
        {"spec": {"taints": [{"key": "a"}]}, "metadata": {"annotations": {"x": "1"}}},
        None,
        {"metadata": {"labels": {"pool": None}, "annotations": {"y": None}}},
    )
    assert merged == {
        "spec": {"taints": [{"key": "a"}]},
        "metadata": {"annotations": {"x": "1", "y": None}, "labels": {"pool": None}},
    }
    assert merge_patches(None, {}) is None


ID = "3f5c0d1e9a7b4c21"
LABEL = "org/gpu-cluster/a"


class _Counts(NodeSetProvider):
    """A node set whose spec per node is its input as it is (the mechanics alone)."""

    def wanted(self, props: Mapping[str, Any]) -> dict[str, Any]:
        return dict(props.get("nodes") or {})


def _state(
    applied: dict[str, Any], failed: dict[str, str] | None = None, **props: Any
) -> dict[str, Any]:
    spec = {node: {"spec": value, "drift": False} for node, value in applied.items()}
    return {"owner": ID, "stack": LABEL, "applied": spec, "failed": failed or {}, **props}


def test_node_set_owner_holds_its_id_and_its_former_identities_only() -> None:
    owner = Owner(ID, LABEL, frozenset({"org/gpu-cluster/old-name"}))
    assert owner.holds({"owner": ID, **SET_MARK})
    assert owner.holds({"owner": "org/gpu-cluster/old-name", **SET_MARK})
    assert not owner.without_former().holds({"owner": "org/gpu-cluster/old-name", **SET_MARK})
    # Another backend's stack of the same names: another id, the same label.
    assert not owner.holds({"owner": "9d2e7a", "stack": LABEL, **SET_MARK})
    # A node set's record under the label is another stack's unless the state says otherwise...
    assert not owner.without_former().holds({"owner": LABEL, **SET_MARK})
    # ...a per-node resource of an earlier version of this stack left one without the mark.
    assert owner.without_former().holds({"owner": LABEL, "previous": None})
    assert not owner.holds(None)


def test_node_set_owner_of_takes_the_identities_of_the_state() -> None:
    news = {"owner": ID, "stack": LABEL}
    assert owner_of(news, {}).former == frozenset()
    upgraded = owner_of(news, {"owner": LABEL, "former_owners": []})
    assert upgraded.former == frozenset({LABEL})
    kept = owner_of(news, {"owner": ID, "former_owners": ["org/gpu-cluster/a"]})
    assert kept.former == frozenset({"org/gpu-cluster/a"})


def test_node_set_refusal_names_the_other_stack_by_label_and_id() -> None:
    other = {"owner": "9d2e7a", "stack": LABEL, **SET_MARK}
    with pytest.raises(NodeApiError) as refused:
        Owner(ID, LABEL).refuse_another(other, "taint nvidia.com/gpu:NoSchedule", "gpu-1")
    assert str(refused.value).startswith(
        "taint nvidia.com/gpu:NoSchedule on node 'gpu-1' is managed by stack "
        f"'{LABEL}' (stack id 9d2e7a); two stacks must not manage the same item"
    )


def test_node_set_records_say_who_wrote_what_over_what() -> None:
    assert Owner(ID, LABEL).record({"key": "old"}, {"key": "new"}) == {
        "owner": ID,
        "stack": LABEL,
        "previous": {"key": "old"},
        "value": {"key": "new"},
        **SET_MARK,
    }


def test_node_set_plan_forgets_a_failed_node_that_left_the_layer() -> None:
    """A node deleted, dropped by refresh, failed by the next `up` (not found), then taken out
    of the inventory: the state changes (its failure goes), with nothing to apply or undo."""
    olds = _state({"gpu-1": 1}, failed={"gpu-2": "node 'gpu-2' not found"})
    news = {"owner": ID, "stack": LABEL, "nodes": {"gpu-1": 1}}
    provider = _Counts()
    assert provider.plan(olds, news) == Plan(claim=[], release=[], forget=["gpu-2"])
    assert provider.diff("id", olds, news).changes is True
    assert provider.diff("id", {**olds, "failed": {}}, news).changes is False


def test_node_set_a_new_owner_id_is_a_change_of_the_state() -> None:
    olds = _state({"gpu-1": 1}, owner=LABEL)  # the state of a stack without an id yet
    news = {"owner": ID, "stack": LABEL, "nodes": {"gpu-1": 1}}
    diff = _Counts().diff("id", olds, news)
    assert (diff.changes, diff.replaces) == (True, [])
