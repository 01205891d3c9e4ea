"""The binpack profile with DRA GPUs, live: the built gpu-binpack-scheduler (scheduler/, what an
image built from it runs) with the configuration the layer renders for
`gpuOperator.allocation: dra`, against a local cluster (real kube-apiserver,
kube-controller-manager making claims from templates, kwok's kubelets) where the DRA driver
stand-in (tools/harness/dra.py) publishes each GPU node's ResourceSlice and the driver's
DeviceClasses.

Pods ask for GPUs as users write them: a ResourceClaimTemplate of the gpu.nvidia.com class.
1-GPU claim pods fill one 8-GPU node, so an 8-GPU claim pod still finds a whole node; and
GpuClaimBinpack, not the pods' cpu and memory, is what sends small claim pods to the node whose
GPUs are fuller (without it they follow cpu and memory to the other node).
"""

from __future__ import annotations

import time
import urllib.error
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import yaml

from components.binpack_scheduler.manifests import render_config
from components.binpack_scheduler.settings import BinpackSchedulerSettings, SchedulerProfile
from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_resources import GPU_DEVICE_CLASS
from tests.integration.conftest import require_tools
from tools.harness import dra
from tools.harness.cluster import CLUSTER_TOOLS, LocalCluster

pytestmark = pytest.mark.integration

SCHEDULER = "gpu-binpack-scheduler"
DRA_OPERATOR = GpuOperatorSettings.model_validate(
    {"enabled": True, "allocation": "dra", "version": "v26.7.0"}
)
BUILT_IMAGE = "registry.example.com/platform/gpu-binpack-scheduler:v1.37.2"
GPUS_PER_NODE = 8
DECISION_TIMEOUT = 60.0
POOL_LABEL = "gpu-cluster.io/test-pool"


def _profile(image: str | None) -> SchedulerProfile:
    settings = BinpackSchedulerSettings.model_validate({"image": image} if image else {})
    return settings.profile_with(DRA_OPERATOR.gpu_resources())


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_tools(*CLUSTER_TOOLS, SCHEDULER)
    with LocalCluster() as started:
        yield started


class DraPool:
    """Two 8-GPU DRA nodes of one test, its namespace and claim templates."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.cp = cluster.control_plane
        self.id = uuid.uuid4().hex[:6]
        self.namespace = f"dra-binpack-{self.id}"
        self.nodes = [f"dra-{self.id}-{i}" for i in range(2)]
        cluster.add_nodes(
            replace(node, labels={**node.labels, POOL_LABEL: self.id})
            for node in (dra.dra_node(n, cpu="32", memory="256Gi") for n in self.nodes)
        )
        dra.publish(cluster.api_client(), dict.fromkeys(self.nodes, GPUS_PER_NODE))
        # kube-controller-manager gives the namespace its default ServiceAccount.
        self.cp.create_namespace(self.namespace, default_service_account=False)
        deadline = time.monotonic() + DECISION_TIMEOUT
        while not self._has_default_account():
            if time.monotonic() > deadline:
                pytest.fail(f"no default ServiceAccount in {self.namespace}")
            time.sleep(0.2)
        for name, count in (("one-gpu", 1), ("eight-gpus", GPUS_PER_NODE)):
            self.cp.request(
                "POST",
                f"/apis/{dra.RESOURCE_API}/namespaces/{self.namespace}/resourceclaimtemplates",
                dra.claim_template(name, GPU_DEVICE_CLASS, count),
            )

    def _has_default_account(self) -> bool:
        try:
            self.cp.get(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default")
        except urllib.error.HTTPError:
            return False
        return True

    def create_pod(
        self,
        name: str,
        scheduler: str,
        template: str,
        memory: str = "48Gi",
        node: str | None = None,
    ) -> None:
        """A claim pod of `template` (on `node` when given, else anywhere in the pool)."""
        container = {
            "name": "main",
            "image": "registry.invalid/cuda-job:1",
            "resources": {"requests": {"cpu": "100m", "memory": memory}},
        }
        where = {"kubernetes.io/hostname": node} if node else {}
        spec = dra.claim_pod_spec(
            template,
            [container],
            schedulerName=scheduler,
            automountServiceAccountToken=False,
            nodeSelector={POOL_LABEL: self.id, **where},
        )
        self.cp.request(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/pods",
            {"metadata": {"name": name}, "spec": spec},
        )

    def create_ballast(self, node: str) -> None:
        """A CPU-only pod bound to `node` holding half its cpu and memory."""
        container = {
            "name": "main",
            "image": "registry.invalid/cpu-job:1",
            "resources": {"requests": {"cpu": "16", "memory": "128Gi"}},
        }
        self.cp.request(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/pods",
            {
                "metadata": {"name": "ballast"},
                "spec": {
                    "nodeName": node,
                    "containers": [container],
                    "automountServiceAccountToken": False,
                },
            },
        )

    def decision(self, name: str, log: Any) -> str | None:
        """The node the pod is bound to, or None once it is marked Unschedulable."""
        deadline = time.monotonic() + DECISION_TIMEOUT
        while True:
            pod = self.cp.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
            if pod["spec"].get("nodeName"):
                return str(pod["spec"]["nodeName"])
            for cond in pod.get("status", {}).get("conditions", []):
                if (cond["type"], cond["status"], cond.get("reason")) == (
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                ):
                    return None
            if time.monotonic() > deadline:
                pytest.fail(f"pod {name} undecided after {DECISION_TIMEOUT} s\n{log()}")
            time.sleep(0.1)

    def delete(self) -> None:
        self.cp.request("DELETE", f"/api/v1/namespaces/{self.namespace}")
        for node in self.nodes:
            self.cp.request(
                "DELETE", f"/apis/{dra.RESOURCE_API}/resourceslices/{node}-{dra.DRIVER}"
            )
            self.cp.request("DELETE", f"/api/v1/nodes/{node}")


@pytest.fixture
def pool(cluster: LocalCluster) -> Iterator[DraPool]:
    created = DraPool(cluster)
    try:
        yield created
    finally:
        created.delete()


def _run(pool: DraPool, profile: SchedulerProfile, ones: int) -> tuple[list[str], str | None]:
    """`ones` 1-GPU claim pods one after the other, then an 8-GPU one, under `profile` in the
    built scheduler: the nodes the 1-GPU pods got and the 8-GPU pod's (None: unschedulable)."""
    name = f"{SCHEDULER}-{pool.id}"
    config = render_config(
        replace(profile, scheduler_name=name, leader_elect=False),
        kubeconfig=str(pool.cluster.kubeconfig_path),
    )
    with pool.cp.start_scheduler(yaml.safe_dump(config), binary=SCHEDULER) as scheduler:
        placed = []
        for i in range(ones):
            pool.create_pod(f"one-{i}", name, "one-gpu")
            node = pool.decision(f"one-{i}", scheduler.tail)
            assert node is not None, f"one-{i} unschedulable\n{scheduler.tail()}"
            placed.append(node)
        pool.create_pod("eight", name, "eight-gpus")
        return placed, pool.decision("eight", scheduler.tail)


def test_binpack_dra_live_claim_pods_fill_one_node_and_keep_a_whole_one(pool: DraPool) -> None:
    profile = _profile(BUILT_IMAGE)
    assert profile.claim_binpack
    placed, eight = _run(pool, profile, 4)
    assert len(set(placed)) == 1, f"1-GPU claim pods went to {placed}"
    assert eight is not None and eight not in placed


@pytest.mark.parametrize("claim_binpack", [True, False], ids=["with", "without"])
def test_binpack_dra_live_gpu_fullness_outweighs_cpu_and_memory(
    pool: DraPool, claim_binpack: bool
) -> None:
    """Node A holds one GPU claim pod, node B a CPU-only pod holding half its cpu and memory.
    Small 1-GPU claim pods go to A, whose GPUs are fuller, with GpuClaimBinpack (the profile of
    the built image); without it (the upstream image's profile, the same binary) cpu and memory
    packing sends them to B: the plugin, not the pods' requests, decides."""
    profile = _profile(BUILT_IMAGE if claim_binpack else None)
    assert profile.claim_binpack is claim_binpack
    gpu_node, cpu_node = pool.nodes
    pool.create_ballast(cpu_node)
    name = f"{SCHEDULER}-{pool.id}"
    config = render_config(
        replace(profile, scheduler_name=name, leader_elect=False),
        kubeconfig=str(pool.cluster.kubeconfig_path),
    )
    with pool.cp.start_scheduler(yaml.safe_dump(config), binary=SCHEDULER) as scheduler:
        pool.create_pod("first", name, "one-gpu", memory="1Gi", node=gpu_node)
        assert pool.decision("first", scheduler.tail) == gpu_node
        placed = []
        for i in range(3):
            pool.create_pod(f"small-{i}", name, "one-gpu", memory="1Gi")
            placed.append(pool.decision(f"small-{i}", scheduler.tail))
    want = gpu_node if claim_binpack else cpu_node
    assert placed == [want] * 3, f"small claim pods went to {placed}, want {want}"
