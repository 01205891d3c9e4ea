"""The realistic fleet of the openb replay: what a trace's node list becomes on a real cluster.

The bare replay gives every node its trace capacity as allocatable and runs nothing but the
trace. A production node differs in three ways, each modelled here, seeded so that every
profile of a run (and every later run with the same seed) sees the same fleet:

- **Allocatable as kubelets report it.** cpu: capacity minus a reservation per node type, the
  GKE formula (6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of every
  core above four). memory: capacity minus the kubelet's hard eviction threshold (100 MiB,
  its default) minus a per-node jitter of 0-255 MiB: machines of one model report memory
  that differs by a few MiB (firmware and kernel reservations), which makes every node a
  shape of its own.
- **DaemonSet pods on every node** before the first trace pod: `DAEMONSETS` below, created as
  DaemonSets (the DaemonSet controller makes the pods, a stock kube-scheduler binds them).
- **Images** for ImageLocality, the one default score plugin the trace's pods can meet (they
  have no owners, so PodTopologySpread's system defaults do not apply; they have no affinity):
  each node reports `IMAGES_PER_NODE` of `IMAGES` as present, each trace pod runs one of them.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EVICTION_HARD_MIB = 100
MEMORY_JITTER_MIB = 255
IMAGES_PER_NODE = 3
SYSTEM_NAMESPACE = "kube-system"


@dataclass(frozen=True, kw_only=True)
class DaemonSetSpec:
    """One DaemonSet every node runs, with the requests of its one container."""

    namespace: str
    name: str
    cpu_milli: int
    memory_mib: int
    source: str
    """Where the requests come from."""


# A GPU node's usual system pods. The requests are the ones the projects ship, where they ship
# some; the NVIDIA operands ship none, so the values there are what operators commonly set.
DAEMONSETS: tuple[DaemonSetSpec, ...] = (
    DaemonSetSpec(
        namespace=SYSTEM_NAMESPACE,
        name="kube-proxy",
        cpu_milli=0,
        memory_mib=0,
        source="kubeadm's manifest: no requests",
    ),
    DaemonSetSpec(
        namespace=SYSTEM_NAMESPACE,
        name="calico-node",
        cpu_milli=250,
        memory_mib=0,
        source="Calico's manifest",
    ),
    DaemonSetSpec(
        namespace="monitoring",
        name="node-exporter",
        cpu_milli=102,
        memory_mib=180,
        source="kube-prometheus's manifest",
    ),
    DaemonSetSpec(
        namespace="gpu-operator",
        name="nvidia-device-plugin-daemonset",
        cpu_milli=50,
        memory_mib=64,
        source="commonly set (the chart ships none)",
    ),
    DaemonSetSpec(
        namespace="gpu-operator",
        name="nvidia-dcgm-exporter",
        cpu_milli=100,
        memory_mib=256,
        source="commonly set (the chart ships none)",
    ),
)

# (name, size in bytes): training and inference images of typical sizes.
IMAGES: tuple[tuple[str, int], ...] = (
    ("registry.invalid/pytorch-train:2.5", 9_800_000_000),
    ("registry.invalid/tensorflow-train:2.17", 7_100_000_000),
    ("registry.invalid/jax-train:0.4", 6_200_000_000),
    ("registry.invalid/triton-serve:24.10", 11_500_000_000),
    ("registry.invalid/vllm-serve:0.6", 8_900_000_000),
    ("registry.invalid/notebook:4.2", 3_400_000_000),
    ("registry.invalid/spark-etl:3.5", 1_200_000_000),
    ("registry.invalid/batch-cpu:1.0", 600_000_000),
)


def reserved_cpu_milli(cpu_milli: int) -> int:
    """The cpu a kubelet reserves on a node of `cpu_milli` capacity (GKE's formula)."""
    cores = cpu_milli / 1000
    steps = ((1.0, 0.06), (1.0, 0.01), (2.0, 0.005), (float("inf"), 0.0025))
    reserved = 0.0
    left = cores
    for size, share in steps:
        take = min(left, size)
        reserved += take * share * 1000
        left -= take
        if left <= 0:
            break
    return round(reserved)


def node_rng(seed: int, node: str) -> random.Random:
    """A generator for one node, independent of the order nodes are made in."""
    return random.Random(zlib.crc32(f"{seed}/{node}".encode()))


def allocatable(node: str, cpu_milli: int, memory_mib: int, seed: int) -> tuple[int, int]:
    """(cpu milli, memory MiB) a kubelet on `node` reports as allocatable."""
    jitter = node_rng(seed, node).randint(0, MEMORY_JITTER_MIB)
    return (
        cpu_milli - reserved_cpu_milli(cpu_milli),
        memory_mib - EVICTION_HARD_MIB - jitter,
    )


def node_images(node: str, seed: int) -> list[dict[str, Any]]:
    """`status.images` of a node: `IMAGES_PER_NODE` of `IMAGES`, chosen per node."""
    chosen = node_rng(seed + 1, node).sample(IMAGES, IMAGES_PER_NODE)
    return [{"names": [name], "sizeBytes": size} for name, size in chosen]


def pod_image(pod: str, seed: int) -> str:
    """The image a trace pod runs, chosen per pod."""
    return node_rng(seed + 2, pod).choice(IMAGES)[0]


def daemonset_requests(specs: Sequence[DaemonSetSpec] = DAEMONSETS) -> tuple[int, int]:
    """(cpu milli, memory MiB) the DaemonSet pods take on every node."""
    return sum(s.cpu_milli for s in specs), sum(s.memory_mib for s in specs)


def daemonset_object(spec: DaemonSetSpec) -> dict[str, Any]:
    """An apps/v1 DaemonSet running on every node, whatever its taints."""
    labels = {"app.kubernetes.io/name": spec.name}
    requests = {}
    if spec.cpu_milli:
        requests["cpu"] = f"{spec.cpu_milli}m"
    if spec.memory_mib:
        requests["memory"] = f"{spec.memory_mib}Mi"
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": spec.name, "namespace": spec.namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": f"registry.invalid/{spec.name}:1",
                            "resources": {"requests": requests},
                        }
                    ],
                },
            },
        },
    }
