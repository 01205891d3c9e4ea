"""Loads and validates the whole stack configuration.

The only module that reads Pulumi config. It turns the `gpu-cluster:*` keys of the selected
stack into frozen, typed dataclasses, or raises one `ConfigError` that lists every problem
found, each naming the key, the bad value and what is allowed. Nothing is declared in Pulumi
before this has succeeded, so a bad config never half-applies.

Top-level keys, their types and defaults are declared once, in Pulumi.yaml's `config:` block;
this module reads that block to know which keys exist. Fields inside object keys are defined
here, with their defaults, and documented in README.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pulumi
import yaml

from components.binpack_scheduler import (
    DEFAULT_SHAPE,
    DEFAULT_WEIGHTS,
    ResourceWeight,
    SchedulerProfile,
    ShapePoint,
)
from components.control_plane_features import (
    DEFAULT_STATE_DIR,
    RemoteHost,
    SshAccess,
    admission_plugins_for,
)
from components.gpu_operator import MIG_STRATEGIES, GpuOperatorChart, MigStrategy, TimeSlicing
from components.monitoring_stack import DEFAULT_REPOSITORY as MONITORING_REPOSITORY
from components.monitoring_stack import DEFAULT_VERSION as MONITORING_VERSION
from components.opa_gate import (
    ADMISSION_ENGINES,
    FAILURE_POLICIES,
    AdmissionEngine,
    FailurePolicy,
)
from components.tainted_gpu_pool import TAINT_EFFECTS, Taint, TaintEffect

PROJECT = "gpu-cluster"
PROJECT_FILE = Path(__file__).resolve().parent / "Pulumi.yaml"

# Kubernetes versions this project is tested against; others load with a warning.
SUPPORTED_MINORS = range(35, 38)

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUALIFIED_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_VERSION = re.compile(r"^v(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)$")
_CHART_VERSION = re.compile(r"^v?\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$")
_HELM_REPOSITORY = re.compile(r"^(https?|oci)://[^\s]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROMETHEUS_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_CAMEL_CASE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_SSH_USER = re.compile(r"^[a-z_][a-z0-9_.-]*$")

T = TypeVar("T")


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, kw_only=True)
class KubernetesAccessConfig:
    """How every layer reaches the cluster."""

    kubeconfig: str = ""
    """A kubeconfig path or the kubeconfig content; empty means $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """The kubeconfig context; None means its current-context."""


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """One node of the inventory."""

    name: str
    """The Kubernetes Node name."""
    address: str = ""
    """Address used to reach the host over SSH (layers that edit host files)."""


@dataclass(frozen=True, kw_only=True)
class GpuPoolConfig:
    """The GPU nodes, their taint and labels."""

    nodes: tuple[str, ...] = ()
    """Names of the GPU nodes (each in the inventory)."""
    taint: Taint = field(default_factory=Taint)
    """Taint put on every GPU node."""
    labels: Mapping[str, str] = field(default_factory=lambda: {"gpu-cluster.io/pool": "gpu"})
    """Labels put on every GPU node."""


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """The bin-packing kube-scheduler."""

    profile: SchedulerProfile = field(default_factory=SchedulerProfile)
    """Name, scoring shape, resource weights, percentageOfNodesToScore."""
    replicas: int = 2
    """Deployment replicas (leader-elected)."""

    @property
    def name(self) -> str:
        """Profile schedulerName that GPU pods must use."""
        return self.profile.scheduler_name


@dataclass(frozen=True, kw_only=True)
class AdmissionConfig:
    """The gate that keeps GPU pods on the binpack scheduler."""

    engine: AdmissionEngine = "opa"
    """opa (webhook) or validating-admission-policy (native CEL)."""
    failure_policy: FailurePolicy = "Fail"
    """Fail: a GPU pod is refused while the gate cannot answer. Ignore: admitted."""
    timeout_seconds: int = 5
    """Webhook timeout, 1..30 seconds."""
    replicas: int = 2
    """OPA replicas."""
    gate_extended_resources: bool = True
    """Also gate the extended resources this stack advertises."""


@dataclass(frozen=True, kw_only=True)
class ControlPlaneConfig:
    """Admission plugins and feature gates, set in kubeadm's configuration and applied by kubeadm."""

    enabled: bool = False
    """Build the ControlPlaneFeatures layer."""
    ssh: SshAccess = field(default_factory=lambda: SshAccess(user=""))
    """SSH user, port and private key (a pulumi.Output secret, or None for the SSH agent)."""
    hosts: tuple[RemoteHost, ...] = ()
    """Control-plane hosts, regenerated one at a time in this order (host keys pinned)."""
    kubelet_hosts: tuple[RemoteHost, ...] = ()
    """Hosts whose kubelet gets the feature gates (a kubeadm patch each), after the control plane."""
    admission_plugins: tuple[str, ...] = ()
    """Admission plugins to enable."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """Feature gates to set (checked against the live API server at preview)."""
    ready_timeout_seconds: int = 300
    """How long a restarted kubelet may take to be healthy before its old config is restored."""
    state_dir: str = DEFAULT_STATE_DIR
    """Directory on the hosts for each stack's kubelet patches and record."""


@dataclass(frozen=True, kw_only=True)
class GpuOperatorConfig(GpuOperatorChart):
    """The NVIDIA GPU Operator Helm release: the chart settings of components/gpu_operator.py."""

    enabled: bool = False
    """Build the GpuOperator layer (needs a reachable chart repository)."""


@dataclass(frozen=True, kw_only=True)
class MonitoringConfig:
    """kube-prometheus-stack, DCGM scraping, the GPU dashboard and alerts."""

    enabled: bool = False
    """Build the MonitoringStack layer (needs a reachable chart repository)."""
    namespace: str = "monitoring"
    """The stack's namespace."""
    repository: str = MONITORING_REPOSITORY
    """Helm repository URL."""
    version: str = MONITORING_VERSION
    """Chart version (pinned)."""
    grafana_admin_password: pulumi.Output[str] | None = field(default=None, repr=False)
    """Grafana admin password from gpu-cluster:grafanaAdminPassword, as a Pulumi secret."""
    grafana_admin_secret: str | None = None
    """Or the name of an existing Secret (keys admin-user, admin-password) in `namespace`."""
    dcgm_scrape_interval: str = "15s"
    """Scrape interval of the dcgm-exporter ServiceMonitor."""
    values: Mapping[str, Any] = field(default_factory=dict)
    """Free-form chart values, deep-merged last."""


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    """The whole validated stack configuration."""

    kubernetes: KubernetesAccessConfig
    kubernetes_version: str
    nodes: tuple[NodeConfig, ...]
    gpu_pool: GpuPoolConfig
    extended_resources: Mapping[str, Mapping[str, int]]
    """{node name: {extended resource name: count}}."""
    scheduler: SchedulerConfig
    admission: AdmissionConfig
    gpu_operator: GpuOperatorConfig = field(default_factory=GpuOperatorConfig)
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)
    control_plane: ControlPlaneConfig = field(default_factory=ControlPlaneConfig)
    warnings: tuple[str, ...] = ()
    """Non-fatal findings (e.g. an untested Kubernetes version) for the caller to log."""


@dataclass(frozen=True)
class Problem:
    """One invalid config value."""

    key: str
    value: Any
    allowed: str

    def __str__(self) -> str:
        return f"{PROJECT}:{self.key}: got {self.value!r}; {self.allowed}"


class ConfigError(pulumi.RunError, ValueError):
    """Raised with every problem found in the stack config (shown without a stack trace)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid stack config ({len(self.problems)} problem(s)):\n{lines}")


# --------------------------------------------------------------------------- name rules


def is_dns1123_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS1123_LABEL.match(value))


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(_DNS1123_SUBDOMAIN.match(value))


def is_qualified_name(value: str) -> bool:
    """Kubernetes qualified name: optional `dns-subdomain/` prefix, then a name part <= 63."""
    prefix, _, name = value.rpartition("/")
    if "/" in value and not (prefix and is_dns1123_subdomain(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME_PART.match(name))


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def extended_resource_name_problem(name: str) -> str | None:
    """Why `name` is not a valid extended resource name, or None when it is.

    # Ref: https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources
    """
    if name.startswith("requests."):
        return "must not start with 'requests.'"
    domain, sep, _ = name.partition("/")
    if not sep:
        return "must be 'domain/name', e.g. example.com/dongle"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved for native resources"
    if not is_qualified_name(name):
        return "must be a DNS subdomain, '/', then 1-63 alphanumerics, '-', '_' or '.'"
    return None


# --------------------------------------------------------------------------- reader


class _Reader:
    """Reads typed values out of decoded config while collecting problems."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, key: str, value: Any, allowed: str) -> None:
        self.problems.append(Problem(key, value, allowed))

    def obj(self, key: str, value: Any, fields: Sequence[str]) -> Mapping[str, Any]:
        """An object whose keys must all be in `fields`; unknown keys are problems."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.problem(key, value, "expected an object")
            return {}
        for name in value:
            if name not in fields:
                self.problem(
                    f"{key}.{name}", value[name], f"unknown key; allowed: {', '.join(fields)}"
                )
        return value

    def string(self, key: str, value: Any, default: str) -> str:
        if value is None:
            return default
        if not isinstance(value, str):
            self.problem(key, value, "expected a string")
            return default
        return value

    def checked(self, key: str, value: str, ok: Callable[[str], bool], allowed: str) -> str:
        if not ok(value):
            self.problem(key, value, allowed)
        return value

    def string_list(self, key: str, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(key, value, "expected a list of strings")
            return ()
        return tuple(value)

    def string_map(self, key: str, value: Any) -> dict[str, str]:
        if not isinstance(value, Mapping):
            self.problem(key, value, "expected an object of string values")
            return {}
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(v, str):
                self.problem(f"{key}.{k}", v, "expected a string")
            else:
                out[str(k)] = v
        return out

    def count(self, key: str, value: Any) -> int | None:
        """A non-negative integer (YAML int, not bool/float/str)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.problem(key, value, "expected a non-negative integer")
            return None
        return value

    def choice(self, key: str, value: Any, choices: Sequence[T], default: T) -> T:
        if value is None:
            return default
        if value not in choices:
            self.problem(key, value, f"allowed: {', '.join(map(str, choices))}")
            return default
        return cast(T, value)


# --------------------------------------------------------------------------- sections


def _kubernetes_version(r: _Reader, raw: Any, warnings: list[str]) -> str:
    version = r.string("kubernetesVersion", raw, "")
    match = _VERSION.match(version)
    if not match:
        r.problem("kubernetesVersion", raw, "expected vMAJOR.MINOR.PATCH, e.g. v1.37.2")
        return version
    major, minor = int(match["major"]), int(match["minor"])
    if major != 1 or minor not in SUPPORTED_MINORS:
        warnings.append(
            f"{PROJECT}:kubernetesVersion {version} is outside the tested range "
            f"v1.{SUPPORTED_MINORS.start}-v1.{SUPPORTED_MINORS.stop - 1}"
        )
    return version


def _nodes(r: _Reader, raw: Any) -> tuple[NodeConfig, ...]:
    if not isinstance(raw, list):
        r.problem("nodes", raw, "expected a list of {name, address}")
        return ()
    nodes: list[NodeConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        key = f"nodes[{i}]"
        entry = r.obj(key, item, ("name", "address"))
        if not entry:
            if not isinstance(item, Mapping):
                continue
            r.problem(f"{key}.name", None, "every node needs a name")
            continue
        name = r.string(f"{key}.name", entry.get("name"), "")
        address = r.string(f"{key}.address", entry.get("address"), "")
        if not is_dns1123_subdomain(name):
            r.problem(f"{key}.name", name, "expected a Kubernetes node name (DNS-1123 subdomain)")
            continue
        if name in seen:
            r.problem(f"{key}.name", name, "each node may be listed once; it is listed twice")
            continue
        seen.add(name)
        nodes.append(NodeConfig(name=name, address=address))
    return tuple(nodes)


def _node_refs(r: _Reader, key: str, names: Sequence[str], inventory: set[str]) -> tuple[str, ...]:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name not in inventory:
            r.problem(f"{key}[{i}]", name, "node is not in gpu-cluster:nodes")
        elif name in seen:
            r.problem(f"{key}[{i}]", name, "each node may be listed once; it is listed twice")
        seen.add(name)
    return tuple(names)


def _taint(r: _Reader, raw: Any) -> Taint:
    default = Taint()
    entry = r.obj("gpuPool.taint", raw, ("key", "value", "effect"))
    key = r.string("gpuPool.taint.key", entry.get("key"), default.key)
    value = r.string("gpuPool.taint.value", entry.get("value"), default.value)
    effect: TaintEffect = r.choice(
        "gpuPool.taint.effect", entry.get("effect"), TAINT_EFFECTS, default.effect
    )
    r.checked(
        "gpuPool.taint.key",
        key,
        is_qualified_name,
        "expected a qualified name, e.g. nvidia.com/gpu",
    )
    r.checked(
        "gpuPool.taint.value",
        value,
        is_label_value,
        "expected <= 63 alphanumerics, '-', '_' or '.'",
    )
    return Taint(key=key, value=value, effect=effect)


def _labels(r: _Reader, key: str, raw: Any, default: Mapping[str, str]) -> Mapping[str, str]:
    if raw is None:
        return default
    labels = r.string_map(key, raw)
    for name, value in labels.items():
        r.checked(f"{key}.{name}", name, is_qualified_name, "label key must be a qualified name")
        r.checked(
            f"{key}.{name}",
            value,
            is_label_value,
            "label value must be <= 63 alphanumerics, '-', '_' or '.'",
        )
    return labels


def _gpu_pool(r: _Reader, raw: Any, inventory: set[str]) -> GpuPoolConfig:
    entry = r.obj("gpuPool", raw, ("nodes", "taint", "labels"))
    default = GpuPoolConfig()
    nodes = _node_refs(
        r, "gpuPool.nodes", r.string_list("gpuPool.nodes", entry.get("nodes")), inventory
    )
    return GpuPoolConfig(
        nodes=nodes,
        taint=_taint(r, entry.get("taint")),
        labels=_labels(r, "gpuPool.labels", entry.get("labels"), default.labels),
    )


def _extended_resources(
    r: _Reader, raw: Any, inventory: set[str]
) -> Mapping[str, Mapping[str, int]]:
    if not isinstance(raw, Mapping):
        r.problem("extendedResources", raw, "expected {node-name: {domain/resource: count}}")
        return {}
    result: dict[str, dict[str, int]] = {}
    for node, resources in raw.items():
        key = f"extendedResources.{node}"
        if node not in inventory:
            r.problem(key, node, "node is not in gpu-cluster:nodes")
            continue
        if not isinstance(resources, Mapping) or not resources:
            r.problem(key, resources, "expected a non-empty {domain/resource: count}")
            continue
        counts: dict[str, int] = {}
        for name, quantity in resources.items():
            why = extended_resource_name_problem(str(name))
            if why:
                r.problem(f"{key}.{name}", name, f"not an extended resource name: {why}")
                continue
            count = r.count(f"{key}.{name}", quantity)
            if count is not None:
                counts[str(name)] = count
        result[str(node)] = counts
    return result


def _int_in(r: _Reader, key: str, value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        r.problem(key, value, f"expected an integer from {low} to {high}")
        return None
    return value


def _shape(r: _Reader, raw: Any) -> tuple[ShapePoint, ...]:
    if raw is None:
        return DEFAULT_SHAPE
    if not isinstance(raw, list) or len(raw) < 2:
        r.problem("scheduler.shape", raw, "expected at least two {utilization, score} points")
        return DEFAULT_SHAPE
    points: list[ShapePoint] = []
    for i, item in enumerate(raw):
        key = f"scheduler.shape[{i}]"
        entry = r.obj(key, item, ("utilization", "score"))
        utilization = _int_in(r, f"{key}.utilization", entry.get("utilization"), 0, 100)
        score = _int_in(r, f"{key}.score", entry.get("score"), 0, 10)
        if utilization is None or score is None:
            continue
        if points and utilization <= points[-1].utilization:
            r.problem(
                f"{key}.utilization",
                utilization,
                f"utilizations must strictly increase; previous is {points[-1].utilization}",
            )
            continue
        points.append(ShapePoint(utilization=utilization, score=score))
    return tuple(points)


def _weights(r: _Reader, raw: Any) -> tuple[ResourceWeight, ...]:
    if raw is None:
        return DEFAULT_WEIGHTS
    if not isinstance(raw, Mapping) or not raw:
        r.problem("scheduler.resourceWeights", raw, "expected {resource name: weight >= 1}")
        return DEFAULT_WEIGHTS
    weights: list[ResourceWeight] = []
    for name, weight in raw.items():
        key = f"scheduler.resourceWeights.{name}"
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            r.problem(key, weight, "expected an integer weight >= 1")
            continue
        weights.append(ResourceWeight(name=str(name), weight=weight))
    return tuple(weights)


def _scheduler(r: _Reader, raw: Any) -> SchedulerConfig:
    fields = ("name", "replicas", "shape", "resourceWeights", "percentageOfNodesToScore")
    entry = r.obj("scheduler", raw, fields)
    default = SchedulerConfig()
    name = r.string("scheduler.name", entry.get("name"), default.name)
    r.checked(
        "scheduler.name",
        name,
        is_dns1123_label,
        "expected a DNS-1123 label (lowercase alphanumerics and '-', <= 63)",
    )
    replicas = default.replicas
    if "replicas" in entry:
        replicas = _int_in(r, "scheduler.replicas", entry["replicas"], 1, 5) or default.replicas
    percentage = None
    if entry.get("percentageOfNodesToScore") is not None:
        percentage = _int_in(
            r, "scheduler.percentageOfNodesToScore", entry["percentageOfNodesToScore"], 0, 100
        )
    profile = SchedulerProfile(
        scheduler_name=name,
        shape=_shape(r, entry.get("shape")),
        resources=_weights(r, entry.get("resourceWeights")),
        percentage_of_nodes_to_score=percentage,
    )
    return SchedulerConfig(profile=profile, replicas=replicas)


def _admission(r: _Reader, raw: Any) -> AdmissionConfig:
    fields = ("engine", "failurePolicy", "timeoutSeconds", "replicas", "gateExtendedResources")
    entry = r.obj("admission", raw, fields)
    default = AdmissionConfig()
    engine: AdmissionEngine = r.choice(
        "admission.engine", entry.get("engine"), ADMISSION_ENGINES, default.engine
    )
    failure: FailurePolicy = r.choice(
        "admission.failurePolicy",
        entry.get("failurePolicy"),
        FAILURE_POLICIES,
        default.failure_policy,
    )
    timeout = default.timeout_seconds
    if "timeoutSeconds" in entry:
        timeout = _int_in(r, "admission.timeoutSeconds", entry["timeoutSeconds"], 1, 30) or timeout
    replicas = default.replicas
    if "replicas" in entry:
        replicas = _int_in(r, "admission.replicas", entry["replicas"], 1, 5) or replicas
    gate_extended = entry.get("gateExtendedResources", default.gate_extended_resources)
    if not isinstance(gate_extended, bool):
        r.problem("admission.gateExtendedResources", gate_extended, "expected true or false")
        gate_extended = default.gate_extended_resources
    return AdmissionConfig(
        engine=engine,
        failure_policy=failure,
        timeout_seconds=timeout,
        replicas=replicas,
        gate_extended_resources=gate_extended,
    )


_CONTROL_PLANE_FIELDS = (
    "enabled",
    "user",
    "port",
    "sshAgent",
    "hosts",
    "kubeletHosts",
    "hostKeys",
    "admissionPlugins",
    "featureGates",
    "readyTimeoutSeconds",
    "stateDir",
)
# An OpenSSH public key line: type, base64 blob, optional comment.
_HOST_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( .*)?$"
)
_ABSOLUTE_PATH = re.compile(r"^(/[A-Za-z0-9._-]+)+/?$")


def _bool(r: _Reader, key: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        r.problem(key, value, "expected true or false")
        return default
    return value


def _remote_hosts(
    r: _Reader,
    key: str,
    raw: Any,
    addresses: Mapping[str, str],
    host_keys: Mapping[str, str],
    enabled: bool,
) -> tuple[RemoteHost, ...]:
    names = _node_refs(r, key, r.string_list(key, raw), set(addresses))
    hosts: list[RemoteHost] = []
    for i, name in enumerate(names):
        if name in addresses and not addresses[name]:
            r.problem(
                f"{key}[{i}]", name, "node has no address in gpu-cluster:nodes; SSH needs one"
            )
        elif enabled and name in addresses and name not in host_keys:
            r.problem(
                f"{key}[{i}]",
                name,
                "no SSH host key in controlPlane.hostKeys; every host key is pinned "
                "(ssh-keyscan the host from a trusted network, or read /etc/ssh/*.pub on it)",
            )
        elif name in addresses and all(h.name != name for h in hosts):
            key_line = " ".join(host_keys.get(name, "").split()[:2])
            hosts.append(RemoteHost(name=name, address=addresses[name], host_key=key_line))
    return tuple(hosts)


def _host_keys(r: _Reader, raw: Any, inventory: Collection[str]) -> dict[str, str]:
    key = "controlPlane.hostKeys"
    if raw is None:
        return {}
    keys: dict[str, str] = {}
    for name, value in r.string_map(key, raw).items():
        if name not in inventory:
            r.problem(f"{key}.{name}", name, "node is not in gpu-cluster:nodes")
        elif not _HOST_KEY.match(value.strip()):
            r.problem(
                f"{key}.{name}",
                value,
                "expected an OpenSSH public key line (ssh-ed25519 AAAA..., ecdsa-sha2-nistp256 "
                "AAAA... or ssh-rsa AAAA...)",
            )
        else:
            keys[name] = value.strip()
    return keys


def _admission_plugins(r: _Reader, raw: Any, version: str, warnings: list[str]) -> tuple[str, ...]:
    key = "controlPlane.admissionPlugins"
    names = r.string_list(key, raw)
    if not names:
        return ()
    source, known = admission_plugins_for(version)
    if source.split(".")[:2] != version.split(".")[:2]:
        warnings.append(
            f"{key} checked against the plugins of kube-apiserver {source}: none generated "
            f"for {version} (python -m tools.admission_plugins --apiserver <its kube-apiserver>)"
        )
    plugins: list[str] = []
    for i, name in enumerate(names):
        if not _CAMEL_CASE.match(name):
            r.problem(f"{key}[{i}]", name, "expected a plugin name (letters and digits, CamelCase)")
        elif name not in known:
            r.problem(
                f"{key}[{i}]",
                name,
                f"unknown admission plugin in kube-apiserver {source}; allowed: {', '.join(known)}",
            )
        elif name in plugins:
            r.problem(f"{key}[{i}]", name, "each plugin may be listed once; it is listed twice")
        else:
            plugins.append(name)
    return tuple(plugins)


def _feature_gates(r: _Reader, raw: Any) -> dict[str, bool]:
    key = "controlPlane.featureGates"
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        r.problem(key, raw, "expected {GateName: true | false}")
        return {}
    gates: dict[str, bool] = {}
    for name, value in raw.items():
        if not _CAMEL_CASE.match(str(name)):
            r.problem(
                f"{key}.{name}",
                name,
                "expected a feature gate name in CamelCase, e.g. InPlacePodVerticalScaling",
            )
        elif not isinstance(value, bool):
            r.problem(f"{key}.{name}", value, "expected true or false")
        else:
            gates[str(name)] = value
    return gates


def _control_plane(
    r: _Reader,
    raw: Any,
    ssh_private_key: Any,
    nodes: Sequence[NodeConfig],
    version: str,
    warnings: list[str],
    secret_keys: Collection[str] | None = None,
) -> ControlPlaneConfig:
    entry = r.obj("controlPlane", raw, _CONTROL_PLANE_FIELDS)
    default = ControlPlaneConfig()
    addresses = {n.name: n.address for n in nodes}
    enabled = _bool(r, "controlPlane.enabled", entry.get("enabled"), default.enabled)
    user = r.string("controlPlane.user", entry.get("user"), "")
    if user and not _SSH_USER.match(user):
        r.problem(
            "controlPlane.user", user, "expected a user name (lowercase, digits, '_', '-', '.')"
        )
    port = 22
    if "port" in entry:
        port = _int_in(r, "controlPlane.port", entry["port"], 1, 65535) or port
    agent = _bool(r, "controlPlane.sshAgent", entry.get("sshAgent"), False)
    host_keys = _host_keys(r, entry.get("hostKeys"), set(addresses))
    hosts = _remote_hosts(
        r, "controlPlane.hosts", entry.get("hosts"), addresses, host_keys, enabled
    )
    kubelet_hosts = _remote_hosts(
        r, "controlPlane.kubeletHosts", entry.get("kubeletHosts"), addresses, host_keys, enabled
    )
    state_dir = r.string("controlPlane.stateDir", entry.get("stateDir"), default.state_dir)
    if not _ABSOLUTE_PATH.match(state_dir) or "/../" in f"{state_dir}/":
        r.problem(
            "controlPlane.stateDir",
            state_dir,
            "expected an absolute path of letters, digits, '.', '_' and '-'",
        )
    timeout = default.ready_timeout_seconds
    if "readyTimeoutSeconds" in entry:
        timeout = (
            _int_in(r, "controlPlane.readyTimeoutSeconds", entry["readyTimeoutSeconds"], 30, 1800)
            or timeout
        )
    key_text = r.string("sshPrivateKey", ssh_private_key, "")
    if key_text and "PRIVATE KEY-----" not in key_text:
        # The value is a secret: never echo it into an error message.
        r.problem(
            "sshPrivateKey",
            "[secret, not shown]",
            "expected a private key (-----BEGIN ... PRIVATE KEY-----)",
        )
    elif key_text and secret_keys is not None and "sshPrivateKey" not in secret_keys:
        # Pulumi.yaml cannot declare it `secret: true`: the CLI then rejects every stack that
        # leaves it unset (its "" default is plain text), including agent-only stacks.
        r.problem(
            "sshPrivateKey",
            "[plain text, not shown]",
            "must be stored encrypted: pulumi config set --secret gpu-cluster:sshPrivateKey < key",
        )
    if enabled:
        if not user:
            r.problem("controlPlane.user", user, "required when controlPlane.enabled is true")
        if not entry.get("hosts"):
            r.problem("controlPlane.hosts", [], "required when controlPlane.enabled is true")
        if not key_text and not agent:
            r.problem(
                "sshPrivateKey",
                "",
                "required when controlPlane.enabled is true (pulumi config set --secret "
                "gpu-cluster:sshPrivateKey < key), unless controlPlane.sshAgent is true",
            )
    # Wrapped at once, so the key only ever exists here as a Pulumi secret.
    private_key = pulumi.Output.secret(key_text) if key_text else None
    return ControlPlaneConfig(
        enabled=enabled,
        ssh=SshAccess(user=user, port=port, private_key=private_key),
        hosts=hosts,
        kubelet_hosts=kubelet_hosts,
        admission_plugins=_admission_plugins(r, entry.get("admissionPlugins"), version, warnings),
        feature_gates=_feature_gates(r, entry.get("featureGates")),
        ready_timeout_seconds=timeout,
        state_dir=state_dir,
    )


_GPU_OPERATOR_FIELDS = (
    "enabled",
    "namespace",
    "repository",
    "version",
    "driver",
    "toolkit",
    "devicePlugin",
    "mig",
    "migManager",
    "dcgmExporter",
    "nfd",
    "operator",
    "values",
)
_MONITORING_FIELDS = (
    "enabled",
    "namespace",
    "repository",
    "version",
    "grafanaAdminSecret",
    "dcgmScrapeInterval",
    "values",
)


def _switch(r: _Reader, key: str, raw: Any, field_name: str, default: bool) -> bool:
    """`{<field_name>: bool}` objects such as gpuOperator.driver: {enabled: false}."""
    entry = r.obj(key, raw, (field_name,))
    return _bool(r, f"{key}.{field_name}", entry.get(field_name), default)


def _chart_source(r: _Reader, key: str, entry: Mapping[str, Any], defaults: Any) -> tuple[str, str]:
    repository = r.string(f"{key}.repository", entry.get("repository"), defaults.repository)
    r.checked(
        f"{key}.repository",
        repository,
        lambda v: bool(_HELM_REPOSITORY.match(v)),
        "expected a Helm repository URL (https://..., http://... or oci://...)",
    )
    version = r.string(f"{key}.version", entry.get("version"), defaults.version)
    r.checked(
        f"{key}.version",
        version,
        lambda v: bool(_CHART_VERSION.match(v)),
        f"expected a pinned chart version, e.g. {defaults.version}",
    )
    return repository, version


def _namespace(r: _Reader, key: str, raw: Any, default: str) -> str:
    name = r.string(key, raw, default)
    r.checked(key, name, is_dns1123_label, "expected a namespace name (DNS-1123 label)")
    return name


def _free_values(r: _Reader, key: str, raw: Any) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        r.problem(key, raw, "expected an object of chart values")
        return {}
    return raw


def _toolkit_env(r: _Reader, raw: Any) -> dict[str, str]:
    key = "gpuOperator.toolkit.env"
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        r.problem(key, raw, "expected {NAME: value}")
        return {}
    env: dict[str, str] = {}
    for name, value in raw.items():
        if not _ENV_NAME.match(str(name)):
            r.problem(
                f"{key}.{name}",
                name,
                "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
            )
        elif isinstance(value, bool):
            env[str(name)] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            env[str(name)] = str(value)
        else:
            r.problem(
                f"{key}.{name}", value, "expected a string (numbers and booleans become strings)"
            )
    return env


def _time_slicing(r: _Reader, raw: Any) -> TimeSlicing | None:
    key = "gpuOperator.devicePlugin"
    entry = r.obj(key, raw, ("timeSlicing",))
    if entry.get("timeSlicing") is None:
        return None
    key = f"{key}.timeSlicing"
    sharing = r.obj(key, entry["timeSlicing"], ("replicas", "renameByDefault"))
    replicas = _int_in(r, f"{key}.replicas", sharing.get("replicas"), 2, 64)
    rename = _bool(r, f"{key}.renameByDefault", sharing.get("renameByDefault"), False)
    return TimeSlicing(replicas=replicas, rename_by_default=rename) if replicas else None


def _gpu_operator(r: _Reader, raw: Any) -> GpuOperatorConfig:
    entry = r.obj("gpuOperator", raw, _GPU_OPERATOR_FIELDS)
    default = GpuOperatorConfig()
    repository, version = _chart_source(r, "gpuOperator", entry, default)
    toolkit = r.obj("gpuOperator.toolkit", entry.get("toolkit"), ("enabled", "env"))
    mig = r.obj("gpuOperator.mig", entry.get("mig"), ("strategy",))
    strategy: MigStrategy = r.choice(
        "gpuOperator.mig.strategy", mig.get("strategy"), MIG_STRATEGIES, default.mig_strategy
    )
    time_slicing = _time_slicing(r, entry.get("devicePlugin"))
    if time_slicing is not None and strategy == "mixed":
        r.problem(
            "gpuOperator.mig.strategy",
            strategy,
            "time-slicing shares nvidia.com/gpu, which needs mig.strategy none or single",
        )
    return GpuOperatorConfig(
        enabled=_bool(r, "gpuOperator.enabled", entry.get("enabled"), default.enabled),
        namespace=_namespace(r, "gpuOperator.namespace", entry.get("namespace"), default.namespace),
        repository=repository,
        version=version,
        driver_enabled=_switch(r, "gpuOperator.driver", entry.get("driver"), "enabled", True),
        toolkit_enabled=_bool(r, "gpuOperator.toolkit.enabled", toolkit.get("enabled"), True),
        toolkit_env=_toolkit_env(r, toolkit.get("env")),
        time_slicing=time_slicing,
        mig_strategy=strategy,
        mig_manager_enabled=_switch(
            r, "gpuOperator.migManager", entry.get("migManager"), "enabled", True
        ),
        dcgm_exporter_enabled=_switch(
            r, "gpuOperator.dcgmExporter", entry.get("dcgmExporter"), "enabled", True
        ),
        nfd_enabled=_switch(r, "gpuOperator.nfd", entry.get("nfd"), "enabled", True),
        upgrade_crd=_switch(r, "gpuOperator.operator", entry.get("operator"), "upgradeCRD", True),
        values=_free_values(r, "gpuOperator.values", entry.get("values")),
    )


def _monitoring(
    r: _Reader, raw: Any, password: Any, secret_keys: Collection[str] | None = None
) -> MonitoringConfig:
    entry = r.obj("monitoring", raw, _MONITORING_FIELDS)
    default = MonitoringConfig()
    enabled = _bool(r, "monitoring.enabled", entry.get("enabled"), default.enabled)
    repository, version = _chart_source(r, "monitoring", entry, default)
    existing = r.string("monitoring.grafanaAdminSecret", entry.get("grafanaAdminSecret"), "")
    if existing and not is_dns1123_subdomain(existing):
        r.problem(
            "monitoring.grafanaAdminSecret", existing, "expected a Secret name (DNS-1123 subdomain)"
        )
    interval = r.string(
        "monitoring.dcgmScrapeInterval",
        entry.get("dcgmScrapeInterval"),
        default.dcgm_scrape_interval,
    )
    r.checked(
        "monitoring.dcgmScrapeInterval",
        interval,
        lambda v: bool(_PROMETHEUS_DURATION.match(v)),
        "expected a Prometheus duration, e.g. 15s or 1m",
    )
    if password is not None and not isinstance(password, str):
        r.problem("grafanaAdminPassword", "[secret, not shown]", "expected a string")
        password = ""
    password = password or ""
    if password and secret_keys is not None and "grafanaAdminPassword" not in secret_keys:
        # Not declared `secret: true` in Pulumi.yaml (see there), so checked here instead.
        r.problem(
            "grafanaAdminPassword",
            "[plain text, not shown]",
            "must be stored encrypted: pulumi config set --secret gpu-cluster:grafanaAdminPassword",
        )
    if enabled and not password and not existing:
        r.problem(
            "grafanaAdminPassword",
            "",
            "required when monitoring.enabled is true (pulumi config set --secret "
            "gpu-cluster:grafanaAdminPassword), unless monitoring.grafanaAdminSecret names an "
            "existing Secret",
        )
    if password and existing:
        r.problem(
            "monitoring.grafanaAdminSecret",
            existing,
            "set either grafanaAdminPassword or monitoring.grafanaAdminSecret, not both",
        )
    return MonitoringConfig(
        enabled=enabled,
        namespace=_namespace(r, "monitoring.namespace", entry.get("namespace"), default.namespace),
        repository=repository,
        version=version,
        # Wrapped at once, so the password only ever exists here as a Pulumi secret.
        grafana_admin_password=pulumi.Output.secret(password) if password else None,
        grafana_admin_secret=existing or None,
        dcgm_scrape_interval=interval,
        values=_free_values(r, "monitoring.values", entry.get("values")),
    )


def _one_dcgm_service_monitor(
    r: _Reader, gpu: GpuOperatorConfig, monitoring: MonitoringConfig
) -> None:
    """MonitoringStack owns the only dcgm-exporter ServiceMonitor; the chart's must stay off."""
    chart_monitor = gpu.values.get("dcgmExporter", {})
    chart_monitor = (
        chart_monitor.get("serviceMonitor", {}) if isinstance(chart_monitor, Mapping) else {}
    )
    enabled = chart_monitor.get("enabled") if isinstance(chart_monitor, Mapping) else None
    if enabled is True and monitoring.enabled:
        r.problem(
            "gpuOperator.values.dcgmExporter.serviceMonitor.enabled",
            enabled,
            "MonitoringStack already creates the one ServiceMonitor for dcgm-exporter; "
            "leave this unset",
        )


# --------------------------------------------------------------------------- entry points


def declared_keys(project_file: Path = PROJECT_FILE) -> Mapping[str, Mapping[str, Any]]:
    """The `config:` block of Pulumi.yaml: {key: {type, default, description}}."""
    document = yaml.safe_load(project_file.read_text())
    return cast(Mapping[str, Mapping[str, Any]], document.get("config") or {})


def parse_stack_config(
    values: Mapping[str, Any],
    project_file: Path = PROJECT_FILE,
    secret_keys: Collection[str] | None = None,
) -> StackConfig:
    """Validate decoded config values ({key without namespace: value}).

    Keys missing from `values` take their Pulumi.yaml default. `secret_keys` (keys without
    namespace that the stack stores encrypted) is checked when given: secrets set in plain text
    are rejected.
    """
    declared = declared_keys(project_file)
    r = _Reader()
    for key, value in values.items():
        if key not in declared:
            r.problem(key, value, f"unknown key; declared keys: {', '.join(declared)}")
    merged = {key: values.get(key, spec.get("default")) for key, spec in declared.items()}

    warnings: list[str] = []
    context = r.string("kubeContext", merged["kubeContext"], "")
    access = KubernetesAccessConfig(
        kubeconfig=r.string("kubeconfig", merged["kubeconfig"], ""), context=context or None
    )
    version = _kubernetes_version(r, merged["kubernetesVersion"], warnings)
    nodes = _nodes(r, merged["nodes"])
    inventory = {n.name for n in nodes}
    gpu_pool = _gpu_pool(r, merged["gpuPool"], inventory)
    extended = _extended_resources(r, merged["extendedResources"], inventory)
    scheduler = _scheduler(r, merged["scheduler"])
    admission = _admission(r, merged["admission"])
    gpu_operator = _gpu_operator(r, merged["gpuOperator"])
    monitoring = _monitoring(r, merged["monitoring"], merged["grafanaAdminPassword"], secret_keys)
    _one_dcgm_service_monitor(r, gpu_operator, monitoring)
    control_plane = _control_plane(
        r, merged["controlPlane"], merged["sshPrivateKey"], nodes, version, warnings, secret_keys
    )
    if r.problems:
        raise ConfigError(r.problems)
    return StackConfig(
        kubernetes=access,
        kubernetes_version=version,
        nodes=nodes,
        gpu_pool=gpu_pool,
        extended_resources=extended,
        scheduler=scheduler,
        admission=admission,
        gpu_operator=gpu_operator,
        monitoring=monitoring,
        control_plane=control_plane,
        warnings=tuple(warnings),
    )


def decode_raw_config(raw: Mapping[str, str], project_file: Path = PROJECT_FILE) -> dict[str, Any]:
    """Decode Pulumi's string-valued config map ({"gpu-cluster:key": "..."}).

    Object and array values arrive as JSON text; strings stay as they are.
    """
    declared = declared_keys(project_file)
    values: dict[str, Any] = {}
    for full_key, text in raw.items():
        namespace, _, key = full_key.partition(":")
        if namespace != PROJECT:
            continue
        kind = declared.get(key, {}).get("type")
        if kind == "string" or not isinstance(text, str):
            values[key] = text
            continue
        try:
            values[key] = json.loads(text)
        except json.JSONDecodeError:
            values[key] = text
    return values


def load_stack_config() -> StackConfig:
    """Read and validate the selected stack's config from the Pulumi runtime."""
    from pulumi.runtime.config import (
        CONFIG,
        get_config_env,
        get_config_secret_keys_env,
        is_config_secret,
    )

    raw = {**get_config_env(), **CONFIG.get()}
    secret = {k for k in raw if is_config_secret(k)} | set(get_config_secret_keys_env())
    keys = {k.partition(":")[2] for k in secret if k.startswith(f"{PROJECT}:")}
    return parse_stack_config(decode_raw_config(raw), secret_keys=keys)
