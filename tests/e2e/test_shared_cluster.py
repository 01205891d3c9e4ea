"""A cluster other teams use: the stack never takes over, nor deletes, what it did not create,
and it notices when its claim on the cluster is gone (the real engine and provider on a local
cluster, as a user meets them)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from components.cluster_access import CLAIM_KEY, CLAIM_NAMESPACE, CLAIM_OBJECTS_KEY
from components.settings import PROJECT
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.stack import AppliedStack, StackError

from .conftest import require_e2e_tools

STACK = "local"
TEAM_DATA = "team-data"


def _core(applied: AppliedStack) -> Any:
    return client.CoreV1Api(applied.api_client())


def _claim(applied: AppliedStack) -> Any:
    try:
        return _core(applied).read_namespaced_config_map(PROJECT, CLAIM_NAMESPACE)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _resources_only(changes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`changes` without provider instances (a config change updates the dynamic providers'
    default provider, which changes nothing on the cluster)."""
    return [(op, urn) for op, urn in changes if "::pulumi:providers:" not in urn]


def _another_teams_namespace(applied: AppliedStack, name: str) -> None:
    """Namespace `name` with a ConfigMap of another team's in it."""
    core = _core(applied)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(
        name,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=TEAM_DATA), data={"owner": "another team"}
        ),
    )


def _team_data(applied: AppliedStack, namespace: str) -> dict[str, str] | None:
    try:
        found = _core(applied).read_namespaced_config_map(TEAM_DATA, namespace)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(found.data or {})


def test_an_existing_namespace_is_refused_and_can_be_used_without_being_owned(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Another team's `monitoring` namespace exists before the first `up`: preview and up stop
    naming it and the ways out, and nothing is applied (no claim, nodes untouched). With
    monitoring.createNamespace false the stack uses it, and destroy leaves it and the team's
    data as they were."""
    require_e2e_tools()
    with AppliedStack(STACK, tmp_path_factory.mktemp("e2e-shared-ns")) as applied:
        monitoring = dict(stack_config(STACK, applied.overrides)["monitoring"])
        namespace = monitoring.get("namespace", "monitoring")
        _another_teams_namespace(applied, namespace)
        expected = (
            f"{PROJECT}:monitoring.namespace: got '{namespace}'; Namespace {namespace} already "
            "exists and this stack did not create it"
        )
        with pytest.raises(StackError) as previewed:
            applied.preview()
        assert expected in str(previewed.value)
        assert "monitoring.createNamespace: false" in str(previewed.value)
        with pytest.raises(StackError) as refused:
            applied.up()
        assert expected in str(refused.value)
        assert _claim(applied) is None
        assert applied.node_state() == applied.nodes_before
        assert applied.kubernetes_objects() == []

        applied.set_config({"monitoring": {**monitoring, "createNamespace": False}})
        applied.up()
        assert _resources_only(applied.up()) == []
        claim = _claim(applied)
        assert claim is not None
        assert f'"name": "{namespace}"' not in claim.data[CLAIM_OBJECTS_KEY]
        assert _team_data(applied, namespace) == {"owner": "another team"}

        applied.destroy()
        assert _team_data(applied, namespace) == {"owner": "another team"}
        assert _core(applied).read_namespace(namespace).status.phase == "Active"
        assert applied.node_state() == applied.nodes_before
        assert _claim(applied) is None


def test_a_deleted_claim_stops_both_stacks_until_its_owner_takes_it_back(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """An admin deletes the claim: the owning stack's plain `up` refuses (naming the claim and
    how to take it back), a second stack's `up` refuses to take over the first's objects and
    applies nothing, and the owner takes the claim back with retakeClaim and `up --refresh`;
    after that a plain `up` changes nothing and destroy leaves the cluster as before."""
    require_e2e_tools()
    with AppliedStack(STACK, tmp_path_factory.mktemp("e2e-claim-first")) as first:
        first.up()
        owner = _claim(first).data[CLAIM_KEY]
        # What the stack made, but the claim this test deletes.
        objects = [
            o
            for o in first.kubernetes_objects()
            if (o["kind"], o["namespace"], o["name"]) != ("ConfigMap", CLAIM_NAMESPACE, PROJECT)
        ]
        nodes = first.node_state()
        _core(first).delete_namespaced_config_map(PROJECT, CLAIM_NAMESPACE)

        with pytest.raises(StackError) as refused:
            first.up()
        assert f"{CLAIM_NAMESPACE}/{PROJECT} is gone" in str(refused.value)
        assert f"{PROJECT}:retakeClaim=true" in str(refused.value)
        assert _claim(first) is None

        second = AppliedStack(
            STACK, tmp_path_factory.mktemp("e2e-claim-second"), cluster=first.cluster, name="second"
        )
        with second:
            with pytest.raises(StackError) as taken:
                second.up()
            assert "already exists and this stack did not create it" in str(taken.value)
            assert _claim(first) is None
            assert second.kubernetes_objects() == []
            second.destroy()
        assert all(first.exists(o) for o in objects)
        assert first.node_state() == nodes

        first.set_config({"retakeClaim": True})
        first.up(refresh=True)
        assert _claim(first).data[CLAIM_KEY] == owner
        first.set_config()
        assert _resources_only(first.up()) == []
        assert all(first.exists(o) for o in objects)
        first.destroy()
        assert first.node_state() == first.nodes_before
        assert _claim(first) is None
