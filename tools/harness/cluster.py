"""A local cluster that behaves like a real one, on 127.0.0.1.

LocalControlPlane gives etcd and kube-apiserver. LocalCluster adds what makes objects *work*:
kube-controller-manager (Deployments become Available, DaemonSets roll out, Jobs complete,
namespaces get their default ServiceAccount, deletion and garbage collection finish, the node
lifecycle controller taints and evicts), the cluster's own kube-scheduler (default profile), and
kwok, which plays the kubelet of every fake node: it reports the node Ready with a lease
heartbeat and moves the pods bound to it through Running (and Succeeded for Jobs).

Pod IPs come from a range that this host treats as its own (PodNetwork), so a process the
harness starts on a pod's IP serves that pod for real: the API server reaches a webhook
Service through its endpoints (``--enable-aggregator-routing``), exactly as it would reach a
pod on a real cluster.
"""

from __future__ import annotations

import ipaddress
import random
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from .controlplane import (
    CONTROL_PLANE_TOOLS,
    ControlPlaneError,
    Lifecycle,
    LocalControlPlane,
    ManagedProcess,
    SchedulerHandle,
    free_port,
    require_tool,
)
from .fake_nodes import FakeNode

CLUSTER_TOOLS = (
    *CONTROL_PLANE_TOOLS,
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kwok-stages.yaml",
)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_MANAGED = "fake"
# Pod addresses: a /24 of the benchmarking range (RFC 2544, never routed on the internet),
# made local to this host for the cluster's lifetime. Endpoints may not hold loopback
# addresses, so 127.0.0.0/8 cannot serve.
POD_SUPERNET = ipaddress.IPv4Network("198.18.0.0/15")
NODE_LEASE_SECONDS = 40
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


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


def node_ready(node: Mapping[str, Any]) -> bool:
    """Ready=True and the lifecycle controller's not-ready taint gone."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") == NOT_READY_TAINT for t in taints)


class PodNetwork:
    """A /24 routed to the loopback interface (`ip route add local`), so any address in it is
    this host's own, like Linux AnyIP. Needs CAP_NET_ADMIN; removed again by `release`."""

    def __init__(self) -> None:
        self._subnets = list(POD_SUPERNET.subnets(new_prefix=24))[1:]
        self.network: ipaddress.IPv4Network = random.choice(self._subnets)
        self._added = False

    @property
    def cidr(self) -> str:
        """The range for kwok's --cidr (its first address is the gateway)."""
        return f"{self.network.network_address + 1}/{self.network.prefixlen}"

    def claim(self) -> None:
        ip = shutil.which("ip")
        if ip is None:
            raise ControlPlaneError("the `ip` command (iproute2) is needed for the pod network")
        for _ in range(16):  # another cluster on this host may hold a /24 already
            done = subprocess.run(
                [ip, "route", "add", "local", str(self.network), "dev", "lo"],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0 or "File exists" not in done.stderr:
                break
            self.network = random.choice(self._subnets)
        if done.returncode != 0:
            raise ControlPlaneError(
                f"cannot route the pod network {self.network} to this host "
                f"(`ip route add local {self.network} dev lo`, needs CAP_NET_ADMIN): "
                f"{done.stderr.strip()}"
            )
        self._added = True

    def release(self) -> None:
        if self._added:
            subprocess.run(
                ["ip", "route", "del", "local", str(self.network), "dev", "lo"],
                capture_output=True,
            )
            self._added = False


class LocalCluster(Lifecycle):
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on 127.0.0.1.

    ``admission_plugins`` are enabled on the API server in addition to its defaults (for
    example ``ExtendedResourceToleration``, as ControlPlaneFeatures enables it on real clusters).
    """

    def __init__(
        self,
        *,
        admission_plugins: Sequence[str] = (),
        extra_apiserver_flags: Sequence[str] = (),
        startup_timeout: float = 120.0,
        base_dir: str | Path | None = None,
    ) -> None:
        flags = ["--enable-aggregator-routing=true"]
        if admission_plugins:
            flags.append(f"--enable-admission-plugins={','.join(admission_plugins)}")
        self.control_plane = LocalControlPlane(
            [*flags, *extra_apiserver_flags],
            startup_timeout=startup_timeout,
            base_dir=base_dir,
        )
        self.startup_timeout = startup_timeout
        self._controller_manager: ManagedProcess | None = None
        self._kwok: ManagedProcess | None = None
        self._scheduler: SchedulerHandle | None = None
        self.pod_network = PodNetwork()

    # -------------------------------------------------------------- lifecycle
    def start(self) -> LocalCluster:
        """Start every component; waits until each is healthy. Rolls back on failure."""
        for tool in CLUSTER_TOOLS:
            require_tool(tool)
        cp = self.control_plane
        try:
            self.pod_network.claim()
            cp.start()
            self._start_controller_manager()
            self._scheduler = cp.start_scheduler("", timeout=self.startup_timeout)
            self._start_kwok()
            self._wait_default_service_account()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop kwok, the controller manager and the control plane; safe to call twice."""
        for process in (self._kwok, self._controller_manager):
            if process is not None:
                process.stop()
        self._kwok = self._controller_manager = self._scheduler = None
        self.control_plane.stop()
        self.pod_network.release()

    # ------------------------------------------------------------- components
    def _start_controller_manager(self) -> None:
        cp = self.control_plane
        pki = cp.pki_dir
        port = free_port()
        kubeconfig = str(cp.kubeconfig_path)
        argv = [
            str(require_tool("kube-controller-manager")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
            # As kubeadm runs it: every controller with its own ServiceAccount's credentials.
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--root-ca-file={cp.ca_path}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--profiling=false",
        ]
        self._controller_manager = ManagedProcess(
            "kube-controller-manager", argv, cp.workdir / "kube-controller-manager.log"
        )
        self._controller_manager.start()
        cp._wait(
            "kube-controller-manager",
            lambda: cp._http_ok(f"https://127.0.0.1:{port}/healthz", _unverified()),
            [cp._apiserver, self._controller_manager],
        )

    def _start_kwok(self) -> None:
        cp = self.control_plane
        argv = [
            str(require_tool("kwok")),
            f"--kubeconfig={cp.kubeconfig_path}",
            f"--config={require_tool('kwok-stages.yaml')}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_MANAGED}",
            f"--cidr={self.pod_network.cidr}",
            "--node-ip=127.0.0.1",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            f"--server-address=127.0.0.1:{free_port()}",
        ]
        self._kwok = ManagedProcess("kwok", argv, cp.workdir / "kwok.log")
        self._kwok.start()
        # kwok has no readiness endpoint to speak of; it is checked by the first node it runs.
        time.sleep(0.5)
        if not self._kwok.running():
            raise ControlPlaneError(f"kwok exited at start:\n{self._kwok.tail()}")

    def _wait_default_service_account(self) -> None:
        """The controller manager works once it has given `default` its ServiceAccount."""
        core: Any = client.CoreV1Api(self.api_client())

        def ready() -> bool:
            try:
                core.read_namespaced_service_account("default", "default")
            except client.exceptions.ApiException:
                return False
            return True

        self.control_plane._wait(
            "the default ServiceAccount", ready, [self._controller_manager], self.startup_timeout
        )

    # ----------------------------------------------------------------- access
    @property
    def kubeconfig_path(self) -> Path:
        return self.control_plane.kubeconfig_path

    @property
    def scheduler(self) -> SchedulerHandle:
        """The cluster's own kube-scheduler (default profile)."""
        if self._scheduler is None:
            raise ControlPlaneError("cluster not started")
        return self._scheduler

    def api_client(self) -> Any:
        return self.control_plane.api_client()

    def logs(self) -> dict[str, str]:
        """Last log lines of every process, keyed by process name."""
        logs = self.control_plane.logs()
        for process in (self._controller_manager, self._kwok):
            if process is not None:
                logs[process.name] = process.tail()
        return logs

    # ------------------------------------------------------------------ nodes
    def add_nodes(self, nodes: Iterable[FakeNode], timeout: float = 90.0) -> list[str]:
        """Register fake nodes for kwok to run and wait until every one is Ready and untainted."""
        core: Any = client.CoreV1Api(self.api_client())
        names = []
        for node in nodes:
            core.create_node(kwok_node_body(node))
            names.append(node.name)
        self.wait_nodes_ready(names, timeout)
        return names

    def wait_nodes_ready(self, names: Sequence[str], timeout: float = 90.0) -> None:
        core: Any = client.CoreV1Api(self.api_client())
        pending = set(names)

        def ready() -> bool:
            for name in list(pending):
                node = client.ApiClient().sanitize_for_serialization(core.read_node(name))
                if node_ready(node):
                    pending.discard(name)
            return not pending

        self.control_plane._wait(
            f"nodes {sorted(pending)} Ready",
            ready,
            [self._kwok, self._controller_manager],
            timeout,
        )


def _unverified() -> ssl.SSLContext:
    """A TLS context for a component's own self-signed health endpoint."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    return insecure
