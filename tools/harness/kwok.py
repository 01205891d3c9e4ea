"""kwok: the simulated kubelet of every fake node, on the pod addresses of a PodNetwork."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .child_process import ControlPlaneError, ManagedProcess, free_port
from .fake_nodes import FakeNode

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_MANAGED = "fake"
NODE_LEASE_SECONDS = 40


def kwok_node_body(node: FakeNode) -> dict[str, Any]:
    """A Node as a kubelet would register it, marked for kwok to manage.

    The API server keeps a Node's status on create (a kubelet registers that way); kwok adds
    the conditions, addresses and heartbeats, and the node lifecycle controller lifts the
    not-ready taint once the node is Ready.
    """
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {KWOK_ANNOTATION: KWOK_MANAGED},
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **node.labels,
            },
        },
        "status": {"capacity": dict(node.capacity), "allocatable": dict(node.capacity)},
    }


class Kwok:
    """kwok managing only the nodes annotated by :func:`kwok_node_body`."""

    def __init__(
        self, binary: Path, stages: Path, workdir: Path, kubeconfig: Path, pod_cidr: str
    ) -> None:
        self.binary = binary
        self.stages = stages
        self.kubeconfig = kubeconfig
        self.pod_cidr = pod_cidr
        self.log_path = workdir / "kwok.log"
        self.process: ManagedProcess | None = None

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_MANAGED}",
            f"--cidr={self.pod_cidr}",
            "--node-ip=127.0.0.1",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            f"--server-address=127.0.0.1:{free_port()}",
        ]

    def start(self) -> None:
        self.process = ManagedProcess("kwok", self.argv(), self.log_path)
        self.process.start()
        # kwok has no readiness endpoint to speak of; it is checked by the first node it runs.
        time.sleep(0.5)
        if not self.process.running():
            raise ControlPlaneError(f"kwok exited at start:\n{self.process.tail()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
