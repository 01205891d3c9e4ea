"""The node layers under the real Pulumi engine, against the harness's kube-apiserver.

ExtendedResourceNodes and TaintedGpuPool (the layers built on Python dynamic providers, one
node-set resource each) run as a platform engineer runs them: the engine serializes the
providers into pulumi-resource-pulumi-python, keeps state in a backend, diffs, refreshes and
destroys. The kubernetes, command and tls provider plugins cannot be built here
(tools/README.md), so the program holds just these two layers; everything else is covered by
the mocked program run and the server-side dry-run of its objects.

The tests share one deployment and run in file order; the last one destroys it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from pulumi import automation as auto

from tests.integration.conftest import require_tools
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane
from tools.harness.fake_nodes import create_nodes, inventory_nodes, snapshot
from tools.harness.pulumi_engine import (
    PULUMI_ENGINE_TOOLS,
    inline_stack,
    node_layers_program,
    stack_file_config,
    use_cluster,
)

# The local stack (Pulumi.local.yaml): three pool nodes, one node with example.com/dongle: 4.
# The local stack's Grafana password is a stack secret, set by `pulumi config set --secret`.
CONFIG = stack_file_config("local", {"grafanaAdminPassword": "local-only-password"})
GPU_NODES = CONFIG.gpu_pool.nodes
DONGLE_NODE, DONGLES = next(iter(CONFIG.extended_resources.items()))
DONGLE = "example.com/dongle"
# The stack, its identity (node_api.StackIdentity), the two components, one node set each.
COUNT = 1 + 1 + 2 + 2
IDENTITY = "pulumi-python:dynamic/gpu-cluster:StackIdentity"
CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


@dataclass
class Deployment:
    stack: auto.Stack
    api_client: Any
    before: dict[str, dict[str, Any]]
    first: auto.UpResult
    state_dir: Path
    destroyed: bool = False

    @property
    def nodes(self) -> list[str]:
        return [*GPU_NODES, DONGLE_NODE]

    def live(self) -> dict[str, dict[str, Any]]:
        return snapshot(self.api_client, self.nodes)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    with LocalControlPlane() as cp:
        api_client = cp.api_client()
        create_nodes(api_client, inventory_nodes(CONFIG))
        # A cordoned GPU node: the taint Kubernetes manages must survive up and destroy.
        client.CoreV1Api(api_client).patch_node(GPU_NODES[1], {"spec": {"taints": [CORDON]}})
        before = snapshot(api_client, [*GPU_NODES, DONGLE_NODE])
        state_dir = tmp_path_factory.mktemp("pulumi")
        stack = inline_stack("gpu-cluster-engine", "e2e", node_layers_program(CONFIG), state_dir)
        use_cluster(stack, cp.kubeconfig_yaml())
        deployment = Deployment(stack, api_client, before, stack.up(), state_dir)
        try:
            yield deployment
        finally:
            if not deployment.destroyed:
                stack.destroy()
            api_client.close()


def test_engine_up_taints_pool_and_advertises_capacity(deployed: Deployment) -> None:
    live = deployed.live()
    ours = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

    assert deployed.first.summary.resource_changes == {"create": COUNT}
    # The API server's TaintNodesByCondition added node.kubernetes.io/not-ready at creation:
    # every taint that was there stays, in place, and ours comes last.
    for node in GPU_NODES:
        assert live[node]["taints"] == [*deployed.before[node]["taints"], ours]
    assert CORDON in live[GPU_NODES[1]]["taints"]
    assert live[DONGLE_NODE]["capacity"][DONGLE] == str(DONGLES[DONGLE])
    assert live[DONGLE_NODE]["allocatable"][DONGLE] == str(DONGLES[DONGLE])
    assert all(live[node]["labels"]["gpu-cluster.io/pool"] == "gpu" for node in GPU_NODES)
    assert deployed.first.outputs["gpuTaint"].value == {
        "key": "nvidia.com/gpu",
        "value": "present",
        "effect": "NoSchedule",
    }


def test_engine_keeps_credentials_out_of_the_state(deployed: Deployment) -> None:
    """The kubeconfig is a secret stack config value; no resource copies it into the state."""
    files = list(deployed.state_dir.glob("backend/.pulumi/stacks/**/e2e.json"))
    assert len(files) == 1, files
    text = files[0].read_text()
    state = json.loads(text)["checkpoint"]["latest"]
    dynamic = [r for r in state["resources"] if r["type"].startswith("pulumi-python:dynamic/")]

    # One node set per layer, however many nodes, and the stack's identity.
    assert sorted(r["type"] == IDENTITY for r in dynamic) == [False, False, True]
    for resource in dynamic:
        for side in ("inputs", "outputs"):
            assert "kubeconfig" not in resource[side], (side, resource["urn"])
    assert "client-key-data" not in text and "certificate-authority-data" not in text


def test_engine_second_up_changes_nothing(deployed: Deployment) -> None:
    again = deployed.stack.up()

    assert again.summary.resource_changes == {"same": COUNT}


def test_engine_refresh_sees_dropped_capacity_and_next_up_restores_it(
    deployed: Deployment,
) -> None:
    # What the kubelet does when the node re-registers: the extended resource is gone.
    client.CoreV1Api(deployed.api_client).patch_node_status(
        DONGLE_NODE,
        [
            {"op": "remove", "path": "/status/capacity/example.com~1dongle"},
            {"op": "remove", "path": "/status/allocatable/example.com~1dongle"},
        ],
        _content_type="application/json-patch+json",
    )

    refreshed = deployed.stack.refresh()
    planned = deployed.stack.preview()
    restored = deployed.stack.up()

    assert refreshed.summary.resource_changes == {"same": COUNT - 1, "update": 1}
    assert planned.change_summary == {"same": COUNT - 1, "update": 1}
    assert restored.summary.resource_changes == {"same": COUNT - 1, "update": 1}
    assert deployed.live()[DONGLE_NODE]["capacity"][DONGLE] == str(DONGLES[DONGLE])


def test_engine_destroy_leaves_nodes_exactly_as_before(deployed: Deployment) -> None:
    result = deployed.stack.destroy()
    deployed.destroyed = True

    assert result.summary.resource_changes == {"delete": COUNT}
    assert deployed.live() == deployed.before


def test_engine_survives_a_deleted_node_and_a_second_machine_s_credentials(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A node deleted behind the stack's back: refresh drops its resources, up re-creates
    nothing for it while it is gone, destroy finishes. Another kubeconfig for the same cluster
    (a second machine, a rotated certificate) is not a change."""
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    with LocalControlPlane() as cp:
        api_client = cp.api_client()
        core = client.CoreV1Api(api_client)
        create_nodes(api_client, inventory_nodes(CONFIG))
        state_dir = tmp_path_factory.mktemp("pulumi-churn")

        def stack(kubeconfig: str) -> auto.Stack:
            program = node_layers_program(CONFIG)
            selected = inline_stack("gpu-cluster-engine", "churn", program, state_dir)
            use_cluster(selected, kubeconfig)
            return selected

        admin = stack(cp.kubeconfig_yaml())
        admin.up()
        # The same cluster reached with another identity (a token instead of the admin cert).
        core.create_namespaced_service_account(
            "default", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="other-machine"))
        )
        request: Any = core.create_namespaced_service_account_token(
            "other-machine",
            "default",
            client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[])),
        )
        token = request.status.token
        client.RbacAuthorizationV1Api(api_client).create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name="churn-admin"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="ServiceAccount", name="other-machine", namespace="default"
                    )
                ],
            )
        )
        other = stack(cp.kubeconfig_yaml(user={"token": token}))
        changes: dict[Any, int] = dict(other.preview().change_summary)
        assert changes.get("update", 0) == 0

        core.delete_node(GPU_NODES[0])
        refreshed = admin.refresh()
        refresh_changes: dict[Any, int] = dict(refreshed.summary.resource_changes or {})
        assert refresh_changes.get("update") == 1  # the pool, without the deleted node
        admin.destroy()
        assert all(
            t["key"] != "nvidia.com/gpu"
            for n in GPU_NODES[1:]
            for t in snapshot(api_client, [n])[n]["taints"]
        )


def test_engine_names_every_failed_node_applies_the_others_and_finishes_on_the_next_up(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two pool nodes the API server does not have yet: `up` fails naming both, the other
    nodes are tainted and in the state; once the nodes exist, the next `up` finishes and
    `destroy` undoes every node."""
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    pool = [f"gpu-{i:02d}" for i in range(8)]
    missing = {pool[2], pool[5]}
    config = stack_file_config(
        "local",
        {
            "grafanaAdminPassword": "local-only-password",
            "nodes": [{"name": n, "address": f"10.0.0.{i + 1}"} for i, n in enumerate(pool)],
            "gpuPool": {"nodes": pool},
            "extendedResources": {},
        },
    )
    with LocalControlPlane() as cp:
        api_client = cp.api_client()
        create_nodes(api_client, [n for n in inventory_nodes(config) if n.name not in missing])
        state_dir = tmp_path_factory.mktemp("pulumi-failed")
        stack = inline_stack("gpu-cluster-engine", "failed", node_layers_program(config), state_dir)
        use_cluster(stack, cp.kubeconfig_yaml())
        lines: list[str] = []
        with pytest.raises(auto.CommandError) as failure:
            stack.up(on_output=lines.append)
        message = str(failure.value)
        assert "2 of 8 nodes failed" in message
        assert all(f"{node}: node {node!r} not found" in message for node in missing)
        tainted = [n for n in pool if n not in missing]
        assert all(snapshot(api_client, [n])[n]["taints"] for n in tainted)
        assert len(lines) < 60, lines  # a few lines per layer, not one per node

        create_nodes(api_client, [n for n in inventory_nodes(config) if n.name in missing])
        stack.up()
        assert all(snapshot(api_client, [n])[n]["taints"] for n in pool)
        stack.destroy()
        assert not any(
            t["key"] == "nvidia.com/gpu"
            for n in pool
            for t in snapshot(api_client, [n])[n]["taints"]
        )
