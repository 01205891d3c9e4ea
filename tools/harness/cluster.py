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
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from .child_process import ControlPlaneError, Lifecycle, ManagedProcess, wait_until
from .controller_manager import ControllerManager
from .controlplane import LocalControlPlane
from .fake_nodes import FakeNode
from .kwok import KWOK_ANNOTATION, KWOK_MANAGED, NODE_LEASE_SECONDS, Kwok, kwok_node_body
from .scheduler import SchedulerHandle
from .tools import CONTROL_PLANE_TOOLS, require_tool

CLUSTER_TOOLS = (
    *CONTROL_PLANE_TOOLS,
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kwok-stages.yaml",
)
# Pod addresses: a /24 of the benchmarking range (RFC 2544, never routed on the internet),
# made local to this host for the cluster's lifetime. Endpoints may not hold loopback
# addresses, so 127.0.0.0/8 cannot serve.
POD_SUPERNET = ipaddress.IPv4Network("198.18.0.0/15")
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
__all__ = [
    "CLUSTER_TOOLS",
    "KWOK_ANNOTATION",
    "KWOK_MANAGED",
    "NODE_LEASE_SECONDS",
    "LocalCluster",
    "PodNetwork",
    "kwok_node_body",
    "node_ready",
]


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


def items_flag(flag: str, items: Mapping[str, bool] | None) -> list[str]:
    """`[--flag=A=true,B=false]` for `items`, sorted; nothing for none."""
    if not items:
        return []
    return [f"{flag}=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(items.items()))]


class LocalCluster(Lifecycle):
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on 127.0.0.1.

    ``admission_plugins`` are enabled on the API server in addition to its defaults (for
    example ``ExtendedResourceToleration``, as ControlPlaneFeatures enables it on real clusters);
    ``feature_gates`` are set on the API server and the controller manager, and
    ``runtime_config`` on the API server, as kubeadm sets a ClusterConfiguration's.
    """

    def __init__(
        self,
        *,
        admission_plugins: Sequence[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Mapping[str, bool] | None = None,
        extra_apiserver_flags: Sequence[str] = (),
        startup_timeout: float = 120.0,
        base_dir: str | Path | None = None,
    ) -> None:
        flags = ["--enable-aggregator-routing=true"]
        if admission_plugins:
            flags.append(f"--enable-admission-plugins={','.join(admission_plugins)}")
        self.component_flags = items_flag("--feature-gates", feature_gates)
        flags += self.component_flags + items_flag("--runtime-config", runtime_config)
        self.control_plane = LocalControlPlane(
            [*flags, *extra_apiserver_flags],
            startup_timeout=startup_timeout,
            base_dir=base_dir,
        )
        self.startup_timeout = startup_timeout
        self._controller_manager: ControllerManager | None = None
        self._kwok: Kwok | None = None
        self._scheduler: SchedulerHandle | None = None
        self.pod_network = PodNetwork()

    # -------------------------------------------------------------- lifecycle
    def start(self) -> LocalCluster:
        """Start every component in order; waits until each is healthy. A partial start is
        rolled back (everything stopped, the control plane's work dir removed)."""
        for tool in CLUSTER_TOOLS:
            require_tool(tool)
        cp = self.control_plane
        try:
            self.pod_network.claim()
            cp.start()
            self._controller_manager = ControllerManager(
                require_tool("kube-controller-manager"),
                cp.workdir,
                cp.kubeconfig_path,
                cp.pki,
                self.component_flags,
            )
            self._controller_manager.start(self.startup_timeout, watch=[cp.apiserver_process])
            self._scheduler = cp.start_scheduler("", timeout=self.startup_timeout)
            self._kwok = Kwok(
                require_tool("kwok"),
                require_tool("kwok-stages.yaml"),
                cp.workdir,
                cp.kubeconfig_path,
                self.pod_network.cidr,
            )
            self._kwok.start()
            self._wait_default_service_account()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop kwok, the controller manager and the control plane; safe to call twice."""
        for component in (self._kwok, self._controller_manager):
            if component is not None:
                component.stop()
        self._kwok = self._controller_manager = self._scheduler = None
        self.control_plane.stop()
        self.pod_network.release()

    def _processes(self) -> list[ManagedProcess | None]:
        """kwok's and the controller manager's processes, for waits that depend on them."""
        return [
            c.process if c is not None else None for c in (self._kwok, self._controller_manager)
        ]

    def _wait_default_service_account(self) -> None:
        """The controller manager works once it has given `default` its ServiceAccount."""
        core: Any = client.CoreV1Api(self.api_client())

        def ready() -> bool:
            try:
                core.read_namespaced_service_account("default", "default")
            except client.exceptions.ApiException:
                return False
            return True

        wait_until("the default ServiceAccount", ready, self._processes(), self.startup_timeout)

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
        for process in self._processes():
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

        wait_until(f"nodes {sorted(pending)} Ready", ready, self._processes(), timeout)
