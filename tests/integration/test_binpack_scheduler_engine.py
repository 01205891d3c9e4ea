"""BinpackScheduler under the real Pulumi engine and kubernetes provider, on a local cluster.

kube-controller-manager runs the Deployment, kwok the nodes, and the scheduler's pod runs as a
kube-scheduler process holding its pod's ServiceAccount token (tools/harness/workloads.py), so
what it may do is the component's RBAC and nothing else. `up` creates the scheduler's Lease
beside its roles; the scheduler takes that Lease (it may not create one) and binds a GPU pod;
another `up`, and a preview that refreshes first, change nothing while the scheduler keeps
renewing the Lease; `destroy` removes the Lease with the rest. The stack's claim and the force
annotation (ClusterAccess.create) are the whole program's, tested in tests/e2e.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
from kubernetes import client
from pulumi import automation as auto

from components import BinpackScheduler, BinpackSchedulerArgs, ClusterAccess
from components.binpack_scheduler.manifests import labels
from tests.integration.conftest import require_tools
from tools.harness.cluster import CLUSTER_TOOLS, LocalCluster
from tools.harness.fake_nodes import GPU_RESOURCE, gpu_node
from tools.harness.pulumi_engine import WHOLE_PROGRAM_TOOLS, inline_stack
from tools.harness.workloads import PodRuntime

NAME = "gpu-pack-engine"
NAMESPACE = "kube-system"
TIMEOUT_S = 60.0


@dataclass
class Deployed:
    cluster: LocalCluster
    stack: auto.Stack
    runtime: PodRuntime

    def core(self) -> Any:
        return client.CoreV1Api(self.cluster.api_client())

    def lease(self) -> Any:
        coordination: Any = client.CoordinationV1Api(self.cluster.api_client())
        return coordination.read_namespaced_lease(NAME, NAMESPACE)


def _program(kubeconfig: str) -> auto.PulumiFn:
    def program() -> None:
        provider = k8s.Provider(
            "cluster", kubeconfig=pulumi.Output.secret(kubeconfig), enable_server_side_apply=True
        )
        scheduler = BinpackScheduler(
            "binpack-scheduler",
            BinpackSchedulerArgs(
                access=ClusterAccess(provider=provider),
                kubernetes_version="v1.37.2",
                name=NAME,
                replicas=1,
            ),
        )
        pulumi.export("schedulerName", scheduler.scheduler_name)

    return program


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    require_tools(*CLUSTER_TOOLS, *WHOLE_PROGRAM_TOOLS)
    base: Path = tmp_path_factory.mktemp("binpack-engine")
    with LocalCluster(base_dir=base) as cluster:
        cluster.add_nodes([gpu_node("gpu-1", gpus=4)])
        program = _program(cluster.kubeconfig_path.read_text())
        stack = inline_stack("gpu-cluster-binpack", "engine", program, base / "state")
        runtime = PodRuntime(cluster, base / "pods")
        try:
            stack.up(on_output=print)
            runtime.sync()
            yield Deployed(cluster, stack, runtime)
        finally:
            runtime.stop()
            stack.destroy(on_output=print)


def _holder(deployed: Deployed) -> str:
    """The Lease's holder once the scheduler has taken it."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (holder := deployed.lease().spec.holder_identity):
        if time.monotonic() > deadline:
            logs = "\n".join(p.process.tail() for p in deployed.runtime.of(NAMESPACE, NAME))
            pytest.fail(f"Lease {NAMESPACE}/{NAME} has no holder after {TIMEOUT_S:.0f} s\n{logs}")
        time.sleep(0.5)
    return str(holder)


def test_binpack_scheduler_engine_scheduler_takes_the_lease_the_stack_created(
    deployed: Deployed,
) -> None:
    (process,) = deployed.runtime.of(NAMESPACE, NAME)
    assert _holder(deployed)
    lease = deployed.lease()
    # Created by the stack (its labels), renewed by the scheduler.
    assert lease.metadata.labels == labels(NAME)
    managers = {(f.manager, f.operation) for f in lease.metadata.managed_fields}
    assert ("kube-scheduler", "Update") in managers, managers
    assert "forbidden" not in process.process.log().lower(), process.process.tail()


def test_binpack_scheduler_engine_binds_a_gpu_pod_with_its_own_rbac(deployed: Deployed) -> None:
    core = deployed.core()
    namespace = f"engine-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {
            "schedulerName": NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda-job:1",
                    "resources": {"limits": {GPU_RESOURCE: "1"}},
                }
            ],
        },
    }
    try:
        core.create_namespaced_pod(namespace, pod)
        deadline = time.monotonic() + TIMEOUT_S
        while not core.read_namespaced_pod("train", namespace).spec.node_name:
            assert time.monotonic() < deadline, f"pod not bound after {TIMEOUT_S:.0f} s"
            time.sleep(0.5)
        assert core.read_namespaced_pod("train", namespace).spec.node_name == "gpu-1"
    finally:
        core.delete_namespace(namespace)


def test_binpack_scheduler_engine_second_up_and_refresh_change_nothing(
    deployed: Deployed,
) -> None:
    """The scheduler writes the Lease's spec; the stack declared none, so neither a refreshed
    preview nor another `up` has anything to change."""
    first = deployed.lease().spec.renew_time
    _holder(deployed)
    deadline = time.monotonic() + TIMEOUT_S
    while deployed.lease().spec.renew_time == first:
        assert time.monotonic() < deadline, "the scheduler did not renew its Lease"
        time.sleep(0.5)
    deployed.stack.preview(refresh=True, expect_no_changes=True, diff=True, on_output=print)
    deployed.stack.up(refresh=True, expect_no_changes=True, on_output=print)
    assert _holder(deployed)


def test_binpack_scheduler_engine_destroy_removes_the_lease(deployed: Deployed) -> None:
    deployed.runtime.stop()
    deployed.stack.destroy(on_output=print)
    coordination: Any = client.CoordinationV1Api(deployed.cluster.api_client())
    names = [lease.metadata.name for lease in coordination.list_namespaced_lease(NAMESPACE).items]
    assert NAME not in names
    rbac: Any = client.RbacAuthorizationV1Api(deployed.cluster.api_client())
    assert f"{NAME}:scheduler" not in [r.metadata.name for r in rbac.list_cluster_role().items]
