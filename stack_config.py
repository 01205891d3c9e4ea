"""Loads and validates the whole stack configuration.

The only module that reads Pulumi config. The `gpu-cluster:*` keys of the selected stack are
validated by one model, `StackConfig`, whose sections are the layers' own settings models
(components/<layer>/settings.py), or rejected with one `ConfigError` that lists every problem found, each
naming the key, the bad value and what is allowed (components/settings.py). Nothing is declared
in Pulumi before this has succeeded, so a bad config never half-applies.

The models are the one home of every key, rule and default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Self

import pulumi
from pydantic import Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import core_schema

from components.binpack_scheduler.settings import (
    GANG_GROUP_VERSION,
    GANG_MIN_MINOR,
    BinpackSchedulerSettings,
)
from components.cluster_access import LayerSection
from components.control_plane_features.settings import ControlPlaneSettings
from components.extended_resource_nodes.settings import ExtendedResourceNodesSettings
from components.gpu_operator.settings import CHART as GPU_OPERATOR_CHART
from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_priority_classes.settings import GpuPriorityClassesSettings
from components.inventory import Inventory
from components.kubeconfig import (
    KubernetesAccessConfig,
    kubeconfig_content,
    kubeconfig_document,
)
from components.kubernetes_version import major_minor
from components.monitoring_stack.settings import CHART as MONITORING_CHART
from components.monitoring_stack.settings import MonitoringStackSettings
from components.opa_gate.settings import (
    ADMISSION_ENGINES,
    DEFAULT_GATE_NAMESPACE,
    ROUTING_ENGINE,
    ROUTING_MIN_MINOR,
    OpaGateSettings,
    claim_lookup_problem,
    operator_conflict_problem,
    pool_resources,
    pool_toleration_problem,
    server_toleration_resource,
)
from components.settings import (
    BOOL,
    NOT_SHOWN,
    PLAIN_TEXT_SHOWN,
    PROJECT,
    STRING,
    ConfigError,
    ContextRule,
    Layer,
    Problem,
    Rule,
    Settings,
    context_value,
    format_problems,
    problem,
    text,
)
from components.tainted_gpu_pool.settings import TaintedGpuPoolSettings

__all__ = [
    "PROJECT",
    "ConfigError",
    "Problem",
    "SchedulerConfig",
    "StackConfig",
    "decode_raw_config",
    "load_stack_config",
    "parse_stack_config",
]

# Kubernetes versions this project is tested against; others load with a warning.
SUPPORTED_MINORS = range(35, 38)
DEFAULT_KUBERNETES_VERSION = "v1.37.2"

_VERSION = re.compile(r"v[0-9]+\.[0-9]+\.[0-9]+", re.ASCII)

# Keys whose values are never shown in a message, whatever the stack stores them as.
ALWAYS_SECRET = frozenset({"sshPrivateKey", "grafanaAdminPassword"})

# Kept for code that names the scheduler section by its earlier name.
SchedulerConfig = BinpackSchedulerSettings


# --------------------------------------------------------------------------- rules


def _kubernetes_version_ok(value: str) -> bool:
    return _VERSION.fullmatch(value) is not None and (major_minor(value) or (0, 0))[0] == 1


KUBERNETES_VERSION = text(
    _kubernetes_version_ok,
    "expected vMAJOR.MINOR.PATCH with major version 1, e.g. v1.37.2",
)


@dataclass(frozen=True)
class SecretText(ContextRule):
    """A top-level key that holds a secret: never shown, rejected when stored in plain text,
    and kept only as a Pulumi secret Output (None when empty)."""

    key: str
    how: str
    check: Rule | None = None

    def validate(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise problem("expected a string")
        if self.check is not None:
            self.check.validate(value)
        secret_keys = context_value(info, "secret_keys")
        if secret_keys is not None and self.key not in secret_keys:
            raise problem(f"must be stored encrypted: {self.how}", value=PLAIN_TEXT_SHOWN)
        # Wrapped at once, so the value only ever exists here as a Pulumi secret.
        return pulumi.Output.secret(value)


@dataclass(frozen=True)
class Kubeconfig(ContextRule):
    """A kubeconfig path (which must exist) or kubeconfig content (which must be a secret)."""

    def validate(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        if not isinstance(value, str):
            raise problem("expected a string")
        if "\n" in value:
            secret_keys = context_value(info, "secret_keys")
            if secret_keys is not None and "kubeconfig" not in secret_keys:
                raise problem(
                    "kubeconfig content must be stored encrypted: "
                    f"pulumi config set --secret {PROJECT}:kubeconfig < kubeconfig",
                    value=PLAIN_TEXT_SHOWN,
                )
            return value
        if value and not Path(value).expanduser().is_file():
            raise problem(
                "no such file; expected the path of a kubeconfig file, or empty for "
                "$KUBECONFIG or ~/.kube/config"
            )
        if value and not isinstance(kubeconfig_document(value), Mapping):
            raise problem("expected a kubeconfig (a YAML object with clusters, contexts, users)")
        return value


# --------------------------------------------------------------------------- sections


# --------------------------------------------------------------------------- cross-section rules


def _pool_toleration_facts(config: StackConfig) -> dict[str, Any]:
    """What the rules on the pool's toleration read from `config`: the engine, the admission
    plugins the stack enables (none unless controlPlane.enabled), the pool's taint and what
    the pool advertises (components/opa_gate/settings.py, pool_resources())."""
    names, prefixes = pool_resources(
        config.scheduler.gpu_resources_with(config.gpu_operator.gpu_resources()),
        config.extended_resources,
        config.gpu_pool.nodes,
        gate_extended_resources=config.admission.gate_extended_resources,
    )
    return {
        "engine": config.admission.engine,
        "admission_plugins": (
            config.control_plane.admission_plugins if config.control_plane.enabled else ()
        ),
        "taint": config.gpu_pool.taint.as_dict(),
        "names": names,
        "prefixes": prefixes,
    }


def pool_toleration_of(config: StackConfig) -> Problem | None:
    """Why a GPU pod the gate keeps on the binpack scheduler would never tolerate the pool's
    taint under `config`, whatever the cluster's API server runs
    (components/opa_gate/settings.py), or None."""
    return pool_toleration_problem(
        kubernetes_version=config.kubernetes_version, **_pool_toleration_facts(config)
    )


def server_toleration_of(config: StackConfig) -> str | None:
    """The GPU resource whose pods tolerate the pool's taint under `config` only if the
    cluster's API server runs ExtendedResourceToleration: the question the preview asks the
    cluster (__main__.py, components/opa_gate/preview.py check_pool_toleration); None when the
    config alone decides."""
    return server_toleration_resource(**_pool_toleration_facts(config))


def operator_conflict_of(config: StackConfig) -> Problem | None:
    """Why an operator outside the stack cannot be named under `config`, or None."""
    monitoring = config.monitoring
    return operator_conflict_problem(
        external_namespace=config.admission.external_gpu_operator_namespace,
        operator_enabled=config.gpu_operator.enabled,
        operator_namespace=config.gpu_operator.namespace,
        created_namespaces=(
            {monitoring.namespace: "monitoring.namespace"}
            if monitoring.enabled and monitoring.create_namespace
            else {}
        ),
    )


# --------------------------------------------------------------------------- the stack


class StackConfig(Settings):
    """Every `gpu-cluster:*` key of a stack, in the order they are checked."""

    kubeconfig: Annotated[str, Kubeconfig()] = ""
    """Path of a kubeconfig file (it must exist), or the kubeconfig content itself (set it with
    --secret). Empty uses $KUBECONFIG or ~/.kube/config."""
    kube_context: Annotated[str, STRING] = ""
    """Context inside the kubeconfig. Empty uses the kubeconfig's current-context."""
    kubernetes_version: Annotated[str, KUBERNETES_VERSION] = DEFAULT_KUBERNETES_VERSION
    """The cluster's Kubernetes version (vMAJOR.MINOR.PATCH). Picks the kube-scheduler image
    and which feature gates exist. Tested: v1.35-v1.37; others load with a warning. Compared
    with the live API server's /version when it can be reached: newer is refused, more than
    one minor older is a warning (version skew policy)."""
    nodes: Inventory = ()
    """Inventory of the nodes this stack touches: a list of {name, address}. Every node named
    elsewhere in the config must be listed here."""
    # The layers, in the order they are built: each section is a layer's settings, marked with
    # Layer (its component and what it does); these fields are the one table of layers (LAYERS).
    extended_resources: Annotated[
        ExtendedResourceNodesSettings,
        Layer(
            component="ExtendedResourceNodes",
            summary="the stack's extended resources in each node's capacity",
        ),
    ] = Field(default_factory=dict)
    """Extended resources to advertise, per node: {node-name: {domain/resource: count}},
    e.g. {worker-2: {example.com/dongle: 4}} (ExtendedResourceNodes)."""
    gpu_pool: Annotated[
        TaintedGpuPoolSettings,
        Layer(
            component="TaintedGpuPool",
            summary="the pool's taint and labels on every pool node",
        ),
    ] = Field(default_factory=TaintedGpuPoolSettings)
    """The GPU nodes, their taint and labels (TaintedGpuPool)."""
    control_plane: Annotated[
        ControlPlaneSettings,
        Layer(
            component="ControlPlaneFeatures",
            summary="admission plugins and feature gates, through kubeadm-config and kubeadm's "
            "own phases over SSH; off unless `controlPlane.enabled`",
        ),
    ] = Field(default_factory=ControlPlaneSettings)
    """Admission plugins and feature gates edited over SSH (ControlPlaneFeatures)."""
    ssh_private_key: Annotated[
        pulumi.Output[str] | None,
        SecretText(
            "sshPrivateKey",
            f"pulumi config set --secret {PROJECT}:sshPrivateKey < key",
            Rule(
                "expected a private key (-----BEGIN ... PRIVATE KEY-----)",
                lambda v: "PRIVATE KEY-----" in v,
            ),
        ),
    ] = Field(default=None, repr=False)
    """SSH private key for controlPlane hosts, stored encrypted (pulumi config set --secret
    gpu-cluster:sshPrivateKey < key); a plain-text value is rejected. Empty with
    controlPlane.sshAgent true uses the SSH agent."""
    gpu_operator: Annotated[
        GpuOperatorSettings,
        Layer(
            component="GpuOperator",
            summary="NVIDIA GPU Operator Helm release; off unless `gpuOperator.enabled`",
            namespace="namespace",
            chart=GPU_OPERATOR_CHART,
        ),
    ] = Field(default_factory=GpuOperatorSettings)
    """The NVIDIA GPU Operator Helm release (GpuOperator)."""
    scheduler: Annotated[
        BinpackSchedulerSettings,
        Layer(
            component="BinpackScheduler",
            summary="a second kube-scheduler that packs GPU pods (`scheduler.scoring`: "
            "`binpack` or `fragmentation`)",
        ),
    ] = Field(default_factory=BinpackSchedulerSettings)
    """The second kube-scheduler that bin-packs GPU pods (BinpackScheduler)."""
    admission: Annotated[
        OpaGateSettings,
        Layer(
            component="OpaGate",
            summary="routes GPU pods that leave `schedulerName` unset to that scheduler, "
            "refuses what cannot be routed (`admission.engine`)",
            fixed_namespace=DEFAULT_GATE_NAMESPACE,
        ),
    ] = Field(default_factory=OpaGateSettings)
    """The gate that routes GPU pods to the binpack scheduler, or refuses them (OpaGate)."""
    monitoring: Annotated[
        MonitoringStackSettings,
        Layer(
            component="MonitoringStack",
            summary="kube-prometheus-stack, DCGM ServiceMonitor, GPU dashboard and alerts; "
            "off unless `monitoring.enabled`",
            namespace="namespace",
            chart=MONITORING_CHART,
        ),
    ] = Field(default_factory=MonitoringStackSettings)
    """kube-prometheus-stack, the dcgm-exporter ServiceMonitor, GPU dashboard and alerts
    (MonitoringStack). Enabled needs grafanaAdminPassword or monitoring.grafanaAdminSecret."""
    grafana_admin_password: Annotated[
        pulumi.Output[str] | None,
        SecretText(
            "grafanaAdminPassword", f"pulumi config set --secret {PROJECT}:grafanaAdminPassword"
        ),
    ] = Field(default=None, repr=False)
    """Grafana admin password, set with `pulumi config set --secret
    gpu-cluster:grafanaAdminPassword`. Required when monitoring.enabled is true, unless
    monitoring.grafanaAdminSecret names an existing Secret."""

    priority_classes: Annotated[
        GpuPriorityClassesSettings,
        Layer(
            component="GpuPriorityClasses",
            summary="PriorityClasses for GPU workloads (inference, training, batch); off unless "
            "`priorityClasses.enabled`",
        ),
    ] = Field(default_factory=GpuPriorityClassesSettings)
    """PriorityClasses GPU pods name in spec.priorityClassName (GpuPriorityClasses)."""

    retake_claim: Annotated[bool, BOOL] = False
    """Take the cluster back when this stack's claim (ConfigMap kube-system/gpu-cluster) was
    deleted: once, with `pulumi up --refresh --config gpu-cluster:retakeClaim=true`, after
    checking that no other stack manages the cluster; then remove the key."""

    @model_validator(mode="after")
    def _context_in_kubeconfig(self) -> Self:
        """A kubeContext missing from the given kubeconfig would fail at the first API call."""
        if not (self.kubeconfig and self.kube_context):
            return self
        contexts = kubeconfig_document(self.kubeconfig).get("contexts") or []
        if not any(isinstance(c, Mapping) and c.get("name") == self.kube_context for c in contexts):
            raise problem(
                f"no context of that name in the kubeconfig that {PROJECT}:kubeconfig gives",
                key="kubeContext",
                value=self.kube_context,
            )
        return self

    @model_validator(mode="after")
    def _routing_needs_its_ga_api(self) -> Self:
        """MutatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from v1.36; before,
        it is a beta API behind a feature gate that a cluster may not have on. The check is on
        kubernetesVersion, one source, rather than a second API version to keep in step."""
        if self.admission.engine != ROUTING_ENGINE or self.kubernetes_minor >= ROUTING_MIN_MINOR:
            return self
        others = ", ".join(e for e in ADMISSION_ENGINES if e != ROUTING_ENGINE)
        raise problem(
            f"needs kubernetesVersion v1.{ROUTING_MIN_MINOR} or newer (MutatingAdmissionPolicy "
            f"is GA there; kubernetesVersion is {self.kubernetes_version}); allowed on this "
            f"version: {others}",
            key="admission.engine",
            value=self.admission.engine,
        )

    @model_validator(mode="after")
    def _gangs_fit_the_cluster(self) -> Self:
        """Gang scheduling needs v1.37's PodGroups, and with controlPlane.enabled the gate and
        API version the stack then turns on must not be set off by hand."""
        needs = self.scheduler.control_plane_needs
        if not needs.key:
            return self
        if self.kubernetes_minor < GANG_MIN_MINOR:
            raise problem(
                f"needs kubernetesVersion v1.{GANG_MIN_MINOR} or newer (PodGroups of "
                f"{GANG_GROUP_VERSION}; v1.35 and v1.36 have only alpha APIs of another shape; "
                f"kubernetesVersion is {self.kubernetes_version})",
                key=needs.key,
                value=True,
            )
        if not self.control_plane.enabled:
            return self
        for section, wanted, have in (
            ("featureGates", needs.feature_gates, self.control_plane.feature_gates),
            ("runtimeConfig", needs.runtime_config, self.control_plane.runtime_config),
        ):
            for name, on in wanted.items():
                if have.get(name, on) != on:
                    raise problem(
                        f"{needs.key} needs {str(on).lower()} (the stack sets it; remove the "
                        f"key, or turn {needs.key} off)",
                        key=f"controlPlane.{section}.{name}",
                        value=have[name],
                    )
        return self

    @model_validator(mode="after")
    def _gate_fits_the_stack(self) -> Self:
        """Every GPU pod the gate keeps on the binpack scheduler tolerates the pool's taint (or
        may, when only the cluster's API server can tell: server_toleration_of(), asked at
        preview), an operator outside the stack is named only where the stack installs none,
        and with DRA the engine can look up what a pod's claims name."""
        claims = claim_lookup_problem(
            engine=self.admission.engine, device_classes=self.gpu_operator.device_classes()
        )
        for found in (pool_toleration_of(self), operator_conflict_of(self), claims):
            if found is not None:
                raise problem(found.allowed, key=found.key, value=found.value)
        return self

    @model_validator(mode="after")
    def _one_layer_per_namespace(self) -> Self:
        """Each layer creates its own namespace, so two layers cannot share one (LAYERS)."""
        taken: dict[str, str] = {}
        for layer in LAYERS:
            if layer.fixed_namespace is not None:
                taken[layer.fixed_namespace] = f"the {layer.component} layer's own namespace"
        for layer in LAYERS:
            settings = getattr(self, layer.field)
            if layer.namespace is None or not getattr(settings, "enabled", True):
                continue
            key, namespace = (
                f"{layer.key}.{to_camel(layer.namespace)}",
                getattr(settings, layer.namespace),
            )
            if namespace in taken:
                raise problem(
                    f"already {taken[namespace]}; each layer creates its own namespace",
                    key=key,
                    value=namespace,
                )
            taken[namespace] = f"the namespace of {layer.key}"
        return self

    @property
    def layer_sections(self) -> dict[str, LayerSection]:
        """{component class name: its section}, for what a refusal of a layer's object names."""
        return {layer.component: layer.section for layer in LAYERS}

    @property
    def pool_namespaces(self) -> tuple[str, ...]:
        """The namespaces whose pods may run on the GPU pool's nodes without asking for a GPU:
        admission.poolNamespaces, and the monitoring namespace when the layer is on (its node
        exporter runs on every node)."""
        monitoring = (self.monitoring.namespace,) if self.monitoring.enabled else ()
        return tuple(sorted({*self.admission.pool_namespaces, *monitoring}))

    @property
    def kubernetes_minor(self) -> int:
        """The minor version kubernetesVersion names (validated, so it names one)."""
        return (major_minor(self.kubernetes_version) or (0, 0))[1]

    @cached_property
    def kubernetes(self) -> KubernetesAccessConfig:
        """How every layer reaches the cluster, the kubeconfig read once."""
        return KubernetesAccessConfig(
            kubeconfig=kubeconfig_content(self.kubeconfig), context=self.kube_context or None
        )

    @property
    def warnings(self) -> tuple[str, ...]:
        """Values that are legal but probably wrong, for the caller to log."""
        found: list[str] = []
        if self.kubernetes_minor not in SUPPORTED_MINORS:
            found.append(
                f"{PROJECT}:kubernetesVersion {self.kubernetes_version} is outside the tested "
                f"range v1.{SUPPORTED_MINORS.start}-v1.{SUPPORTED_MINORS.stop - 1}"
            )
        for node, counts in self.extended_resources.items():
            found.extend(
                f"{PROJECT}:extendedResources.{node}.{name} advertises 0; no pod can be "
                "scheduled with it there"
                for name, count in counts.items()
                if count == 0
            )
        return tuple(found)


@dataclass(frozen=True, kw_only=True)
class LayerRow(Layer):
    """One row of the table of layers: a StackConfig field's Layer mark, with the field."""

    field: str
    """The StackConfig field (snake_case)."""
    key: str
    """The section's config key."""
    settings: Any
    """The section's settings model (or type)."""

    @property
    def section(self) -> LayerSection:
        namespace_key = f"{self.key}.{to_camel(self.namespace)}" if self.namespace else None
        return LayerSection(self.key, namespace_key)


def _layer_rows() -> tuple[LayerRow, ...]:
    rows = []
    for name, info in StackConfig.model_fields.items():
        marks = [m for m in info.metadata if isinstance(m, Layer)]
        if marks:
            (mark,) = marks
            rows.append(
                LayerRow(
                    field=name,
                    key=info.alias or name,
                    settings=info.annotation,
                    **{f.name: getattr(mark, f.name) for f in fields(Layer)},
                )
            )
    return tuple(rows)


LAYERS = _layer_rows()
"""The table of layers, in the order they are built: StackConfig's fields marked with Layer."""


# --------------------------------------------------------------------------- entry points


def _inventory(raw_nodes: Any) -> dict[str, str]:
    """{name: address} of the raw inventory entries that name a node (before validation)."""
    if not isinstance(raw_nodes, list):
        return {}
    inventory: dict[str, str] = {}
    for entry in raw_nodes:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            address = entry.get("address", "")
            inventory[entry["name"]] = address if isinstance(address, str) else ""
    return inventory


def parse_stack_config(
    values: Mapping[str, Any], secret_keys: Collection[str] | None = None
) -> StackConfig:
    """Validate decoded config values ({key without namespace: value}).

    Keys missing from `values` take their model default. `secret_keys` (keys without namespace
    that the stack stores encrypted) is checked when given: secrets set in plain text are
    rejected.
    """
    raw = dict(values)
    monitoring = raw.get("monitoring")
    version = raw.get("kubernetesVersion") or DEFAULT_KUBERNETES_VERSION
    context = {
        "inventory": _inventory(raw.get("nodes", [])),
        "secret_keys": None if secret_keys is None else set(secret_keys),
        "ssh_key_set": bool(raw.get("sshPrivateKey")),
        "grafana_password_set": bool(raw.get("grafanaAdminPassword")),
        "monitoring_enabled": isinstance(monitoring, Mapping) and monitoring.get("enabled") is True,
        "kubernetes_version": version if KUBERNETES_VERSION.check(version) else None,
    }
    hidden = set(ALWAYS_SECRET) | set(secret_keys or ())
    if isinstance(raw.get("kubeconfig"), str) and "\n" in raw["kubeconfig"]:
        hidden.add("kubeconfig")
    try:
        return StackConfig.model_validate(raw, context=context)
    except ValidationError as exc:
        raise ConfigError(format_problems(exc, StackConfig, hidden=hidden)) from None


def _is_structured(key: str) -> bool:
    """Whether a top-level key holds an object, a list or a boolean (Pulumi passes those as
    JSON text)."""
    info = next((i for n, i in StackConfig.model_fields.items() if (i.alias or n) == key), None)
    if info is None:
        return True
    default = info.get_default(call_default_factory=True)
    return isinstance(default, Mapping | tuple | list | Settings | bool)


def decode_raw_config(raw: Mapping[str, str]) -> dict[str, Any]:
    """Decode Pulumi's string-valued config map ({"gpu-cluster:key": "..."}).

    Object and array values arrive as JSON text; strings stay as they are.
    """
    values: dict[str, Any] = {}
    for full_key, text_value in raw.items():
        namespace, _, key = full_key.partition(":")
        if namespace != PROJECT:
            continue
        if not isinstance(text_value, str) or not _is_structured(key):
            values[key] = text_value
            continue
        try:
            values[key] = json.loads(text_value)
        except json.JSONDecodeError:
            values[key] = text_value
    return values


# Config namespaces besides the project's that a stack may hold: the providers' and the
# engine's own (pulumi:tags, pulumi:disable-default-providers, ...).
OTHER_NAMESPACES = ("kubernetes", "command", "tls", "pulumi")


def foreign_key_problems(keys: Collection[str]) -> list[Problem]:
    """Keys in a namespace that is neither the project's nor another that a stack may hold
    (`gpu-clustr:gpuPool`): nothing would read them, and the key meant would take its
    default (for gpuPool: every GPU node untainted by the next `up`)."""
    expected = f"expected {PROJECT} (this project) or a provider's ({', '.join(OTHER_NAMESPACES)})"
    problems = []
    for full_key in sorted(keys):
        namespace, colon, key = full_key.partition(":")
        if colon and namespace != PROJECT and namespace not in OTHER_NAMESPACES:
            allowed = f"unknown config namespace {namespace!r}; {expected}"
            problems.append(Problem(key=key, value=NOT_SHOWN, allowed=allowed, namespace=namespace))
    return problems


def load_stack_config() -> StackConfig:
    """Read and validate the selected stack's config from the Pulumi runtime; a key in an
    unknown namespace is refused first."""
    from pulumi.runtime.config import (
        CONFIG,
        get_config_env,
        get_config_secret_keys_env,
        is_config_secret,
    )

    raw = {**get_config_env(), **CONFIG.get()}
    foreign = foreign_key_problems(raw)
    if foreign:
        raise ConfigError(foreign)
    secret = {k for k in raw if is_config_secret(k)} | set(get_config_secret_keys_env())
    keys = {k.partition(":")[2] for k in secret if k.startswith(f"{PROJECT}:")}
    return parse_stack_config(decode_raw_config(raw), secret_keys=keys)
