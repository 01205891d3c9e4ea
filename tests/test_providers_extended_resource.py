"""ExtendedResourceProvider against the in-memory node API (tests/fake_node_api.py).

tests/integration/test_node_providers_live.py runs the same provider on a real kube-apiserver.
"""

from __future__ import annotations

from typing import Any

import pytest

from components.providers.extended_resource import ExtendedResourceProvider
from components.providers.node_api import NodeApiError, NodeNotFound
from tests.fake_node_api import SERVER, FakeNodeApi, configured, stack_config_request

DONGLE = "example.com/dongle"


def _make_provider(api: FakeNodeApi) -> tuple[ExtendedResourceProvider, list[tuple[str, Any]]]:
    calls: list[tuple[str, Any]] = []

    def connect(kubeconfig: str, context: str | None) -> FakeNodeApi:
        calls.append((kubeconfig, context))
        return api

    return configured(ExtendedResourceProvider(connect)), calls


def _outs(result: Any) -> dict[str, Any]:
    """The outs of a Create/Read/UpdateResult (always set by these providers)."""
    assert result.outs is not None
    return dict(result.outs)


def _props(**overrides: Any) -> dict[str, Any]:
    return {
        "node": "worker-1",
        "resource": DONGLE,
        "quantity": 4,
        "owner": "org/gpu-cluster/a",
        **overrides,
    }


def _status(api: FakeNodeApi, field: str = "capacity") -> dict[str, str]:
    return dict(api.nodes["worker-1"]["status"].get(field, {}))


def test_extended_resource_create_adds_capacity_and_allocatable() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, _ = _make_provider(api)
    result = provider.create(_props())
    assert result.id == "worker-1/example.com/dongle"
    assert _status(api)[DONGLE] == "4"
    assert _status(api, "allocatable")[DONGLE] == "4"
    assert result.outs is not None and result.outs["quantity"] == 4


def test_extended_resource_create_keeps_other_capacity() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, _ = _make_provider(api)
    provider.create(_props())
    assert _status(api) == {"cpu": "8", "memory": "32Gi", DONGLE: "4"}


def test_extended_resource_reaches_the_cluster_of_the_current_run_s_config() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, calls = _make_provider(api)
    content = "apiVersion: v1\nkind: Config\n"
    provider.configure(stack_config_request(content, "prod-admin"))
    # Credentials left in an old state are ignored: this run's config decides.
    provider.create(_props(kubeconfig="stale", context="old"))
    assert calls == [(content, "prod-admin")]


def test_extended_resource_refuses_to_run_unconfigured() -> None:
    provider = ExtendedResourceProvider(lambda _k, _c: FakeNodeApi({"worker-1": {}}))
    with pytest.raises(NodeApiError, match="did not configure"):
        provider.create(_props())


def test_extended_resource_update_replaces_the_value() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, _ = _make_provider(api)
    provider.create(_props())
    provider.update("id", _props(), _props(quantity=7))
    assert _status(api)[DONGLE] == "7"
    assert _status(api, "allocatable")[DONGLE] == "7"


def test_extended_resource_delete_removes_only_its_key() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, _ = _make_provider(api)
    provider.create(_props())
    provider.create(_props(resource="example.com/other", quantity=1))
    provider.delete("id", _props())
    assert _status(api) == {"cpu": "8", "memory": "32Gi", "example.com/other": "1"}
    assert _status(api, "allocatable") == {"example.com/other": "1"}


def test_extended_resource_delete_is_a_no_op_when_already_gone() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, _ = _make_provider(api)
    provider.delete("id", _props())
    assert api.writes == 0


def test_extended_resource_read_reports_live_value() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, _ = _make_provider(api)
    provider.create(_props())
    api.edit("worker-1", lambda n: n["status"]["capacity"].update({DONGLE: "2"}))
    assert _outs(provider.read("id", _props()))["quantity"] == 2


def test_extended_resource_read_reports_none_after_kubelet_dropped_it() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider, _ = _make_provider(api)
    provider.create(_props())
    api.edit("worker-1", lambda n: n["status"]["capacity"].pop(DONGLE))
    outs = _outs(provider.read("id", _props()))
    assert outs["quantity"] is None
    # ... and the next `pulumi up` sees a change and puts it back.
    assert provider.diff("id", outs, _props()).changes is True
    provider.update("id", outs, _props())
    assert _status(api)[DONGLE] == "4"


def test_extended_resource_diff_is_empty_when_nothing_changed() -> None:
    provider, _ = _make_provider(FakeNodeApi())
    diff = provider.diff("id", _props(), _props())
    assert (diff.changes, diff.replaces) == (False, [])


def test_extended_resource_diff_updates_in_place_for_a_new_quantity() -> None:
    provider, _ = _make_provider(FakeNodeApi())
    diff = provider.diff("id", _props(), _props(quantity=5))
    assert (diff.changes, diff.replaces) == (True, [])


@pytest.mark.parametrize("field", ["node", "resource"])
def test_extended_resource_diff_replaces_for_a_new_node_or_resource(field: str) -> None:
    provider, _ = _make_provider(FakeNodeApi())
    diff = provider.diff("id", _props(), _props(**{field: "other.example.com/x"}))
    assert diff.replaces == [field]
    assert diff.delete_before_replace is True


def test_extended_resource_create_on_missing_node_names_node_and_server() -> None:
    provider, _ = _make_provider(FakeNodeApi())
    with pytest.raises(NodeNotFound, match=f"node 'worker-1' not found on API server {SERVER}"):
        provider.create(_props())


def test_extended_resource_of_a_deleted_node_is_gone_on_read_and_done_on_delete() -> None:
    api = FakeNodeApi({"worker-1": {}})
    provider = configured(ExtendedResourceProvider(lambda _k, _c: api))
    created = provider.create(_props())
    api.nodes.pop("worker-1")
    assert provider.read(str(created.id), dict(created.outs or {})).id is None
    provider.delete(str(created.id), dict(created.outs or {}))


def test_extended_resource_diff_ignores_credentials() -> None:
    provider = ExtendedResourceProvider(lambda _k, _c: FakeNodeApi({}))
    old, new = _props(), {**_props(), "kubeconfig": "ci-reader", "context": "ci"}
    assert provider.diff("id", old, new).changes is False


def test_extended_resource_destroy_restores_what_was_advertised_before() -> None:
    api = FakeNodeApi({"worker-1": {}})
    api.patch_status(
        "worker-1",
        [{"op": "add", "path": f"/status/capacity/{DONGLE.replace('/', '~1')}", "value": "2"}],
    )
    provider, _ = _make_provider(api)
    outs = _outs(provider.create(_props()))
    provider.create(_props())  # an interrupted up, again: 4 is ours, never taken for "before"
    assert _status(api)[DONGLE] == "4"
    provider.delete("id", outs)
    assert _status(api)[DONGLE] == "2"
    assert not api.nodes["worker-1"]["metadata"].get("annotations")


def test_extended_resource_of_another_stack_is_refused_and_left_alone() -> None:
    api = FakeNodeApi({"worker-1": {}})
    first, _ = _make_provider(api)
    first.create(_props())
    second, _ = _make_provider(api)
    with pytest.raises(NodeApiError, match="managed by stack 'org/gpu-cluster/a'"):
        second.create(_props(owner="org/gpu-cluster/b", quantity=1))
    second.delete("id", _props(owner="org/gpu-cluster/b"))
    assert _status(api)[DONGLE] == "4"
