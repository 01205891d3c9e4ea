"""One stack applied to its own local cluster: the cluster, the real engine, the pods' processes.

Used by the scenarios (tests/e2e), `make demo` (tools/demo.py) and bench/local_stack.py:

    with AppliedStack("local", workdir) as applied:
        applied.up()          # `pulumi up` of the whole program, then the pods run
        ...                   # scenarios: pods, admission, scheduling
        applied.destroy()     # `pulumi destroy`

The program runs under the real Pulumi engine with the real kubernetes provider
(tools/harness/pulumi_engine.py: `ProjectStack`); its Helm releases install local charts
(charts.py); the SSH commands of ControlPlaneFeatures are recorded by the command stand-in,
since the stacks' hosts do not exist here.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic
from pulumi import automation as auto

from components.binpack_scheduler.settings import BinpackSchedulerSettings
from components.monitoring_stack.manifests import grafana_secret_prerequisites
from components.monitoring_stack.settings import MonitoringStackSettings
from tools.harness import dra
from tools.harness.charts import CHART_CRDS, chart_overrides
from tools.harness.child_process import Lifecycle
from tools.harness.cluster import CLUSTER_TOOLS, LocalCluster, items_flag
from tools.harness.fake_nodes import FakeNode, cpu_node, gpu_node
from tools.harness.pulumi_engine import (
    COMMAND_RECORD_VARIABLE,
    WHOLE_PROGRAM_TOOLS,
    ProjectStack,
)
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.tools import require_tool
from tools.harness.workloads import PodRuntime

# Everything an applied stack runs: the cluster, kubeadm (its defaults stand for kubeadm's
# ClusterConfiguration), the binpack scheduler built from scheduler/, the monitoring CRDs the
# local chart carries, the engine and the kubernetes provider.
STACK_TOOLS = (
    *CLUSTER_TOOLS,
    "kubeadm",
    "gpu-binpack-scheduler",
    *CHART_CRDS,
    *WHOLE_PROGRAM_TOOLS,
)

# What ControlPlaneFeatures turns on in the real clusters' API servers: the admission plugin,
# and the feature gate and API version gang scheduling needs (scheduler.gangScheduling), so
# the local cluster serves PodGroups whichever stack runs on it.
ADMISSION_PLUGINS = ("ExtendedResourceToleration",)
GANG_NEEDS = BinpackSchedulerSettings(gang_scheduling=True).control_plane_needs
GANG_APISERVER_FLAGS = (
    *items_flag("--feature-gates", GANG_NEEDS.feature_gates),
    *items_flag("--runtime-config", GANG_NEEDS.runtime_config),
)
"""The API server flags of what gangs need, as a test's control plane passes them."""
LOCAL_CONTEXT = "local"
DRA_GPUS = 4
"""GPUs per pool node the DRA driver stand-in publishes (as many as the counted nodes have)."""


class StackError(RuntimeError):
    """A `pulumi` command failed; the message is what the CLI printed."""


def inventory(
    stack: str, gpus: int = 4, overrides: Mapping[str, Any] | None = None
) -> list[FakeNode]:
    """The stack's node inventory as fake nodes: the GPU pool's nodes with `gpus` GPUs each,
    counted in allocatable as the device plugin advertises them, or none there when the stack
    allocates GPUs with DRA (dra_gpus(): the driver publishes them)."""
    values = stack_config(stack, overrides)
    nodes = values.get("nodes") or []
    pool = set((values.get("gpuPool") or {}).get("nodes") or [])
    gpu = dra.dra_node if dra_allocation(values) else (lambda name: gpu_node(name, gpus))
    return [gpu(node["name"]) if node["name"] in pool else cpu_node(node["name"]) for node in nodes]


def dra_allocation(values: Mapping[str, Any]) -> bool:
    """Whether a stack config's GPUs are DRA devices (gpuOperator.allocation dra)."""
    operator = values.get("gpuOperator") or {}
    return bool(operator.get("enabled")) and operator.get("allocation") == "dra"


def _section(stack: str, key: str) -> dict[str, Any]:
    value = stack_config(stack).get(key)
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


def prerequisites(api_client: Any, stack: str, *, create: bool = True) -> dict[str, str]:
    """What the README asks a user to create before `pulumi up`; returns secret config values.

    With `create` false (a second stack on a cluster that has them) only the secrets.

    The cluster was made by kubeadm: kube-system/kubeadm-config holds its ClusterConfiguration
    (ControlPlaneFeatures edits it).

    With `monitoring.grafanaAdminSecret`, that Secret (made by hand or by a secret store) and
    its namespace exist beforehand. Without it, the password is a stack secret: the harness
    sets one, as `pulumi config set --secret <project>:grafanaAdminPassword` would.
    """
    core: Any = client.CoreV1Api(api_client)
    if create and _section(stack, "controlPlane").get("enabled"):
        version = stack_config(stack).get("kubernetesVersion") or ""
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
    if not create:  # another stack on this cluster made them
        return {}
    namespace = monitoring.get("namespace") or MonitoringStackSettings().namespace
    namespace_object, secret_object = grafana_secret_prerequisites(namespace, secret, password)
    core.create_namespace(namespace_object)
    core.create_namespaced_secret(namespace, secret_object)
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
    """A local cluster with `stack`'s nodes, and the stack that `pulumi up` applies to it."""

    def __init__(
        self,
        stack: str,
        workdir: Path,
        *,
        overrides: Mapping[str, Any] | None = None,
        log: Callable[[str], None] = lambda _line: None,
        cluster: LocalCluster | None = None,
        name: str | None = None,
    ) -> None:
        self.stack = stack
        self.name = name or stack
        """The Pulumi stack's name (another stack of the same file may share the cluster)."""
        self.workdir = workdir
        self.log = log
        self._own_cluster = cluster is None
        self.cluster = cluster or LocalCluster(
            admission_plugins=ADMISSION_PLUGINS,
            feature_gates=GANG_NEEDS.feature_gates,
            runtime_config=GANG_NEEDS.runtime_config,
            base_dir=workdir,
        )
        self.overrides = dict(overrides or {})
        self.pulumi: ProjectStack | None = None
        self.runtime: PodRuntime | None = None
        self.nodes: list[FakeNode] = inventory(stack, overrides=self.overrides)
        self.dra_gpus: dict[str, int] = (
            {name: DRA_GPUS for name in _section(stack, "gpuPool").get("nodes") or []}
            if dra_allocation(stack_config(stack, self.overrides))
            else {}
        )
        """With DRA allocation, the GPUs the driver stand-in publishes per pool node."""
        self.nodes_before: dict[str, dict[str, Any]] = {}
        self.kubeadm_config_before: dict[str, str] | None = None
        self.commands_file = workdir / "commands.jsonl"
        """Where the command stand-in records the SSH commands (the hosts do not exist)."""
        self.charts_dir = workdir / "charts"

    # -------------------------------------------------------------- lifecycle
    def start(self) -> AppliedStack:
        """Start the cluster, register the inventory's nodes, create the stack for it."""
        if self._own_cluster:
            self.cluster.start()
        try:
            if self._own_cluster:
                self.cluster.add_nodes(self.nodes)
            self.nodes_before = self.node_state()
            secrets = prerequisites(self.api_client(), self.stack, create=self._own_cluster)
            self.kubeadm_config_before = self.kubeadm_config()
            context = stack_config(self.stack).get("kubeContext") or ""
            secrets["kubeconfig"] = self._kubeconfig(context or LOCAL_CONTEXT)
            config = stack_config(self.stack, self.overrides)
            # The releases' sections as overridden, pointed at the local charts.
            self.overrides = {**self.overrides, **chart_overrides(self.charts_dir, config)}
            self.pulumi = ProjectStack(
                self.name,
                self.workdir / "pulumi",
                overrides=self.overrides,
                secrets=secrets,
                env={COMMAND_RECORD_VARIABLE: str(self.commands_file)},
                stack_file=self.stack,
                log=self.log,
            )
            self.runtime = PodRuntime(self.cluster, self.workdir / "pods")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()
        if self._own_cluster:
            self.cluster.stop()

    def _kubeconfig(self, context: str) -> str:
        """The cluster's admin kubeconfig with its context named as the stack expects it."""
        document = yaml.safe_load(self.cluster.control_plane.kubeconfig_yaml())
        document["contexts"][0]["name"] = context
        document["current-context"] = context
        return yaml.safe_dump(document)

    # ---------------------------------------------------------------- actions
    def set_config(self, changes: Mapping[str, Any] | None = None) -> None:
        """The stack file as started (committed file, local charts, overrides) plus `changes`:
        what a user edits in Pulumi.<stack>.yaml before the next `pulumi up`."""
        self.engine.write_config(self.stack, {**self.overrides, **(changes or {})})

    @property
    def engine(self) -> ProjectStack:
        if self.pulumi is None:
            raise RuntimeError("stack not started")
        return self.pulumi

    def _pulumi(self, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except auto.errors.CommandError as exc:
            raise StackError(str(exc)) from exc

    def up(self, **kwargs: Any) -> list[tuple[str, str]]:
        """`pulumi up`, then the stack's pods run (scheduler, gate) as they would on nodes.

        Returns (op, URN) of every resource the run changed.
        """
        self._pulumi(lambda: self.engine.up(**kwargs))
        if self.dra_gpus:
            # The operator's release is in: its DRA driver installs its DeviceClasses and its
            # kubelet plugins publish each node's GPUs.
            dra.publish(self.api_client(), self.dra_gpus)
        self.sync_pods()
        return self.engine.changes()

    def preview(self, **kwargs: Any) -> list[tuple[str, str]]:
        """`pulumi preview --diff`: (op, URN) of every resource it would change."""
        self._pulumi(lambda: self.engine.preview(**kwargs))
        return self.engine.changes()

    def recover(self) -> list[str]:
        """After an interrupted `pulumi up`, what README.md ("An interrupted `pulumi up`") says
        to run; returns what it did."""
        done = []
        stacks = self.engine.state_dir / "backend" / ".pulumi" / "stacks"
        for attrs in stacks.rglob("*.attrs"):
            if attrs.stat().st_size == 0:
                attrs.unlink()
                done.append(f"removed empty {attrs.name}")
        try:
            self.engine.cli("cancel", "--yes")
            done.append("pulumi cancel")
        except subprocess.CalledProcessError as exc:
            done.append(f"pulumi cancel: {exc.stderr.strip()}")
        self._pulumi(lambda: self.engine.refresh(clear_pending_creates=True))
        done.append("pulumi refresh --clear-pending-creates")
        return done

    def refresh(self) -> None:
        self._pulumi(self.engine.refresh)

    def sync_pods(self) -> None:
        assert self.runtime is not None
        self.runtime.sync()

    def destroy(self, **kwargs: Any) -> list[tuple[str, str]]:
        """`pulumi destroy`; the stack's pod processes stop first, as the pods go."""
        if self.runtime is not None:
            self.runtime.stop()
        self._pulumi(lambda: self.engine.destroy(**kwargs))
        if self.dra_gpus:  # the driver went with the operator's release
            dra.withdraw(self.api_client())
        return self.engine.changes()

    # ---------------------------------------------------------------- queries
    @property
    def outputs(self) -> dict[str, Any]:
        return self.engine.outputs()

    def recorded_commands(self) -> list[dict[str, Any]]:
        """The SSH commands the command stand-in recorded, in order."""
        if not self.commands_file.exists():
            return []
        lines = self.commands_file.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def api_client(self) -> Any:
        return self.cluster.api_client()

    def kubernetes_objects(self) -> list[dict[str, Any]]:
        """The Kubernetes objects the stack's state says it created (not Helm's, not patches):
        apiVersion, kind, name and namespace of each."""
        found = []
        for resource in self.engine.resources():
            kind = resource["type"]
            if not kind.startswith("kubernetes:") or kind.endswith(("Patch", ":Release")):
                continue
            outputs = resource.get("outputs") or {}
            if "apiVersion" in outputs and "metadata" in outputs:
                metadata = outputs["metadata"]
                found.append(
                    {
                        "apiVersion": outputs["apiVersion"],
                        "kind": outputs["kind"],
                        "name": metadata["name"],
                        "namespace": metadata.get("namespace"),
                    }
                )
        return found

    def exists(self, obj: Mapping[str, Any]) -> bool:
        """Whether the object (as kubernetes_objects() names it) is on the cluster."""
        api = dynamic.DynamicClient(self.api_client())
        resource = api.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        try:
            resource.get(name=obj["name"], namespace=obj["namespace"])
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

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
        return [
            n.name for n in self.nodes if "nvidia.com/gpu" in n.capacity or n.name in self.dra_gpus
        ]
