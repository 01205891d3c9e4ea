"""Node objects that stand in for a real cluster's machines on the local control plane.

No kubelet runs here, so the nodes are created through the API with the status a kubelet
would report (capacity, allocatable, a Ready condition). GPU nodes advertise nvidia.com/gpu
the way the GPU Operator's device plugin would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from stack_config import StackConfig

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class FakeNode:
    """One node: its name and what its kubelet would report."""

    name: str
    capacity: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)


def gpu_node(name: str, gpus: int = 4, cpu: str = "32", memory: str = "256Gi") -> FakeNode:
    return FakeNode(name, {GPU_RESOURCE: str(gpus), "cpu": cpu, "memory": memory, "pods": "110"})


def cpu_node(name: str, cpu: str = "16", memory: str = "64Gi") -> FakeNode:
    return FakeNode(name, {"cpu": cpu, "memory": memory, "pods": "110"})


def inventory_nodes(config: StackConfig) -> list[FakeNode]:
    """A stack's node inventory: GPU pool nodes get 4 GPUs, the others none."""
    pool = set(config.gpu_pool.nodes)
    return [gpu_node(n.name) if n.name in pool else cpu_node(n.name) for n in config.nodes]


def create_nodes(api_client: Any, nodes: Iterable[FakeNode]) -> list[str]:
    """Create the nodes with a kubelet-like status; returns their names."""
    core = client.CoreV1Api(api_client)
    names = []
    for node in nodes:
        core.create_node(
            client.V1Node(
                metadata=client.V1ObjectMeta(
                    name=node.name,
                    labels={"kubernetes.io/hostname": node.name, **node.labels},
                )
            )
        )
        core.patch_node_status(
            node.name,
            {
                "status": {
                    "capacity": dict(node.capacity),
                    "allocatable": dict(node.capacity),
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "fake node on the local control plane",
                        }
                    ],
                }
            },
        )
        # The API server's TaintNodesByCondition admission taints a new node not-ready; the
        # node lifecycle controller (not running here) lifts it once the node is Ready.
        core.patch_node(node.name, {"spec": {"taints": None}})
        names.append(node.name)
    return names


def snapshot(api_client: Any, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """What the stack may touch on each node: taints, labels, capacity and allocatable."""
    core = client.CoreV1Api(api_client)
    result: dict[str, dict[str, Any]] = {}
    for name in names:
        node: dict[str, Any] = client.ApiClient().sanitize_for_serialization(core.read_node(name))
        status = node.get("status") or {}
        result[name] = {
            "taints": (node.get("spec") or {}).get("taints") or [],
            "labels": (node.get("metadata") or {}).get("labels") or {},
            "capacity": status.get("capacity") or {},
            "allocatable": status.get("allocatable") or {},
        }
    return result
