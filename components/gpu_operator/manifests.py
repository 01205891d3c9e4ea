"""The GPU Operator's objects as data: its namespace, the time-slicing ConfigMap, the chart values
(ClusterPolicy's with allocation device-plugin, GPUCluster's with dra).

Pure functions, settings in, plain dicts out; components/gpu_operator/component.py turns them into
resources. Why the values look the way they do (the toolkit, CDI, the ServiceMonitor left to
MonitoringStack): that module's docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from components.charts import deep_merge
from components.gpu_operator.settings import (
    DRA_ADMIN_NAMESPACE_LABEL,
    ENVVAR_WHEN_UNPRIVILEGED,
    GpuOperatorSettings,
    MigStrategy,
    TimeSlicing,
)
from components.gpu_resources import Allocation
from components.object_meta import (
    PART_OF,
    POD_SECURITY_ENFORCE,
    NamespaceLabel,
    namespace_labels,
    object_meta,
)

# The name the device plugin's time-slicing config is stored under in the ConfigMap.
TIME_SLICING_KEY = "any"
TIME_SLICING_CONFIG_MAP = "time-slicing-config"


def operator_namespace_needs(
    allocation: Allocation = "device-plugin",
) -> tuple[NamespaceLabel, ...]:
    """The labels the operator's pods need on its namespace: on the one the layer creates, and
    on an existing one it uses (createNamespace false; the ownership check refuses one without
    them). Pod Security's enforce level privileged, always as a label: the cluster's default
    level is in the API server's admission configuration, which the stack cannot read (the
    upstream default is privileged; a hardened cluster's is baseline or restricted). With
    allocation dra, DRA admin access (dcgm-exporter's claim on every GPU of its node:
    settings.py, DRA_ADMIN_NAMESPACE_LABEL). The stack's part-of label is bookkeeping, not a
    need: operator_namespace adds it to the namespace it owns.

    Operands (driver, toolkit, device plugin) run privileged and mount host paths.
    # Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html
    # Ref: https://kubernetes.io/docs/concepts/security/pod-security-admission/
    """
    needs = [
        NamespaceLabel(
            POD_SECURITY_ENFORCE,
            "privileged",
            "the operator's driver, toolkit and device plugin pods run privileged and mount "
            "host paths, which Pod Security admits only at privileged; the stack cannot read "
            "the cluster's default level, so the namespace must say it",
        )
    ]
    if allocation == "dra":
        needs.append(
            NamespaceLabel(
                DRA_ADMIN_NAMESPACE_LABEL,
                "true",
                "with gpuOperator.allocation dra, dcgm-exporter holds every GPU of its node "
                "through an admin-access ResourceClaim, which DRA allows only in a namespace so "
                "labelled; without it dcgm-exporter never starts and GPU metrics go dark",
            )
        )
    return tuple(needs)


def operator_namespace(name: str, allocation: Allocation = "device-plugin") -> dict[str, Any]:
    """The operator's Namespace: what its pods need (operator_namespace_needs) and the stack's
    part-of label."""
    labels = {**PART_OF, **namespace_labels(operator_namespace_needs(allocation))}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": object_meta(name, labels=labels)}


def time_slicing_config(time_slicing: TimeSlicing, mig_strategy: MigStrategy) -> dict[str, Any]:
    """The device plugin's config document for time-slicing."""
    return {
        "version": "v1",
        "flags": {"migStrategy": mig_strategy},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": time_slicing.rename_by_default,
                "resources": [{"name": "nvidia.com/gpu", "replicas": time_slicing.replicas}],
            }
        },
    }


def time_slicing_config_map(
    time_slicing: TimeSlicing, mig_strategy: MigStrategy, namespace: object
) -> dict[str, Any]:
    """The ConfigMap the device plugin is pointed at, its document under TIME_SLICING_KEY."""
    document = yaml.safe_dump(time_slicing_config(time_slicing, mig_strategy), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(TIME_SLICING_CONFIG_MAP, namespace),
        "data": {TIME_SLICING_KEY: document},
    }


def operator_values(
    settings: GpuOperatorSettings,
    toleration: Mapping[str, str],
    device_plugin_config: str | None,
) -> dict[str, Any]:
    """The chart values: typed settings, then `settings.values` deep-merged over them."""
    if settings.allocation == "dra":
        return deep_merge(dra_values(settings, toleration), settings.values)
    tolerations = [dict(toleration)]
    device_plugin: dict[str, Any] = {"enabled": True}
    if device_plugin_config is not None:
        device_plugin["config"] = {
            "create": False,
            "name": device_plugin_config,
            "default": TIME_SLICING_KEY,
        }
    # No GPU through NVIDIA_VISIBLE_DEVICES in an unprivileged container (gpu_operator.py);
    # an explicit toolkit.env entry of the same name wins.
    toolkit_env = {ENVVAR_WHEN_UNPRIVILEGED: "false", **settings.toolkit.env}
    typed: dict[str, Any] = {
        "operator": {"upgradeCRD": settings.operator.upgrade_crd},
        # Every operand daemonset runs on the GPU nodes, so it tolerates their taint.
        "daemonsets": {"tolerations": tolerations},
        "driver": {"enabled": settings.driver.enabled},
        "toolkit": {
            "enabled": settings.toolkit.enabled,
            "env": [{"name": k, "value": v} for k, v in toolkit_env.items()],
        },
        # CDI device list strategies (cdi-annotations, cdi-cri) for the device plugin: requested
        # GPUs reach their container without the variable the toolkit now ignores.
        "cdi": {"enabled": True},
        "devicePlugin": device_plugin,
        "mig": {"strategy": settings.mig.strategy},
        "migManager": {"enabled": settings.mig_manager.enabled},
        # The ServiceMonitor for dcgm-exporter belongs to MonitoringStack (monitoring_stack.py).
        "dcgmExporter": {
            "enabled": settings.dcgm_exporter.enabled,
            "serviceMonitor": {"enabled": False},
        },
        "nfd": {"enabled": settings.nfd.enabled},
        "node-feature-discovery": {"worker": {"tolerations": tolerations}},
    }
    return deep_merge(typed, settings.values)


def dra_values(settings: GpuOperatorSettings, toleration: Mapping[str, str]) -> dict[str, Any]:
    """The typed chart values of allocation dra: the chart's GPUCluster in place of its
    ClusterPolicy (chart v26.7.0+; which file of the chart carries each key:
    components/gpu_operator/settings.py, DRA_CHART).

    GPUCluster takes the DRA driver (its gpus capability always on), dcgm-exporter and the
    common daemonset settings; the driver comes from the chart's default NVIDIADriver object
    (driver.enabled) or is the host's. The device plugin stays off in case a ClusterPolicy is
    ever rendered, so no GPU is handed out twice. ComputeDomains (Multi-Node NVLink, GB200-class
    systems) default to on in GPUCluster and are turned off: set
    values.draDriver.computeDomains.enabled where they are wanted.
    """
    tolerations = [dict(toleration)]
    driver: dict[str, Any] = {"enabled": settings.driver.enabled}
    if settings.driver.enabled:
        driver["nvidiaDriverCRD"] = {"enabled": True}
    return {
        "operator": {"upgradeCRD": settings.operator.upgrade_crd},
        "clusterPolicy": {"deployCR": False},
        "gpuCluster": {"deployCR": True},
        # GPUCluster renders .Values.daemonsets whole: its DRA kubelet plugin tolerates the taint.
        "daemonsets": {"tolerations": tolerations},
        "driver": driver,
        "devicePlugin": {"enabled": False},
        "draDriver": {"computeDomains": {"enabled": False}},
        # The ServiceMonitor for dcgm-exporter belongs to MonitoringStack (monitoring_stack.py).
        "dcgmExporter": {
            "enabled": settings.dcgm_exporter.enabled,
            "serviceMonitor": {"enabled": False},
        },
        "nfd": {"enabled": settings.nfd.enabled},
        "node-feature-discovery": {"worker": {"tolerations": tolerations}},
    }
