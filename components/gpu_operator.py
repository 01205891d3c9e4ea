"""GpuOperator: the NVIDIA GPU Operator as a Helm release, with values built from typed settings.

A `helm.v3.Release` rather than `helm.v4.Chart`: the chart upgrades its CRDs from a Helm
pre-upgrade hook (`operator.upgradeCRD`), and v4 Chart renders templates without running hooks.
The release lives in its own namespace, labelled for privileged pods (the operands mount host
paths). The operand and NFD worker daemonsets tolerate exactly the GPU pool's taint, taken from
TaintedGpuPool's output, so the taint is written once and the release also waits for every GPU
node to be tainted. Time-slicing, when set, is a ConfigMap in the operator's namespace that the
device plugin is pointed at (its migStrategy follows mig.strategy). `values` is deep-merged last
(objects key by key, anything else replaced), for chart settings without a typed field, e.g.
{driver: {version: "580.95.05"}}. The chart's own dcgm-exporter ServiceMonitor stays off:
MonitoringStack owns the only one.

No GPU without a request: with the container toolkit's default, an unprivileged container that
sets NVIDIA_VISIBLE_DEVICES=all reaches every GPU of its node without requesting one, and no
scheduler counts it. The release tells the toolkit to ignore that variable in unprivileged
containers and keeps the operator's CDI mode on, in which the device plugin hands a container
its GPUs as CDI devices, not through the variable (so requested GPUs still arrive). The
operator's own operands run privileged and are not affected. An explicit toolkit.env entry or
`values` overrides either choice. With toolkit.enabled false the host's toolkit configuration
decides (set accept-nvidia-visible-devices-envvar-when-unprivileged = false there).
# Ref: https://github.com/NVIDIA/nvidia-container-toolkit/blob/main/cmd/nvidia-ctk-installer/toolkit/toolkit.go
# Ref: https://github.com/NVIDIA/gpu-operator/blob/main/controllers/object_controls.go (transformDevicePluginCtrForCDI)
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self, cast, get_args

import pulumi
import pulumi_kubernetes as k8s
import yaml
from pydantic import Field, ValidationInfo, model_validator

from components.cluster_access import ClusterAccess
from components.gpu_resources import WHOLE_GPU, GpuResources
from components.settings import (
    BOOL,
    HELM_REPOSITORY,
    NAMESPACE,
    Rule,
    Runtime,
    Settings,
    between,
    chart_version,
    choice,
    context_value,
    free_values,
    helm_chart,
    problem,
)
from components.tainted_gpu_pool import Taint, TaintEffect

TOKEN = "gpu-cluster:index:GpuOperator"

MigStrategy = Literal["none", "single", "mixed"]
MIG_STRATEGIES: tuple[MigStrategy, ...] = get_args(MigStrategy)

DEFAULT_REPOSITORY = "https://helm.ngc.nvidia.com/nvidia"
DEFAULT_VERSION = "v26.3.3"
RELEASE_NAME = "gpu-operator"
# The name the device plugin's time-slicing config is stored under in the ConfigMap.
TIME_SLICING_KEY = "any"
# What the operator's dcgm-exporter Service looks like (ClusterPolicy defaults).
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/kube-prometheus.html
DCGM_SERVICE_SELECTOR: Mapping[str, str] = {"app": "nvidia-dcgm-exporter"}
DCGM_PORT_NAME = "gpu-metrics"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
ENV_NAME = Rule(
    "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
    lambda v: isinstance(v, str) and _ENV_NAME.fullmatch(v) is not None,
)
# YAML numbers and booleans are written as the strings the container sees.
ENV_VALUE = Rule(
    "expected a string (numbers and booleans become strings)",
    lambda v: isinstance(v, str | int | float),
    lambda v: ("true" if v else "false") if isinstance(v, bool) else str(v),
)


def chart_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a chart version such as v26.3.3."""
    major, minor, _ = version.removeprefix("v").split(".", 2)
    return int(major), int(minor)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `override` merged in: objects merge key by key, anything else replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class TimeSlicing(Settings):
    """GPU time-slicing: each physical GPU is advertised `replicas` times.

    # Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html
    """

    replicas: Annotated[int, between(2, 64)]
    """How many pods may share one GPU."""
    rename_by_default: Annotated[bool, BOOL] = False
    """Advertise shared GPUs as `nvidia.com/gpu.shared` instead of `nvidia.com/gpu`."""

    def config(self, mig_strategy: MigStrategy) -> dict[str, Any]:
        """The device plugin's config document."""
        return {
            "version": "v1",
            "flags": {"migStrategy": mig_strategy},
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": self.rename_by_default,
                    "resources": [{"name": "nvidia.com/gpu", "replicas": self.replicas}],
                }
            },
        }


@dataclass(frozen=True, kw_only=True)
class DcgmTarget:
    """Where the operator's dcgm-exporter can be scraped (for exactly one ServiceMonitor)."""

    namespace: pulumi.Input[str]
    """Namespace of the dcgm-exporter Service (resolves once the release is deployed)."""
    selector: Mapping[str, str] = field(default_factory=lambda: dict(DCGM_SERVICE_SELECTOR))
    """Labels of the dcgm-exporter Service."""
    port: str = DCGM_PORT_NAME
    """Name of the Service port serving /metrics."""


class Switch(Settings):
    """An operand that is on unless turned off."""

    enabled: Annotated[bool, BOOL] = True
    """Deploy it."""


class Toolkit(Settings):
    """The NVIDIA Container Toolkit operand."""

    enabled: Annotated[bool, BOOL] = True
    """Install the toolkit; false where it is preinstalled."""
    env: dict[Annotated[str, ENV_NAME], Annotated[str, ENV_VALUE]] = Field(default_factory=dict)
    """Environment of the toolkit container, e.g. {CONTAINERD_CONFIG: /etc/containerd/config.toml}."""


class DevicePlugin(Settings):
    """The NVIDIA device plugin (always deployed)."""

    time_slicing: TimeSlicing | None = None
    """Share each GPU between pods (needs mig.strategy none or single); unset advertises whole
    GPUs only."""


class Mig(Settings):
    """How MIG devices are advertised."""

    strategy: Annotated[MigStrategy, choice(MIG_STRATEGIES)] = "single"
    """none, single (as nvidia.com/gpu) or mixed (one resource per MIG profile)."""


class OperatorOptions(Settings):
    """The operator itself."""

    upgrade_crd: Annotated[bool, BOOL] = Field(default=True, alias="upgradeCRD")
    """Upgrade the chart's CRDs from its pre-upgrade hook on `helm upgrade`, with OpenAPI
    validation of the release's manifests off (NVIDIA's upgrade procedure): they are checked
    against the old CRDs before the hook has run."""


# What the device plugin advertises: whole GPUs (WHOLE_GPU; MIG devices too under mig.strategy
# single), time-sliced GPUs under their own name with renameByDefault, one resource per MIG
# profile (nvidia.com/mig-1g.5gb, ...) under mig.strategy mixed. GpuResources and what counts
# as a GPU are components/gpu_resources.py's.
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html
SHARED_GPU = "nvidia.com/gpu.shared"
MIG_PROFILE_PREFIX = "nvidia.com/mig-"

# The toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged (default true), set
# through the toolkit container's environment.
ENVVAR_WHEN_UNPRIVILEGED = "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"
# From v25.10.0 the container runtime itself injects CDI devices and the device plugin's CDI
# mode uses the cdi-annotations,cdi-cri strategies; before, CDI went through the nvidia runtime
# with the envvar strategy still on.
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/cdi.html
CDI_BY_THE_RUNTIME = (25, 10)
# The validator creates its workload pods (the device plugin's with a GPU limit and a preset
# nodeName, the CUDA one privileged with NVIDIA_VISIBLE_DEVICES=all) with this ServiceAccount's
# credentials, in the operator's namespace.
# Ref: https://github.com/NVIDIA/gpu-operator/blob/main/validator/manifests/plugin-workload-validation.yaml
# Ref: https://github.com/NVIDIA/gpu-operator/blob/main/validator/manifests/cuda-workload-validation.yaml
VALIDATOR_SERVICE_ACCOUNT = "nvidia-operator-validator"
# Who creates a DaemonSet's pods: kube-controller-manager, as its daemon-set-controller
# ServiceAccount with --use-service-account-credentials (kubeadm's default), else as itself.
# The operands (the device plugin sets NVIDIA_VISIBLE_DEVICES=all) are DaemonSet pods.
# Ref: https://github.com/NVIDIA/gpu-operator/blob/main/assets/state-device-plugin/0500_daemonset.yaml
DAEMONSET_CONTROLLERS = (
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:daemon-set-controller",
)


@dataclass(frozen=True, kw_only=True)
class OperatorPods:
    """The pods the GPU Operator itself makes, as admission sees them: created in its own
    namespace by its validator's ServiceAccount, or by the DaemonSet controller for one of
    the namespace's DaemonSets (the operands). Nobody else's pods in that namespace."""

    namespace: str
    """The operator's namespace."""
    creators: tuple[str, ...]
    """User names whose pod creations in `namespace` are the operator's (its validator)."""
    daemonset_controllers: tuple[str, ...] = DAEMONSET_CONTROLLERS
    """User names that create DaemonSet pods; such a pod of `namespace` is an operand."""


class GpuOperatorSettings(Settings):
    """The NVIDIA GPU Operator Helm release (the stack config's gpuOperator)."""

    enabled: Annotated[bool, BOOL] = False
    """Build the GpuOperator layer (needs a reachable chart repository)."""
    namespace: Annotated[str, NAMESPACE] = "gpu-operator"
    """The operator's own namespace (created here, so no other layer's)."""
    repository: Annotated[str, HELM_REPOSITORY] = DEFAULT_REPOSITORY
    """Where the chart comes from: a chart repository URL, an OCI registry (oci://host/path)
    or a local chart archive or directory (air-gapped installs; `version` is then the copy's)."""
    version: Annotated[str, chart_version(DEFAULT_VERSION)] = DEFAULT_VERSION
    """Chart version (pinned)."""
    driver: Switch = Field(default_factory=Switch)
    """The NVIDIA driver as a container; enabled false where drivers are preinstalled."""
    toolkit: Toolkit = Field(default_factory=Toolkit)
    """The NVIDIA Container Toolkit and its environment."""
    device_plugin: DevicePlugin = Field(default_factory=DevicePlugin)
    """The device plugin: optional time-slicing."""
    mig: Mig = Field(default_factory=Mig)
    """MIG strategy."""
    mig_manager: Switch = Field(default_factory=Switch)
    """The MIG manager (applies MIG layouts from the nvidia.com/mig.config node label)."""
    dcgm_exporter: Switch = Field(default_factory=Switch)
    """dcgm-exporter (GPU metrics). Its ServiceMonitor is MonitoringStack's, never the chart's."""
    nfd: Switch = Field(default_factory=Switch)
    """Node Feature Discovery; enabled false where NFD already runs in the cluster."""
    operator: OperatorOptions = Field(default_factory=OperatorOptions)
    """The operator's own options."""
    values: Annotated[dict[str, Any], free_values()] = Field(default_factory=dict)
    """Free-form chart values, deep-merged last over everything above.
    dcgmExporter.serviceMonitor.enabled true is rejected while monitoring is enabled."""

    def operator_pods(self) -> OperatorPods | None:
        """The operator's own pods (the admission gate lets them through); None when disabled."""
        if not self.enabled:
            return None
        validator = f"system:serviceaccount:{self.namespace}:{VALIDATOR_SERVICE_ACCOUNT}"
        return OperatorPods(namespace=self.namespace, creators=(validator,))

    def gpu_resources(self) -> GpuResources:
        """The GPU resources the device plugin advertises with these settings.

        Whole GPUs stay nvidia.com/gpu on every path (GPUs outside MIG under mixed, nodes
        outside the time-slicing config), so it is always listed. Disabled, the operator
        advertises nothing of its own: the plain name only.
        """
        names = [WHOLE_GPU]
        prefixes: list[str] = []
        shared: list[tuple[str, int]] = []
        time_slicing = self.device_plugin.time_slicing
        if self.enabled and time_slicing is not None:
            name = SHARED_GPU if time_slicing.rename_by_default else WHOLE_GPU
            shared.append((name, time_slicing.replicas))
            if time_slicing.rename_by_default:
                names.append(SHARED_GPU)
        if self.enabled and self.mig.strategy == "mixed":
            prefixes.append(MIG_PROFILE_PREFIX)
        return GpuResources(names=tuple(names), prefixes=tuple(prefixes), shared=tuple(shared))

    @model_validator(mode="after")
    def _time_slicing_needs_one_gpu_resource(self) -> Self:
        if self.device_plugin.time_slicing is not None and self.mig.strategy == "mixed":
            raise problem(
                "time-slicing shares nvidia.com/gpu, which needs mig.strategy none or single",
                at=".mig.strategy",
                value=self.mig.strategy,
            )
        return self

    @model_validator(mode="after")
    def _cdi_hands_out_the_gpus(self) -> Self:
        """Before v25.10.0 the device plugin's CDI mode still passes devices through
        NVIDIA_VISIBLE_DEVICES, which the toolkit is told to ignore in unprivileged containers
        (module docstring): such a chart takes an explicit toolkit choice."""
        if chart_minor(self.version) < CDI_BY_THE_RUNTIME and (
            ENVVAR_WHEN_UNPRIVILEGED not in self.toolkit.env
        ):
            raise problem(
                "chart versions before v25.10.0 give GPU pods their GPUs through "
                "NVIDIA_VISIBLE_DEVICES, which the stack has the toolkit ignore in "
                "unprivileged containers: use v25.10.0 or later, or set "
                f"toolkit.env.{ENVVAR_WHEN_UNPRIVILEGED} (true leaves any pod that sets "
                "the variable every GPU of its node)",
                at=".version",
                value=self.version,
            )
        return self

    @model_validator(mode="after")
    def _one_dcgm_service_monitor(self, info: ValidationInfo) -> Self:
        """MonitoringStack owns the only dcgm-exporter ServiceMonitor; the chart's stays off."""
        chart_monitor = self.values.get("dcgmExporter", {})
        chart_monitor = (
            chart_monitor.get("serviceMonitor", {}) if isinstance(chart_monitor, Mapping) else {}
        )
        enabled = chart_monitor.get("enabled") if isinstance(chart_monitor, Mapping) else None
        if enabled is True and context_value(info, "monitoring_enabled"):
            raise problem(
                "MonitoringStack already creates the one ServiceMonitor for dcgm-exporter; "
                "leave this unset",
                at=".values.dcgmExporter.serviceMonitor.enabled",
                value=enabled,
            )
        return self


class GpuOperatorArgs(GpuOperatorSettings):
    """Inputs of GpuOperator: its settings, plus the cluster and the pool's taint."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster provider."""
    taint: Annotated[pulumi.Output[dict[str, str]] | Mapping[str, str], Runtime()]
    """The GPU pool's taint {key, value, effect} (TaintedGpuPool.taint); tolerations come from it."""


def operator_values(
    args: GpuOperatorArgs, toleration: Mapping[str, str], device_plugin_config: str | None
) -> dict[str, Any]:
    """The chart values: typed settings, then `args.values` deep-merged over them."""
    tolerations = [dict(toleration)]
    device_plugin: dict[str, Any] = {"enabled": True}
    if device_plugin_config is not None:
        device_plugin["config"] = {
            "create": False,
            "name": device_plugin_config,
            "default": TIME_SLICING_KEY,
        }
    # No GPU through NVIDIA_VISIBLE_DEVICES in an unprivileged container (module docstring);
    # an explicit toolkit.env entry of the same name wins.
    toolkit_env = {ENVVAR_WHEN_UNPRIVILEGED: "false", **args.toolkit.env}
    typed: dict[str, Any] = {
        "operator": {"upgradeCRD": args.operator.upgrade_crd},
        # Every operand daemonset runs on the GPU nodes, so it tolerates their taint.
        "daemonsets": {"tolerations": tolerations},
        "driver": {"enabled": args.driver.enabled},
        "toolkit": {
            "enabled": args.toolkit.enabled,
            "env": [{"name": k, "value": v} for k, v in toolkit_env.items()],
        },
        # CDI device list strategies (cdi-annotations, cdi-cri) for the device plugin: requested
        # GPUs reach their container without the variable the toolkit now ignores.
        "cdi": {"enabled": True},
        "devicePlugin": device_plugin,
        "mig": {"strategy": args.mig.strategy},
        "migManager": {"enabled": args.mig_manager.enabled},
        # The ServiceMonitor for dcgm-exporter belongs to MonitoringStack (monitoring_stack.py).
        "dcgmExporter": {
            "enabled": args.dcgm_exporter.enabled,
            "serviceMonitor": {"enabled": False},
        },
        "nfd": {"enabled": args.nfd.enabled},
        "node-feature-discovery": {"worker": {"tolerations": tolerations}},
    }
    return deep_merge(typed, args.values)


class GpuOperator(pulumi.ComponentResource):
    """The NVIDIA GPU Operator in its own namespace, tolerating the GPU pool's taint."""

    namespace: pulumi.Output[str]
    """The operator's namespace."""
    release_name: pulumi.Output[str]
    """Helm release name."""
    release_status: pulumi.Output[str]
    """Helm release status (`deployed` once the chart is up)."""
    chart_version: pulumi.Output[str]
    """Deployed chart version."""
    values: pulumi.Output[dict[str, Any]]
    """The values handed to the chart."""
    dcgm_target: DcgmTarget | None
    """Where dcgm-exporter is scraped; None when dcgm-exporter is disabled."""

    def __init__(
        self, name: str, args: GpuOperatorArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.access.provider)

        # Operands (driver, toolkit, device plugin) run privileged and mount host paths.
        # Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={
                "name": args.namespace,
                "labels": {
                    "app.kubernetes.io/part-of": "gpu-cluster",
                    "pod-security.kubernetes.io/enforce": "privileged",
                },
            },
            opts=child,
        )
        namespace_name = namespace.metadata.apply(lambda m: str(m["name"]))

        config_name: pulumi.Output[str | None] = pulumi.Output.from_input(None)
        time_slicing_settings = args.device_plugin.time_slicing
        if time_slicing_settings is not None:
            document = yaml.safe_dump(
                time_slicing_settings.config(args.mig.strategy), sort_keys=False
            )
            time_slicing = k8s.core.v1.ConfigMap(
                f"{name}-time-slicing",
                metadata={"name": "time-slicing-config", "namespace": namespace_name},
                data={TIME_SLICING_KEY: document},
                opts=child,
            )
            config_name = time_slicing.metadata.apply(lambda m: str(m["name"]))

        toleration = pulumi.Output.from_input(args.taint).apply(
            lambda t: Taint(
                key=t["key"], value=t["value"], effect=cast(TaintEffect, t["effect"])
            ).toleration()
        )
        values = pulumi.Output.all(toleration, config_name).apply(
            lambda v: operator_values(args, v[0], v[1])
        )
        release = k8s.helm.v3.Release(
            f"{name}-release",
            name=RELEASE_NAME,
            **helm_chart("gpu-operator", args.repository, args.version),
            namespace=namespace_name,
            values=values,
            # The new ClusterPolicy may carry fields only the hook's new CRD knows.
            disable_openapi_validation=args.operator.upgrade_crd,
            opts=child,
        )

        status = release.status
        self.namespace = namespace_name
        self.release_name = status.apply(lambda s: str(s.name))
        self.release_status = status.apply(lambda s: str(s.status))
        self.chart_version = status.apply(lambda s: str(s.version))
        self.values = values
        self.dcgm_target = (
            DcgmTarget(namespace=status.apply(lambda s: str(s.namespace)))
            if args.dcgm_exporter.enabled
            else None
        )
        self.register_outputs(
            {
                "namespace": self.namespace,
                "release_name": self.release_name,
                "release_status": self.release_status,
                "chart_version": self.chart_version,
                "values": self.values,
            }
        )
