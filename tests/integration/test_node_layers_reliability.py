"""The node layers' lifecycle under the real Pulumi engine, against the harness's kube-apiserver.

What only the engine shows: how a node set's state (what it applied, which nodes failed, whose
records it holds) carries from one run to the next.

- a node deleted from the cluster, then taken out of the inventory, is decommissioned by the
  next `up` (its failure does not stay in the state);
- `pulumi stack rename` keeps the stack the owner of what it put on its nodes;
- two self-managed backends holding a stack of the same project and stack names are two owners:
  the second is refused and its `destroy` leaves the first's nodes alone;
- a stack deployed before stacks had an id keeps its nodes on its first `up` with one;
- a host reimaged under its Node (the kubelet resets the stack's counts to 0) gets them back
  from `up --refresh`, while a count an admin set on another node stays refused.

Each test creates nodes of its own on one control plane.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from kubernetes import client
from pulumi import automation as auto

from components.extended_resource_nodes import provider as extended_resource_nodes
from components.providers.node_api import stack_label
from components.tainted_gpu_pool import provider as pool_nodes
from stack_config import StackConfig
from tests.integration.conftest import require_tools
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane
from tools.harness.fake_nodes import create_nodes, gpu_node, snapshot
from tools.harness.pulumi_engine import (
    PULUMI_ENGINE_TOOLS,
    inline_stack,
    node_layers_program,
    stack_file_config,
    use_cluster,
)

PROJECT = "gpu-cluster-engine"
GPU_TAINT_KEY = "nvidia.com/gpu"
DONGLE = "example.com/dongle"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalControlPlane, Any]]:
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    with LocalControlPlane() as cp:
        api_client = cp.api_client()
        try:
            yield cp, api_client
        finally:
            api_client.close()


def _config(
    pool: list[str], dongles: dict[str, int] | None = None, value: str = "present"
) -> StackConfig:
    """The local stack's config over these nodes: the pool, and `dongles` advertised per node."""
    dongles = dongles or {}
    inventory = sorted({*pool, *dongles})
    return stack_file_config(
        "local",
        {
            "grafanaAdminPassword": "local-only-password",
            "nodes": [{"name": n, "address": "127.0.0.1"} for n in inventory],
            "gpuPool": {"nodes": pool, "taint": {"value": value}},
            "extendedResources": {n: {DONGLE: count} for n, count in dongles.items()},
        },
    )


def _stack(cp: LocalControlPlane, state_dir: Path, config: StackConfig, name: str) -> auto.Stack:
    stack = inline_stack(PROJECT, name, node_layers_program(config), state_dir)
    use_cluster(stack, cp.kubeconfig_yaml())
    return stack


def _pool_taints(api_client: Any, nodes: list[str]) -> dict[str, list[dict[str, Any]]]:
    live = snapshot(api_client, nodes)
    return {n: [t for t in live[n]["taints"] if t["key"] == GPU_TAINT_KEY] for n in nodes}


def _changes(result: auto.UpResult) -> set[str]:
    return set(result.summary.resource_changes or {})


def test_a_node_deleted_then_taken_out_of_the_inventory_is_decommissioned(
    cluster: tuple[LocalControlPlane, Any], tmp_path: Path
) -> None:
    """The node is deleted, `refresh` drops it, the next `up` fails it (not found); once the
    user takes it out of the inventory, `preview` and `up` succeed and later runs are clean."""
    cp, api_client = cluster
    pool = ["dec-gpu-1", "dec-gpu-2", "dec-gpu-3"]
    kept, gone = pool[:2], pool[2]
    create_nodes(api_client, [gpu_node(n) for n in pool])
    before = snapshot(api_client, kept)
    stack = _stack(cp, tmp_path, _config(pool, {gone: 2}), "dec")
    stack.up()

    client.CoreV1Api(api_client).delete_node(gone)
    stack.refresh()
    with pytest.raises(auto.CommandError, match=f"{gone}: node '{gone}' not found"):
        stack.up()

    decommissioned = _stack(cp, tmp_path, _config(kept), "dec")
    decommissioned.preview()
    done = decommissioned.up()
    assert done.outputs["gpuNodes"].value == kept
    assert done.outputs["advertisedResources"].value == {}
    assert _changes(decommissioned.up()) == {"same"}
    decommissioned.destroy()
    assert snapshot(api_client, kept) == before


def test_a_renamed_stack_keeps_managing_its_nodes(
    cluster: tuple[LocalControlPlane, Any], tmp_path: Path
) -> None:
    """`pulumi stack rename`, then a change of the pool's taint value: the renamed stack
    updates its own nodes, and its `destroy` puts them back as they were."""
    cp, api_client = cluster
    pool = ["ren-gpu-1", "ren-gpu-2"]
    create_nodes(api_client, [gpu_node(n) for n in pool])
    before = snapshot(api_client, pool)
    stack = _stack(cp, tmp_path, _config(pool, {pool[0]: 2}), "before-rename")
    stack.up()

    stack.rename("after-rename")
    renamed = _stack(cp, tmp_path, _config(pool, {pool[0]: 3}, value="a100"), "after-rename")
    renamed.up()

    for node, taints in _pool_taints(api_client, pool).items():
        assert taints == [{"key": GPU_TAINT_KEY, "value": "a100", "effect": "NoSchedule"}], node
    assert snapshot(api_client, [pool[0]])[pool[0]]["capacity"][DONGLE] == "3"
    renamed.destroy()
    assert snapshot(api_client, pool) == before


def test_two_backends_with_the_same_stack_names_are_two_owners(
    cluster: tuple[LocalControlPlane, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two self-managed backends, each with a stack of the same project and stack names, on the
    same nodes: the second `up` is refused on every node, naming who manages it (the extended
    resources first; the pool, which waits for them, once the second stack leaves them out);
    its `destroy` leaves the first's taint, labels and counts; the first then changes
    nothing and its `destroy` puts the nodes back."""
    cp, api_client = cluster
    pool = ["two-gpu-1", "two-gpu-2"]
    create_nodes(api_client, [gpu_node(n) for n in pool])
    before = snapshot(api_client, pool)
    config = _config(pool, dict.fromkeys(pool, 2))
    first = _stack(cp, tmp_path_factory.mktemp("backend-a"), config, "shared-name")
    first.up()
    applied = snapshot(api_client, pool)

    backend_b = tmp_path_factory.mktemp("backend-b")
    refusals = []
    for what, second_config in (("extended resource", config), ("taint", _config(pool))):
        second = _stack(cp, backend_b, second_config, "shared-name")
        with pytest.raises(auto.CommandError) as refused:
            second.up()
        refusals.append((what, str(refused.value)))
    second.destroy()

    owner = f"managed by stack 'organization/{PROJECT}/shared-name' (stack id "
    for what, message in refusals:
        assert all(f"{node}: {what} " in message for node in pool), message
        assert owner in message, message
    assert snapshot(api_client, pool) == applied
    assert _changes(first.up(refresh=True)) == {"same"}
    first.destroy()
    assert snapshot(api_client, pool) == before


def _program_without_ids(config: StackConfig) -> auto.PulumiFn:
    """The node layers as the version before stack ids declared them: each node set owned by
    organization/project/stack, and no StackIdentity."""
    program = node_layers_program(config)

    def before_ids() -> None:
        with (
            mock.patch.object(pool_nodes, "stack_identity", stack_label),
            mock.patch.object(extended_resource_nodes, "stack_identity", stack_label),
        ):
            program()

    return before_ids


def test_a_stack_deployed_before_it_had_an_id_keeps_its_nodes(
    cluster: tuple[LocalControlPlane, Any], tmp_path: Path
) -> None:
    """The first `up` with an id mints it and updates the two node sets' state, writing
    nothing; a later change edits the nodes the old records were written for, the next `up`
    changes nothing, and `destroy` puts the nodes back."""
    cp, api_client = cluster
    pool = ["old-gpu-1", "old-gpu-2"]
    create_nodes(api_client, [gpu_node(n) for n in pool])
    before = snapshot(api_client, pool)
    config = _config(pool, {pool[0]: 2})
    old = inline_stack(PROJECT, "old", _program_without_ids(config), tmp_path)
    use_cluster(old, cp.kubeconfig_yaml())
    old.up()
    deployed = snapshot(api_client, pool)

    upgraded = _stack(cp, tmp_path, config, "old")
    first = upgraded.up()
    assert first.summary.resource_changes == {"create": 1, "update": 2, "same": 3}
    assert snapshot(api_client, pool) == deployed
    changed = _stack(cp, tmp_path, _config(pool, {pool[0]: 3}, value="a100"), "old")
    changed.up()
    assert _changes(changed.up()) == {"same"}
    assert _pool_taints(api_client, pool)[pool[1]][0]["value"] == "a100"
    changed.destroy()
    assert snapshot(api_client, pool) == before


def _set_dongles(api_client: Any, node: str, count: str) -> None:
    """A write of the node's status by someone else, as the kubelet writes it (a strategic
    merge patch of the status subresource): `count` in capacity and allocatable."""
    client.CoreV1Api(api_client).patch_node_status(
        node,
        {"status": {"capacity": {DONGLE: count}, "allocatable": {DONGLE: count}}},
        _content_type="application/strategic-merge-patch+json",
    )


def test_a_reimaged_host_s_reset_count_comes_back_with_up_refresh(
    cluster: tuple[LocalControlPlane, Any], tmp_path: Path
) -> None:
    """One host is reimaged and its kubelet registers again under the existing Node: every
    extended resource at 0 (capacity and allocatable), annotations kept. On another node an
    admin sets the count to 8. `up --refresh` advertises the stack's count again on the first
    and fails naming only the second; once the admin's value is gone, `up` finishes, the next
    changes nothing, and `destroy` puts both nodes back as they were."""
    cp, api_client = cluster
    pool = ["reimaged-gpu-1", "edited-gpu-2"]
    reimaged, edited = pool
    create_nodes(api_client, [gpu_node(n) for n in pool])
    before = snapshot(api_client, pool)
    stack = _stack(cp, tmp_path, _config(pool, dict.fromkeys(pool, 2)), "reimage")
    stack.up()

    _set_dongles(api_client, reimaged, "0")  # what the kubelet does (reconcileExtendedResource)
    _set_dongles(api_client, edited, "8")
    with pytest.raises(auto.CommandError) as refused:
        stack.up(refresh=True)

    live = snapshot(api_client, pool)
    assert live[reimaged]["capacity"][DONGLE] == live[reimaged]["allocatable"][DONGLE] == "2"
    assert live[edited]["capacity"][DONGLE] == "8"
    message = str(refused.value)
    assert "1 of 2 nodes failed" in message and f"{edited}: extended resource " in message
    assert f"{reimaged}: extended resource " not in message, message

    _set_dongles(api_client, edited, "2")
    stack.up()
    assert _changes(stack.up(refresh=True)) == {"same"}
    stack.destroy()
    assert snapshot(api_client, pool) == before
