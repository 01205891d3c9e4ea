"""GpuOperator: the NVIDIA GPU Operator as a Helm release, with values built from typed config.

A `helm.v3.Release` rather than `helm.v4.Chart`: the chart upgrades its CRDs from a Helm
pre-upgrade hook (`operator.upgradeCRD`), and v4 Chart renders templates without running hooks.
The operand daemonsets tolerate exactly the GPU pool's taint, taken from TaintedGpuPool's output,
so the release also waits for every GPU node to be tainted.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, cast, get_args

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components.cluster_access import ClusterAccess
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


@dataclass(frozen=True, kw_only=True)
class TimeSlicing:
    """GPU time-slicing: each physical GPU is advertised `replicas` times.

    # Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html
    """

    replicas: int
    """How many pods may share one GPU (>= 2)."""
    rename_by_default: bool = False
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


@dataclass(frozen=True, kw_only=True)
class GpuOperatorChart:
    """What the chart installs and how; the stack config's gpuOperator holds exactly these."""

    namespace: str = "gpu-operator"
    """The operator's own namespace (created here)."""
    repository: str = DEFAULT_REPOSITORY
    """Helm repository URL of the chart."""
    version: str = DEFAULT_VERSION
    """Chart version (pinned)."""
    driver_enabled: bool = True
    """Install the NVIDIA driver as a container; false where drivers are preinstalled."""
    toolkit_enabled: bool = True
    """Install the NVIDIA Container Toolkit; false where it is preinstalled."""
    toolkit_env: Mapping[str, str] = field(default_factory=dict)
    """Environment of the toolkit container, e.g. {CONTAINERD_CONFIG: /etc/containerd/config.toml}."""
    time_slicing: TimeSlicing | None = None
    """Share each GPU between pods; None advertises whole GPUs only."""
    mig_strategy: MigStrategy = "single"
    """How MIG devices are advertised: none, single (as nvidia.com/gpu) or mixed (per profile)."""
    mig_manager_enabled: bool = True
    """Run the MIG manager (applies MIG layouts from the nvidia.com/mig.config node label)."""
    dcgm_exporter_enabled: bool = True
    """Run dcgm-exporter (GPU metrics). Its ServiceMonitor is MonitoringStack's, never the chart's."""
    nfd_enabled: bool = True
    """Deploy Node Feature Discovery; false where NFD already runs in the cluster."""
    upgrade_crd: bool = True
    """Upgrade the chart's CRDs from a pre-upgrade hook on `helm upgrade`."""
    values: Mapping[str, Any] = field(default_factory=dict)
    """Free-form chart values deep-merged last, over everything above."""


@dataclass(frozen=True, kw_only=True)
class GpuOperatorArgs(GpuOperatorChart):
    """Inputs of GpuOperator: the chart settings, plus the cluster and the pool's taint."""

    access: ClusterAccess
    """Cluster provider."""
    taint: pulumi.Input[Mapping[str, str]]
    """The GPU pool's taint {key, value, effect} (TaintedGpuPool.taint); tolerations come from it."""

    @classmethod
    def of(
        cls,
        chart: GpuOperatorChart,
        *,
        access: ClusterAccess,
        taint: pulumi.Input[Mapping[str, str]],
    ) -> GpuOperatorArgs:
        """Args carrying every setting of `chart` (e.g. the stack config's gpuOperator)."""
        settings = {f.name: getattr(chart, f.name) for f in fields(GpuOperatorChart)}
        return cls(access=access, taint=taint, **settings)


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
    typed: dict[str, Any] = {
        "operator": {"upgradeCRD": args.upgrade_crd},
        # Every operand daemonset runs on the GPU nodes, so it tolerates their taint.
        "daemonsets": {"tolerations": tolerations},
        "driver": {"enabled": args.driver_enabled},
        "toolkit": {
            "enabled": args.toolkit_enabled,
            "env": [{"name": k, "value": str(v)} for k, v in args.toolkit_env.items()],
        },
        "devicePlugin": device_plugin,
        "mig": {"strategy": args.mig_strategy},
        "migManager": {"enabled": args.mig_manager_enabled},
        # The ServiceMonitor for dcgm-exporter belongs to MonitoringStack (see README).
        "dcgmExporter": {
            "enabled": args.dcgm_exporter_enabled,
            "serviceMonitor": {"enabled": False},
        },
        "nfd": {"enabled": args.nfd_enabled},
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
        if args.time_slicing is not None:
            document = yaml.safe_dump(args.time_slicing.config(args.mig_strategy), sort_keys=False)
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
            chart="gpu-operator",
            version=args.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=args.repository),
            namespace=namespace_name,
            values=values,
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
            if args.dcgm_exporter_enabled
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
