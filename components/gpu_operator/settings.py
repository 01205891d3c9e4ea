"""The GPU Operator's settings: the stack config's gpuOperator, its rules and defaults.

GpuOperatorSettings and its parts (driver, toolkit, device plugin and time-slicing, MIG, the
operator's own options), the pinned chart, how GPUs reach pods (`allocation`: the device plugin's
extended resources, or the DRA driver's DeviceClasses), what pods then ask for (gpu_resources(),
device_classes()) and which pods are the operator's own (OperatorPods, for the admission gate).
Why the toolkit ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers:
components/gpu_operator/component.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, get_args

from pydantic import Field, ValidationInfo, model_validator

from components.charts import HELM_REPOSITORY, HelmChart, chart_version, free_values
from components.gpu_resources import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    DRA_DRIVER,
    MIG_DEVICE_CLASS,
    MIG_PREFIX,
    SHARED_GPU,
    WHOLE_GPU,
    Allocation,
    GpuResources,
    allocation_device_classes,
)
from components.handoffs import OperatorPods
from components.kubernetes_names import NAMESPACE, service_account_user
from components.settings import BOOL, Rule, Settings, between, choice, context_value, problem

if TYPE_CHECKING:
    pass

MigStrategy = Literal["none", "single", "mixed"]
MIG_STRATEGIES: tuple[MigStrategy, ...] = get_args(MigStrategy)
ALLOCATIONS: tuple[Allocation, ...] = get_args(Allocation)

DEFAULT_REPOSITORY = "https://helm.ngc.nvidia.com/nvidia"
DEFAULT_VERSION = "v26.3.3"
# The chart this layer installs (its row in the table of layers names it).
CHART = HelmChart("gpu-operator", DEFAULT_VERSION)
# What the operator's dcgm-exporter Service looks like (ClusterPolicy defaults).
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/kube-prometheus.html
DCGM_SERVICE_SELECTOR: Mapping[str, str] = {"app": "nvidia-dcgm-exporter"}
# GPUCluster's dcgm-exporter (allocation dra) is a DaemonSet and Service of their own, labelled
# app=nvidia-dcgm-exporter-dra, port gpu-metrics; it maps GPUs to pods through DRA
# (KUBERNETES_ENABLE_DRA) and holds every GPU of its node with an admin-access claim
# (nvidia-dcgm-exporter-admin, allocationMode All), which DRA allows only in a namespace
# labelled DRA_ADMIN_NAMESPACE_LABEL.
# Ref: NVIDIA/gpu-operator manifests/state-dcgm-exporter/0500_service.yaml (85c52f2),
# 0400_resourceclaimtemplate.yaml (c5404e5); k8s.io/api@v0.37.2 resource/v1/types.go
# (DRAAdminNamespaceLabelKey; DRAAdminAccess GA and locked on in v1.36).
DCGM_DRA_SERVICE_SELECTOR: Mapping[str, str] = {"app": "nvidia-dcgm-exporter-dra"}
DRA_ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
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


class TimeSlicing(Settings):
    """GPU time-slicing: each physical GPU is advertised `replicas` times.

    # Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html
    """

    replicas: Annotated[int, between(2, 64)]
    """How many pods may share one GPU."""
    rename_by_default: Annotated[bool, BOOL] = False
    """Advertise shared GPUs as `nvidia.com/gpu.shared` instead of `nvidia.com/gpu`."""


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
    """The NVIDIA device plugin (deployed with allocation device-plugin, never with dra)."""

    time_slicing: TimeSlicing | None = None
    """Share each GPU between pods (needs mig.strategy none or single); unset advertises whole
    GPUs only."""


class Mig(Settings):
    """How MIG devices are advertised."""

    strategy: Annotated[MigStrategy, choice(MIG_STRATEGIES)] = "single"
    """none, single (as nvidia.com/gpu) or mixed (one resource per MIG profile); the device
    plugin's, so left unset with allocation dra."""


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

# DRA mode: the chart's GPUCluster (nvidia.com/v1alpha1, technology preview) instead of its
# ClusterPolicy. GPUCluster deploys the DRA Driver for NVIDIA GPUs (its gpus capability always
# on), DCGM and dcgm-exporter; not the device plugin, the toolkit, GFD or the MIG manager, and
# the driver only through an NVIDIADriver object. First in chart v26.7.0; the keys the values
# use were read in NVIDIA/gpu-operator deployments/gpu-operator: templates/gpucluster.yaml
# (gpuCluster.deployCR, draDriver.*, dcgmExporter.*, daemonsets; commit 4651c82),
# api/nvidia/v1alpha1/gpucluster_types.go (computeDomains.enabled defaults to true; commit
# 2a07dc4), templates/nvidiadriver.yaml (driver.nvidiaDriverCRD.enabled; commit f61cd7f).
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-dra.html
DRA_CHART = (26, 7)
# The operator's DRA prerequisite: a served resource.k8s.io DeviceClass API, Kubernetes v1.34.2+.
DRA_KUBERNETES = (1, 34, 2)
_KUBERNETES_VERSION = re.compile(r"v?([0-9]+)\.([0-9]+)\.([0-9]+)", re.ASCII)


def _version_triple(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version such as v1.37.2; None for anything else."""
    match = _KUBERNETES_VERSION.match(version)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def dcgm_service_selector(allocation: Allocation) -> Mapping[str, str]:
    """The labels of the operator's dcgm-exporter Service with `allocation`."""
    return DCGM_DRA_SERVICE_SELECTOR if allocation == "dra" else DCGM_SERVICE_SELECTOR


def _nested(values: Mapping[str, Any], *path: str) -> Any:
    """values[path[0]][path[1]]...; None where a step is missing or not an object."""
    current: Any = values
    for key in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(key)
    return current


class GpuOperatorSettings(Settings):
    """The NVIDIA GPU Operator Helm release (the stack config's gpuOperator)."""

    enabled: Annotated[bool, BOOL] = False
    """Build the GpuOperator layer (needs a reachable chart repository)."""
    namespace: Annotated[str, NAMESPACE] = "gpu-operator"
    """The operator's namespace. Created (and deleted on destroy) by this layer, so it must
    not exist before the first `up`, unless createNamespace is false."""
    create_namespace: Annotated[bool, BOOL] = True
    """Create `namespace` (true), or use an existing one without owning it (false: it must
    exist labelled pod-security.kubernetes.io/enforce=privileged, and with allocation dra also
    resource.kubernetes.io/admin-access=true, which preview checks; `destroy` leaves it)."""
    repository: Annotated[str, HELM_REPOSITORY] = DEFAULT_REPOSITORY
    """Where the chart comes from: a chart repository URL, an OCI registry (oci://host/path)
    or a local chart archive or directory (air-gapped installs; `version` is then the copy's)."""
    version: Annotated[str, chart_version(DEFAULT_VERSION)] = DEFAULT_VERSION
    """Chart version (pinned)."""
    allocation: Annotated[Allocation, choice(ALLOCATIONS)] = "device-plugin"
    """How pods get GPUs: device-plugin (extended resources such as nvidia.com/gpu), or dra (the
    DRA Driver for NVIDIA GPUs through the chart's GPUCluster, technology preview: DeviceClasses
    gpu.nvidia.com and mig.nvidia.com, asked for through ResourceClaims; needs chart v26.7.0+
    and Kubernetes v1.34.2+, leaves devicePlugin, mig and the toolkit and migManager switches
    unset, and no other GPU device plugin may run in the cluster)."""
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

    def operator_pods(self, external_namespace: str = "") -> OperatorPods | None:
        """The GPU Operator's own pods, which the admission gate lets through: those of the
        operator this layer installs, or (disabled) of one installed outside the stack in
        `external_namespace` (admission.externalGpuOperatorNamespace), made the same way by the
        same chart; None when there is neither. Naming both is refused by the stack config."""
        if self.enabled and external_namespace:
            raise ValueError(
                f"the stack installs the GPU Operator in {self.namespace}; an operator outside "
                f"it ({external_namespace}) is for gpuOperator.enabled false"
            )
        namespace = self.namespace if self.enabled else external_namespace
        if not namespace:
            return None
        validator = service_account_user(namespace, VALIDATOR_SERVICE_ACCOUNT)
        return OperatorPods(namespace=namespace, creators=(validator,))

    def device_classes(self) -> tuple[str, ...]:
        """The DeviceClasses the operator installs for pods to claim GPUs from: GPUCluster's
        with allocation dra, none with the device plugin or when the layer is disabled."""
        return allocation_device_classes(self.allocation) if self.enabled else ()

    def device_drivers(self) -> tuple[str, ...]:
        """The DRA drivers whose devices are GPUs: the one GPUCluster deploys with allocation
        dra, none with the device plugin or when the layer is disabled."""
        return (DRA_DRIVER,) if self.device_classes() else ()

    def gpu_resources(self) -> GpuResources:
        """The GPU resources pods ask for with these settings.

        With the device plugin: whole GPUs stay nvidia.com/gpu on every path (GPUs outside MIG
        under mixed, nodes outside the time-slicing config), so it is always listed. Disabled,
        the operator advertises nothing of its own: the plain name only. With allocation dra no
        node advertises a device plugin's name: the extended resource names of the
        DeviceClasses (DRAExtendedResource) are what a container may ask for, ResourceClaims
        aside. The names are components/gpu_resources.py's.
        """
        classes = self.device_classes()
        if classes:
            return GpuResources(
                names=tuple(DEVICE_CLASS_RESOURCE_PREFIX + c for c in classes), prefixes=()
            )
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
            prefixes.append(MIG_PREFIX)
        return GpuResources(names=tuple(names), prefixes=tuple(prefixes), shared=tuple(shared))

    @model_validator(mode="after")
    def _dra_mode_can_work(self, info: ValidationInfo) -> Self:
        """allocation dra: a chart with GPUCluster, a Kubernetes the driver runs on, and none
        of the settings only ClusterPolicy's operands (device plugin, MIG manager, toolkit)
        honour, which GPUCluster would silently drop."""
        if self.allocation != "dra":
            return self
        if chart_minor(self.version) < DRA_CHART:
            raise problem(
                "allocation dra deploys the DRA driver through the chart's GPUCluster, first in "
                "chart v26.7.0: use v26.7.0 or later, or allocation device-plugin",
                at=".version",
                value=self.version,
            )
        version = context_value(info, "kubernetes_version") or ""
        kubernetes = _version_triple(version)
        if kubernetes is not None and kubernetes < DRA_KUBERNETES:
            raise problem(
                "the DRA Driver for NVIDIA GPUs needs Kubernetes v1.34.2 or later (a served "
                f"resource.k8s.io DeviceClass API; kubernetesVersion is {version}); allowed "
                "below that: device-plugin",
                at=".allocation",
                value=self.allocation,
            )
        unhonoured: list[tuple[str, Any, str]] = []
        if self.device_plugin.time_slicing is not None:
            unhonoured.append(
                (
                    ".devicePlugin.timeSlicing",
                    self.device_plugin.time_slicing.model_dump(by_alias=True),
                    "time-slicing is the device plugin's, which allocation dra does not deploy; "
                    "share a GPU through one ResourceClaim instead: leave it unset",
                )
            )
        if "strategy" in self.mig.model_fields_set:
            unhonoured.append(
                (
                    ".mig.strategy",
                    self.mig.strategy,
                    "no MIG strategy applies with allocation dra: the driver publishes each MIG "
                    f"device as its own {MIG_DEVICE_CLASS} device, chosen in the claim; leave "
                    "it unset",
                )
            )
        for at, switch, what in (
            (".migManager.enabled", self.mig_manager, "the MIG manager"),
            (".toolkit.enabled", self.toolkit, "the container toolkit (the runtime must have CDI)"),
        ):
            if "enabled" in switch.model_fields_set and switch.enabled:
                unhonoured.append(
                    (at, True, f"GPUCluster does not deploy {what}; allowed: false or unset")
                )
        if self.toolkit.env:
            unhonoured.append(
                (
                    ".toolkit.env",
                    sorted(self.toolkit.env),
                    "GPUCluster deploys no toolkit to set it on (configure the host's toolkit); "
                    "leave it unset",
                )
            )
        if unhonoured:
            at, value, allowed = unhonoured[0]
            raise problem(allowed, at=at, value=value)
        return self

    @model_validator(mode="after")
    def _one_allocation_model(self) -> Self:
        """One model per cluster: `values` may not bring back the other one's operator
        resource or the device plugin."""
        dra = self.allocation == "dra"
        # (key path, value that mixes the models, what is allowed)
        rules: tuple[tuple[tuple[str, ...], object, str], ...] = (
            (
                ("devicePlugin", "enabled"),
                True if dra else None,
                "allocation dra allocates GPUs with the DRA driver, and the device plugin "
                "beside it would hand out the same GPUs again; leave it unset",
            ),
            (
                ("clusterPolicy", "deployCR"),
                dra,
                "allocation dra deploys GPUCluster in place of ClusterPolicy"
                if dra
                else "allocation device-plugin needs the ClusterPolicy; leave it unset",
            ),
            (
                ("gpuCluster", "deployCR"),
                not dra,
                "allocation dra is GPUCluster; leave it unset"
                if dra
                else "GPUCluster is allocation dra (one model per cluster); leave it unset",
            ),
            (
                ("draDriver", "gpus", "enabled"),
                None if dra else True,
                "DRA GPU allocation is allocation dra (one model per cluster); leave it unset",
            ),
        )
        for path, mixed, allowed in rules:
            value = _nested(self.values, *path)
            if mixed is not None and value is mixed:
                raise problem(allowed, at=".values." + ".".join(path), value=value)
        return self

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
