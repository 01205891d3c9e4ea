"""The stack's outputs: one table of every name `pulumi up` exports, the layer that makes it and
what it holds. __main__.py exports through export_outputs(), which refuses a name the table does
not hold; tools/demo.py, the harness and the end-to-end tests read these names
(tests/test_main.py checks that every name they read is in the table and exported).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi


@dataclass(frozen=True)
class StackOutput:
    name: str
    """The output's name (`pulumi stack output <name>`)."""
    layer: str
    """The component that makes it; exported only while that layer is on."""
    summary: str


OUTPUTS: tuple[StackOutput, ...] = (
    StackOutput("gpuNodes", "TaintedGpuPool", "the GPU pool's nodes"),
    StackOutput("gpuTaint", "TaintedGpuPool", "the pool's taint {key, value, effect}"),
    StackOutput("gpuNodeLabels", "TaintedGpuPool", "the labels of the pool's nodes"),
    StackOutput("schedulerName", "BinpackScheduler", "the spec.schedulerName of GPU pods"),
    StackOutput("schedulerConfig", "BinpackScheduler", "the scheduler's configuration (YAML)"),
    StackOutput("admissionEngine", "OpaGate", "the gate's engine"),
    StackOutput("admissionPolicy", "OpaGate", "the gate's policy or webhook name"),
    StackOutput(
        "advertisedResources", "ExtendedResourceNodes", "{node: {resource: count}} advertised"
    ),
    StackOutput("controlPlaneHosts", "ControlPlaneFeatures", "the hosts configured over SSH"),
    StackOutput("admissionPlugins", "ControlPlaneFeatures", "the API servers' admission plugins"),
    StackOutput("featureGates", "ControlPlaneFeatures", "the feature gates set"),
    StackOutput(
        "skippedFeatureGates", "ControlPlaneFeatures", "gates left out for the cluster's version"
    ),
    StackOutput("gpuOperatorNamespace", "GpuOperator", "the GPU Operator's namespace"),
    StackOutput("gpuOperatorRelease", "GpuOperator", "its Helm release's status"),
    StackOutput("gpuOperatorChart", "GpuOperator", "its chart version"),
    StackOutput("gpuDeviceClasses", "GpuOperator", "the DRA DeviceClasses (allocation dra)"),
    StackOutput("monitoringNamespace", "MonitoringStack", "the monitoring namespace"),
    StackOutput("monitoringRelease", "MonitoringStack", "kube-prometheus-stack's release status"),
    StackOutput("grafanaService", "MonitoringStack", "Grafana's Service (namespace/name)"),
    StackOutput("gpuDashboard", "MonitoringStack", "the GPU dashboard's ConfigMap"),
    StackOutput("gpuDashboardUid", "MonitoringStack", "the GPU dashboard's uid"),
    StackOutput("gpuAlertRule", "MonitoringStack", "the GPU alerts' PrometheusRule"),
    StackOutput("dcgmServiceMonitor", "MonitoringStack", "the DCGM ServiceMonitor"),
    StackOutput("gpuPriorityClasses", "GpuPriorityClasses", "the PriorityClasses' names"),
)
OUTPUT_NAMES = frozenset(o.name for o in OUTPUTS)


def export_outputs(values: Mapping[str, Any]) -> None:
    """pulumi.export each of `values`, every name one of OUTPUTS."""
    unknown = sorted(set(values) - OUTPUT_NAMES)
    if unknown:
        raise ValueError(f"outputs {unknown} are not in stack_outputs.OUTPUTS")
    for name, value in values.items():
        pulumi.export(name, value)
