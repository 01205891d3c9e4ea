"""NodeTaintProvider against the in-memory node API (tests/fake_node_api.py).

tests/integration/test_node_providers_live.py runs the same provider on a real kube-apiserver.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.providers.node_api import NodeApiError
from components.providers.node_taint import NodeTaintProvider
from tests.fake_node_api import FakeNodeApi, configured

UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _make_provider(api: FakeNodeApi) -> NodeTaintProvider:
    return configured(NodeTaintProvider(lambda _kubeconfig, _context: api))


def _outs(result: Any) -> dict[str, Any]:
    """The outs of a Create/Read/UpdateResult (always set by these providers)."""
    assert result.outs is not None
    return dict(result.outs)


def _props(**overrides: Any) -> dict[str, Any]:
    return {"node": "gpu-1", "owner": "org/gpu-cluster/a", **GPU, **overrides}


def _taints(api: FakeNodeApi) -> list[dict[str, Any]]:
    return list(api.nodes["gpu-1"]["spec"].get("taints") or [])


def _cordoned_node() -> FakeNodeApi:
    return FakeNodeApi({"gpu-1": {"spec": {"taints": [dict(UNSCHEDULABLE)]}}})


def test_node_taint_create_adds_taint_and_keeps_existing_ones() -> None:
    api = _cordoned_node()
    _make_provider(api).create(_props())
    assert _taints(api) == [UNSCHEDULABLE, GPU]


def test_node_taint_update_changes_value_and_keeps_existing_ones() -> None:
    api = _cordoned_node()
    provider = _make_provider(api)
    outs = _outs(provider.create(_props()))
    provider.update("id", outs, _props(value="a100"))
    assert _taints(api) == [UNSCHEDULABLE, {**GPU, "value": "a100"}]


def test_node_taint_delete_removes_only_its_taint() -> None:
    api = _cordoned_node()
    provider = _make_provider(api)
    outs = _outs(provider.create(_props()))
    provider.delete("id", outs)
    assert _taints(api) == [UNSCHEDULABLE]


def test_node_taint_delete_of_last_taint_leaves_no_taints() -> None:
    api = FakeNodeApi({"gpu-1": {}})
    provider = _make_provider(api)
    provider.delete("id", _outs(provider.create(_props())))
    assert "taints" not in api.nodes["gpu-1"]["spec"]


def test_node_taint_that_predates_the_stack_survives_destroy() -> None:
    api = FakeNodeApi({"gpu-1": {"spec": {"taints": [dict(GPU)]}}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props()))
    assert outs["previous"] == GPU
    provider.delete("id", outs)
    assert _taints(api) == [GPU]


def test_node_taint_destroy_restores_a_previous_value() -> None:
    api = FakeNodeApi({"gpu-1": {"spec": {"taints": [{**GPU, "value": "old"}]}}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props()))
    assert _taints(api) == [GPU]
    provider.delete("id", outs)
    assert _taints(api) == [{**GPU, "value": "old"}]


def test_node_taint_same_key_other_effect_is_a_different_taint() -> None:
    api = FakeNodeApi({"gpu-1": {"spec": {"taints": [{**GPU, "effect": "NoExecute"}]}}})
    provider = _make_provider(api)
    provider.delete("id", _outs(provider.create(_props())))
    assert _taints(api) == [{**GPU, "effect": "NoExecute"}]


def test_node_taint_concurrent_write_is_retried_not_lost() -> None:
    api = FakeNodeApi({"gpu-1": {}})
    raced: list[str] = []

    def cordon_once(name: str) -> None:
        if not raced:
            raced.append(name)
            api.before_write = None
            api.edit(name, lambda n: n["spec"].setdefault("taints", []).append(dict(UNSCHEDULABLE)))

    api.before_write = cordon_once
    _make_provider(api).create(_props())
    assert raced == ["gpu-1"]
    assert _taints(api) == [UNSCHEDULABLE, GPU]


def test_node_taint_create_again_by_the_same_stack_is_a_no_op() -> None:
    """An interrupted up, run again: the taint and its record are there already."""
    api = FakeNodeApi({"gpu-1": {"spec": {"taints": [{**GPU, "value": "old"}]}}})
    provider = _make_provider(api)
    provider.create(_props())
    writes = api.writes
    outs = _outs(provider.create(_props()))
    assert api.writes == writes
    # Our own taint is never taken for what was there before.
    assert outs["previous"] == {**GPU, "value": "old"}


def test_node_taint_of_another_stack_is_refused_and_left_alone() -> None:
    api = FakeNodeApi({"gpu-1": {}})
    _make_provider(api).create(_props(owner="org/gpu-cluster/a"))
    with pytest.raises(NodeApiError, match="managed by stack 'org/gpu-cluster/a'"):
        _make_provider(api).create(_props(owner="org/gpu-cluster/b", value="b"))
    # Destroying stack b (its state from before) does not undo stack a's taint.
    _make_provider(api).delete("id", {**_props(owner="org/gpu-cluster/b"), "previous": None})
    assert _taints(api) == [GPU]


def test_node_taint_ownership_lives_on_the_node() -> None:
    api = FakeNodeApi({"gpu-1": {}})
    provider = _make_provider(api)
    outs = _outs(provider.create(_props()))
    annotations = api.nodes["gpu-1"]["metadata"].get("annotations") or {}
    assert [json.loads(v)["owner"] for v in annotations.values()] == ["org/gpu-cluster/a"]
    provider.delete("id", outs)
    assert not api.nodes["gpu-1"]["metadata"].get("annotations")


def test_node_taint_read_sees_removal_and_next_up_restores_it() -> None:
    api = FakeNodeApi({"gpu-1": {}})
    provider = _make_provider(api)
    provider.create(_props())
    api.edit("gpu-1", lambda n: n["spec"].pop("taints"))
    outs = _outs(provider.read("id", _props()))
    assert outs["present"] is False
    diff = provider.diff("id", outs, _props())
    assert (diff.changes, diff.replaces) == (True, [])
    provider.update("id", outs, _props())
    assert _taints(api) == [GPU]


def test_node_taint_read_sees_value_drift() -> None:
    api = FakeNodeApi({"gpu-1": {}})
    provider = _make_provider(api)
    provider.create(_props())
    api.edit("gpu-1", lambda n: n["spec"]["taints"][0].update(value="other"))
    outs = _outs(provider.read("id", _props()))
    assert outs["value"] == "other"
    assert provider.diff("id", outs, _props()).changes is True


def test_node_taint_diff_replaces_when_key_or_effect_changes() -> None:
    provider = _make_provider(FakeNodeApi())
    assert provider.diff("id", _props(), _props(effect="NoExecute")).replaces == ["effect"]
    assert provider.diff("id", _props(), _props(key="example.com/x")).replaces == ["key"]


def test_node_taint_of_a_deleted_node_is_gone_on_read_and_done_on_delete() -> None:
    api = FakeNodeApi({"gpu-1": {}})
    provider = _make_provider(api)
    created = provider.create(_props())
    api.nodes.pop("gpu-1")  # decommissioned, or deleted to be re-created
    assert provider.read(str(created.id), dict(created.outs or {})).id is None
    provider.delete(str(created.id), dict(created.outs or {}))  # no error: nothing to undo


def test_node_taint_diff_ignores_credentials() -> None:
    provider = _make_provider(FakeNodeApi({"gpu-1": {}}))
    old, new = _props(kubeconfig="admin-a"), _props(kubeconfig="ci-reader", context="ci")
    assert provider.diff("id", {**old, "present": True}, new).changes is False
