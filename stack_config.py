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
from collections.abc import Callable, Mapping, Sequence
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
SUPPORTED_MINORS = range(33, 36)

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUALIFIED_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_VERSION = re.compile(r"^v(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)$")

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
        r.problem("kubernetesVersion", raw, "expected vMAJOR.MINOR.PATCH, e.g. v1.34.4")
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


# --------------------------------------------------------------------------- entry points


def declared_keys(project_file: Path = PROJECT_FILE) -> Mapping[str, Mapping[str, Any]]:
    """The `config:` block of Pulumi.yaml: {key: {type, default, description}}."""
    document = yaml.safe_load(project_file.read_text())
    return cast(Mapping[str, Mapping[str, Any]], document.get("config") or {})


def parse_stack_config(values: Mapping[str, Any], project_file: Path = PROJECT_FILE) -> StackConfig:
    """Validate decoded config values ({key without namespace: value}).

    Keys missing from `values` take their Pulumi.yaml default.
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
    from pulumi.runtime.config import CONFIG, get_config_env

    raw = {**get_config_env(), **CONFIG.get()}
    return parse_stack_config(decode_raw_config(raw))
