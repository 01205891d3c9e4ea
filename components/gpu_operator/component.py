"""GpuOperator: the NVIDIA GPU Operator as a Helm release, with values built from typed settings.

A `helm.v3.Release` rather than `helm.v4.Chart`: the chart upgrades its CRDs from a Helm
pre-upgrade hook (`operator.upgradeCRD`), and v4 Chart renders templates without running hooks.
The release lives in its own namespace, labelled for privileged pods (the operands mount host
paths); with createNamespace false the existing namespace must carry the same labels
(operator_namespace_needs; the ownership check refuses it at preview otherwise). The operand
and NFD worker daemonsets tolerate exactly the GPU pool's taint, taken from TaintedGpuPool's
output, so the taint is written once and the release also waits for every GPU node to be
tainted. Time-slicing, when set, is a ConfigMap in the operator's namespace that the
device plugin is pointed at (its migStrategy follows mig.strategy). `values` is deep-merged last
(objects key by key, anything else replaced), for chart settings without a typed field, e.g.
{driver: {version: "580.95.05"}}. The chart's own dcgm-exporter ServiceMonitor stays off:
MonitoringStack owns the only one.

`allocation: dra` deploys the chart's GPUCluster instead of its ClusterPolicy: the DRA Driver
for NVIDIA GPUs publishes GPUs and MIG devices in ResourceSlices, pods claim them from the
DeviceClasses gpu.nvidia.com and mig.nvidia.com (the `device_classes` output) through
ResourceClaims, or with DRAExtendedResource as `deviceclass.resource.kubernetes.io/<class>`,
and kube-scheduler's DynamicResources plugin allocates them. No device plugin, time-slicing,
MIG manager or toolkit is deployed then (the host's container runtime must inject CDI devices);
the settings refuse what only those would honour. One model per cluster: no other GPU device
plugin may run beside it (the same GPUs would be handed out twice).
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-dra.html

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

from collections.abc import Mapping
from typing import Annotated, Any

import pulumi
import pulumi_kubernetes as k8s

from components.cluster_access import ClusterAccess, ClusterLayer
from components.gpu_operator.manifests import (
    operator_namespace,
    operator_namespace_needs,
    operator_values,
    time_slicing_config_map,
)
from components.gpu_operator.settings import (
    CHART,
    DCGM_PORT_NAME,
    GpuOperatorSettings,
    dcgm_service_selector,
)
from components.gpu_resources import allocation_device_classes
from components.handoffs import DcgmTarget
from components.settings import PROJECT, Runtime

TOKEN = f"{PROJECT}:index:GpuOperator"
RELEASE_NAME = "gpu-operator"


class GpuOperatorArgs(GpuOperatorSettings):
    """Inputs of GpuOperator: its settings, plus the cluster and the pool's toleration."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster provider."""
    pool_toleration: Annotated[pulumi.Output[dict[str, str]] | Mapping[str, str], Runtime()]
    """The GPU pool's toleration {key, operator, value, effect} (TaintedGpuPool.toleration),
    given to the operator's operands."""


class GpuOperator(ClusterLayer):
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
    device_classes: pulumi.Output[list[str]]
    """The DeviceClasses pods claim GPUs from (allocation dra); empty with the device plugin."""

    def __init__(
        self, name: str, args: GpuOperatorArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, args.access, opts)
        child = self.children

        # The namespace by name (plain, so the stack checks its objects before applying any);
        # the objects in it wait for it when the layer creates it.
        if args.create_namespace:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=operator_namespace(args.namespace, args.allocation)["metadata"],
                opts=child,
            )
            child = pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[namespace])
            )
        else:
            args.access.use_namespace(
                self, args.namespace, operator_namespace_needs(args.allocation)
            )

        config_name: pulumi.Output[str | None] = pulumi.Output.from_input(None)
        if args.device_plugin.time_slicing is not None:
            config = time_slicing_config_map(
                args.device_plugin.time_slicing, args.mig.strategy, args.namespace
            )
            time_slicing = k8s.core.v1.ConfigMap(
                f"{name}-time-slicing", metadata=config["metadata"], data=config["data"], opts=child
            )
            config_name = time_slicing.metadata.apply(lambda m: str(m["name"]))

        toleration = pulumi.Output.from_input(args.pool_toleration).apply(dict)
        values = pulumi.Output.all(toleration, config_name).apply(
            lambda v: operator_values(args, v[0], v[1])
        )
        release = k8s.helm.v3.Release(
            f"{name}-release",
            name=RELEASE_NAME,
            **CHART.release_chart(args.repository, args.version),
            namespace=args.namespace,
            values=values,
            # The new ClusterPolicy may carry fields only the hook's new CRD knows.
            disable_openapi_validation=args.operator.upgrade_crd,
            opts=child,
        )
        self._publish(
            release.status,
            pulumi.Output.from_input(args.namespace),
            values,
            args.dcgm_exporter.enabled,
            list(allocation_device_classes(args.allocation)),
            dcgm_service_selector(args.allocation),
        )

    def _publish(
        self,
        status: pulumi.Output[Any],
        namespace: pulumi.Output[str],
        values: pulumi.Output[dict[str, Any]],
        dcgm_exporter: bool,
        device_classes: list[str],
        dcgm_selector: Mapping[str, str],
    ) -> None:
        """Set and register the outputs."""
        self.namespace = namespace
        self.release_name = status.apply(lambda s: str(s.name))
        self.release_status = status.apply(lambda s: str(s.status))
        self.chart_version = status.apply(lambda s: str(s.version))
        self.values = values
        self.dcgm_target = (
            DcgmTarget(
                namespace=status.apply(lambda s: str(s.namespace)),
                selector=dcgm_selector,
                port=DCGM_PORT_NAME,
            )
            if dcgm_exporter
            else None
        )
        self.device_classes = pulumi.Output.from_input(device_classes)
        self.register_outputs(
            {
                "namespace": self.namespace,
                "release_name": self.release_name,
                "release_status": self.release_status,
                "chart_version": self.chart_version,
                "values": self.values,
                "device_classes": self.device_classes,
            }
        )
