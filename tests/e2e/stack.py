"""One stack applied to its own local cluster: the cluster, the engine, the pods' processes.

Used by the scenarios (tests/e2e) and by `make demo` (tools/demo.py):

    with AppliedStack("local", workdir) as applied:
        applied.up()          # the whole program, in the engine's order, then the pods run
        ...                   # scenarios: pods, admission, scheduling
        applied.destroy()     # dependents first, waiting for each deletion
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tools.harness.cluster import LocalCluster
from tools.harness.controlplane import Lifecycle, require_tool
from tools.harness.fake_nodes import FakeNode, cpu_node, gpu_node

from .cli import CliStack, cli_mode
from .crds import chart_crds
from .engine import PROJECT, StackEngine, Step, stack_config
from .providers import StandIns
from .workloads import PodRuntime

# What ControlPlaneFeatures turns on in the real clusters' API servers.
ADMISSION_PLUGINS = ("ExtendedResourceToleration",)
LOCAL_CONTEXT = "local"


def inventory(stack: str, gpus: int = 4) -> list[FakeNode]:
    """The stack's node inventory as fake nodes: the GPU pool's nodes with `gpus` GPUs each."""
    values = stack_config(stack)
    nodes = json.loads(values.get(f"{PROJECT}:nodes") or "[]")
    pool = set(json.loads(values.get(f"{PROJECT}:gpuPool") or "{}").get("nodes") or [])
    return [
        gpu_node(node["name"], gpus) if node["name"] in pool else cpu_node(node["name"])
        for node in nodes
    ]


def _section(stack: str, key: str) -> dict[str, Any]:
    raw = stack_config(stack).get(f"{PROJECT}:{key}") or "{}"
    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


def kubeadm_cluster_configuration(version: str) -> str:
    """The ClusterConfiguration `kubeadm init` would upload for `version` (kubeadm's defaults)."""
    printed = subprocess.run(
        [str(require_tool("kubeadm")), "config", "print", "init-defaults"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (document,) = [
        d for d in yaml.safe_load_all(printed) if d and d.get("kind") == "ClusterConfiguration"
    ]
    document["kubernetesVersion"] = version
    return yaml.safe_dump(document, sort_keys=False)


def prerequisites(api_client: Any, stack: str) -> dict[str, str]:
    """What the README asks a user to create before `pulumi up`; returns secret config values.

    The cluster was made by kubeadm: kube-system/kubeadm-config holds its ClusterConfiguration
    (ControlPlaneFeatures edits it).

    With `monitoring.grafanaAdminSecret`, that Secret (made by hand or by a secret store) and
    its namespace exist beforehand. Without it, the password is a stack secret: the harness
    sets one, as `pulumi config set --secret gpu-cluster:grafanaAdminPassword` would.
    """
    core: Any = client.CoreV1Api(api_client)
    if _section(stack, "controlPlane").get("enabled"):
        version = stack_config(stack).get(f"{PROJECT}:kubernetesVersion") or ""
        core.create_namespaced_config_map(
            "kube-system",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kubeadm-config"},
                "data": {"ClusterConfiguration": kubeadm_cluster_configuration(version)},
            },
        )
    monitoring = _section(stack, "monitoring")
    if not monitoring.get("enabled"):
        return {}
    password = secrets.token_urlsafe(18)
    secret = monitoring.get("grafanaAdminSecret")
    if not secret:
        return {"grafanaAdminPassword": password}
    namespace = monitoring.get("namespace") or "monitoring"
    core.create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    core.create_namespaced_secret(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret},
            "stringData": {"admin-user": "admin", "admin-password": password},
        },
    )
    return {}


def node_state(api_client: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    """What the stack may change on each node: taints, labels, capacity, allocatable."""
    core: Any = client.CoreV1Api(api_client)
    state = {}
    for name in names:
        node: Any = core.read_node(name)
        state[name] = {
            "taints": sorted((t.key, t.value or "", t.effect) for t in node.spec.taints or []),
            # kwok's kubelet adds the deprecated beta.kubernetes.io labels some time after
            # registration, as old kubelets did; the stack never touches them.
            "labels": {
                k: v
                for k, v in (node.metadata.labels or {}).items()
                if not k.startswith("beta.kubernetes.io/")
            },
            "annotations": {
                k: v
                for k, v in (node.metadata.annotations or {}).items()
                if not k.startswith(("kwok.x-k8s.io/", "node.alpha.kubernetes.io/"))
            },
            "capacity": dict(node.status.capacity or {}),
            "allocatable": dict(node.status.allocatable or {}),
        }
    return state


class AppliedStack(Lifecycle):
    """A local cluster with `stack`'s nodes, and the engine that applies the program to it."""

    def __init__(
        self,
        stack: str,
        workdir: Path,
        *,
        overrides: Mapping[str, Any] | None = None,
        log: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.stack = stack
        self.workdir = workdir
        self.log = log
        self.cluster = LocalCluster(admission_plugins=ADMISSION_PLUGINS, base_dir=workdir)
        self.stand_ins: StandIns | None = None
        self._overrides = dict(overrides or {})
        self.engine: StackEngine | None = None
        """The harness engine; None when the real CLI applies the stack (tests/e2e/cli.py)."""
        self.cli: CliStack | None = None
        self.runtime: PodRuntime | None = None
        self.nodes: list[FakeNode] = inventory(stack)
        self.nodes_before: dict[str, dict[str, Any]] = {}
        self.kubeadm_config_before: dict[str, str] | None = None

    # -------------------------------------------------------------- lifecycle
    def start(self) -> AppliedStack:
        """Start the cluster, register the inventory's nodes, point the stack at the cluster."""
        self.cluster.start()
        try:
            self.cluster.add_nodes(self.nodes)
            self.nodes_before = self.node_state()
            secret_config = prerequisites(self.api_client(), self.stack)
            self.kubeadm_config_before = self.kubeadm_config()
            self.stand_ins = StandIns(chart_crds=chart_crds(self.cluster.api_client))
            context = stack_config(self.stack).get(f"{PROJECT}:kubeContext") or ""
            kubeconfig = self._kubeconfig(context or LOCAL_CONTEXT)
            overrides = {"kubeconfig": str(kubeconfig), **secret_config, **self._overrides}
            self.stand_ins.dynamic.config = stack_config(self.stack, overrides)
            if cli_mode():
                self.cli = CliStack(self.stack, self.workdir, overrides, set(secret_config))
            else:
                self.engine = StackEngine(
                    self.stack,
                    self.stand_ins,
                    overrides=overrides,
                    secret_keys=tuple(secret_config),
                    log=self.log,
                )
            self.runtime = PodRuntime(self.cluster, self.workdir / "pods")
        except BaseException:
            self.cluster.stop()
            raise
        return self

    def stop(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()
        self.cluster.stop()

    def _kubeconfig(self, context: str) -> Path:
        """The cluster's admin kubeconfig with its context named as the stack expects it."""
        document = yaml.safe_load(self.cluster.control_plane.kubeconfig_yaml())
        document["contexts"][0]["name"] = context
        document["current-context"] = context
        path = self.workdir / f"{self.stack}.kubeconfig"
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return path

    # ---------------------------------------------------------------- actions
    def up(self) -> list[Step]:
        """`pulumi up`, then the stack's pods run (scheduler, gate) as they would on nodes."""
        steps = self.cli.up() if self.cli is not None else self._engine.up()
        self.sync_pods()
        return steps

    def sync_pods(self) -> None:
        assert self.runtime is not None
        self.runtime.sync()

    def destroy(self) -> list[Step]:
        if self.runtime is not None:
            self.runtime.stop()
        return self.cli.destroy() if self.cli is not None else self._engine.destroy()

    # ---------------------------------------------------------------- queries
    @property
    def _engine(self) -> StackEngine:
        if self.engine is None:
            raise RuntimeError("stack not started")
        return self.engine

    @property
    def outputs(self) -> dict[str, Any]:
        return self.cli.outputs if self.cli is not None else self._engine.outputs

    def api_client(self) -> Any:
        return self.cluster.api_client()

    def kubeadm_config(self) -> dict[str, str] | None:
        """kube-system/kubeadm-config's data and annotations, or None where there is none."""
        core: Any = client.CoreV1Api(self.api_client())
        try:
            cm = core.read_namespaced_config_map("kubeadm-config", "kube-system")
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {**(cm.data or {}), **(cm.metadata.annotations or {})}

    def node_state(self) -> dict[str, dict[str, Any]]:
        return node_state(self.api_client(), [n.name for n in self.nodes])

    @property
    def gpu_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if "nvidia.com/gpu" in n.capacity]

    @property
    def cpu_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if "nvidia.com/gpu" not in n.capacity]
