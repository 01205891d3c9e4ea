"""A distributed GPU job as a user submits it, for `make demo` and tests/e2e: an indexed Job of
GPU workers and a CPU-only launcher in one PodGroup (scheduling.k8s.io/v1beta1, policy gang,
minCount all of them), none naming a scheduler; and the pool filled but for a few GPUs, so the
gang is seen to wait whole and start whole."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

GPU = "nvidia.com/gpu"
WORKER_IMAGE = "registry.invalid/cuda-job:1"
LAUNCHER_IMAGE = "registry.invalid/launcher:1"
STARTED = ("Running", "Succeeded")
"""Phases of a started pod (the simulated kubelet completes a Job's pods at once)."""


def free_gpus(core: Any, node: str) -> int:
    """GPUs of `node` that no pod bound there (and not finished) asks for."""
    allocatable = int(core.read_node(node).status.allocatable.get(GPU, "0"))
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    used = sum(
        int(((c.resources and c.resources.limits) or {}).get(GPU, "0"))
        for pod in pods
        if pod.status.phase not in ("Succeeded", "Failed")
        for c in pod.spec.containers
    )
    return allocatable - used


def wait_quiet(core: Any, timeout: float = 120) -> None:
    """Until no namespace is being deleted and no pod is going (their GPUs are then free)."""
    deadline = time.monotonic() + timeout
    while any(n.status.phase == "Terminating" for n in core.list_namespace().items) or any(
        p.metadata.deletion_timestamp for p in core.list_pod_for_all_namespaces().items
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods still going after {timeout:.0f} s")
        time.sleep(0.5)


def gpu_pod(name: str, gpus: int, node: str | None = None) -> dict[str, Any]:
    """A pod asking for `gpus` GPUs and naming no scheduler, required on `node` by its name
    (not bound: a scheduler places it) when given."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": WORKER_IMAGE, "resources": {"limits": {GPU: str(gpus)}}}
        ]
    }
    if node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def fill_pool(core: Any, namespace: str, gpu_nodes: Sequence[str], leave: int) -> list[str]:
    """Pods that take every free GPU of the pool but `leave` (one on each of the first nodes);
    their names, once each is running."""
    wait_quiet(core)
    free = {node: free_gpus(core, node) for node in gpu_nodes}
    if sum(free.values()) < leave or sum(1 for n in free.values() if n) < leave:
        raise RuntimeError(f"the pool has too few free GPUs to leave {leave}: {free}")
    keep = dict.fromkeys([n for n in sorted(free) if free[n]][:leave], 1)
    fillers = []
    for node, count in free.items():
        if count - keep.get(node, 0) > 0:
            name = f"filler-{node}"
            core.create_namespaced_pod(namespace, gpu_pod(name, count - keep.get(node, 0), node))
            fillers.append(name)
    wait_phase(core, namespace, fillers, ("Running",))
    return fillers


def wait_phase(
    core: Any, namespace: str, names: Sequence[str], phases: Sequence[str], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while lagging := [
        n for n in names if core.read_namespaced_pod(n, namespace).status.phase not in phases
    ]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {' or '.join(phases)} after {timeout:.0f} s: {lagging}")
        time.sleep(0.5)


@dataclass(frozen=True)
class Gang:
    """A submitted gang: its PodGroup (also the Job's name and the members' label)."""

    namespace: str
    group: str
    workers: int

    @property
    def members(self) -> int:
        return self.workers + 1

    @property
    def launcher(self) -> str:
        return f"{self.group}-launcher"

    @property
    def selector(self) -> str:
        return f"gang={self.group}"

    def bound(self, core: Any) -> dict[str, str]:
        """{member: node} of the members bound to a node."""
        pods = core.list_namespaced_pod(self.namespace, label_selector=self.selector).items
        return {p.metadata.name: p.spec.node_name for p in pods if p.spec.node_name}

    def wait_created(self, core: Any, timeout: float = 30) -> None:
        """Until the Job has created every worker."""
        deadline = time.monotonic() + timeout
        while (
            len(core.list_namespaced_pod(self.namespace, label_selector=self.selector).items)
            < self.members
        ):
            if time.monotonic() > deadline:
                raise TimeoutError("the Job did not create its workers")
            time.sleep(0.5)

    def wait_started(self, core: Any, timeout: float = 90) -> dict[str, str]:
        """Until every member is bound and started; {member: node}."""
        deadline = time.monotonic() + timeout
        while True:
            pods = core.list_namespaced_pod(self.namespace, label_selector=self.selector).items
            started = {p.metadata.name: p.spec.node_name for p in pods if p.status.phase in STARTED}
            if len(started) == self.members:
                return started
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gang did not start whole: {self.bound(core)}")
            time.sleep(0.5)


def submit_gang(api_client: Any, namespace: str, group: str, workers: int) -> Gang:
    """The PodGroup, an indexed Job of `workers` one-GPU workers and a CPU-only launcher, all
    in the group, none naming a scheduler (the gate routes them)."""
    gang = Gang(namespace, group, workers)
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "scheduling.k8s.io",
        "v1beta1",
        namespace,
        "podgroups",
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": group},
            "spec": {"schedulingPolicy": {"gang": {"minCount": gang.members}}},
        },
    )
    member = {"schedulingGroup": {"podGroupName": group}}
    worker = {**gpu_pod("worker", 1)["spec"], **member, "restartPolicy": "Never"}
    job: Any = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": group},
        "spec": {
            "completionMode": "Indexed",
            "completions": workers,
            "parallelism": workers,
            "template": {"metadata": {"labels": {"gang": group}}, "spec": worker},
        },
    }
    client.BatchV1Api(api_client).create_namespaced_job(namespace, job)
    launcher: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": gang.launcher, "labels": {"gang": group}},
        "spec": {
            **member,
            "containers": [
                {
                    "name": "main",
                    "image": LAUNCHER_IMAGE,
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }
    client.CoreV1Api(api_client).create_namespaced_pod(namespace, launcher)
    return gang
