"""5% of node writes answered 500 or 504 (tools/harness/faulty_proxy.py), under the real
engine: the node layers of a 100-GPU-node pool name every node that failed and finish the
others; with the path healthy again, the next `up` does exactly the failed nodes, nothing the
stack recorded on the nodes is lost, and `destroy` puts every node back as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from pulumi import automation as auto

from components.providers.node_api import OWNERSHIP_PREFIX
from tests.integration.conftest import require_tools
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane
from tools.harness.fake_nodes import create_nodes, inventory_nodes, snapshot
from tools.harness.faulty_proxy import FaultyApiProxy
from tools.harness.pulumi_engine import (
    PULUMI_ENGINE_TOOLS,
    inline_stack,
    node_layers_program,
    stack_file_config,
    use_cluster,
)

GPU_NODES = [f"pool-{i:03d}" for i in range(100)]
CONFIG = stack_file_config(
    "local",
    {
        "grafanaAdminPassword": "local-only-password",
        "nodes": [{"name": n, "address": "127.0.0.1"} for n in [*GPU_NODES, "box-1"]],
        "gpuPool": {"nodes": GPU_NODES, "labels": {"gpu-cluster.io/pool": "gpu"}},
        "extendedResources": {"box-1": {"example.com/dongle": 4}},
    },
)
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture(name="cluster")
def cluster_fixture() -> Iterator[tuple[LocalControlPlane, Any]]:
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    with LocalControlPlane() as cp:
        api_client = cp.api_client()
        create_nodes(api_client, inventory_nodes(CONFIG))
        yield cp, api_client
        api_client.close()


def test_failed_node_writes_are_named_and_the_next_up_repairs_them(
    cluster: tuple[LocalControlPlane, Any], tmp_path: Path
) -> None:
    cp, api_client = cluster
    names = [*GPU_NODES, "box-1"]
    before = snapshot(api_client, names)
    proxy = FaultyApiProxy(cp, rate=0.05, seed=7, delay=0.5).start()
    try:
        stack = inline_stack("gpu-cluster-faults", "faults", node_layers_program(CONFIG), tmp_path)
        use_cluster(stack, proxy.kubeconfig())
        with pytest.raises(auto.errors.CommandError) as failed:
            stack.up()
        assert proxy.failed, "no write was failed: the test proves nothing"
        message = str(failed.value)
        failed_nodes = {path.split("/")[4].split("?")[0] for _, path, _ in proxy.failed}
        for node in failed_nodes:
            assert f"{node}:" in message, f"{node} is not named in the error"
        assert "nodes failed, the others are done" in message
        print(f"\nFAULT 5% node writes 500/504 | {len(proxy.failed)} writes failed, ", end="")

        proxy.rate = 0.0  # the path is healthy again
        repaired = stack.up()
        print(f"next up: {repaired.summary.resource_changes}")
        live = snapshot(api_client, names)
        core = client.CoreV1Api(api_client)
        for node in GPU_NODES:
            assert TAINT in live[node]["taints"], node
            assert live[node]["labels"]["gpu-cluster.io/pool"] == "gpu", node
            metadata = core.read_node(node).metadata
            annotations = (metadata.annotations if metadata else None) or {}
            owned = [k for k in annotations if k.startswith(OWNERSHIP_PREFIX)]
            assert owned, f"{node} has no ownership record"
        assert live["box-1"]["capacity"]["example.com/dongle"] == "4"
        again = stack.up()
        assert set(again.summary.resource_changes or {}) == {"same"}
        stack.destroy()
        assert snapshot(api_client, names) == before
    finally:
        proxy.stop()
