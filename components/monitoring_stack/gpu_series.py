"""How many GPUs each node has and how many are taken, per allocation model: the one home of
the PromQL the GPU dashboard and the GPU alerts share, and of what kube-state-metrics must
export for it.

- device-plugin: the kubelet advertises GPUs as extended resources, which kube-state-metrics
  exports as kube_node_status_capacity/allocatable and kube_pod_container_resource_requests
  (`resource` the sanitised name, selected by `$gpu_resources`).
- dra: no node advertises a GPU. The DRA driver's kubelet plugin publishes each node's GPUs as
  devices of ResourceSlices (driver gpu.nvidia.com, one pool per node), pods hold them through
  ResourceClaims whose status.allocation.devices.results name driver/pool/device. Neither is a
  kube-state-metrics resource, so its custom resource state configuration
  (custom_resource_state) exports one series per published device, per device allocated to a
  claim and per device a claim asks for; the chart's role may list and watch those two
  resources and nothing more (rbac_rules).

The files (dashboards/gpu.json, alerts/gpu.rules.yaml) name each shared expression by a
placeholder `$gpus_<name>`, filled in from SERIES by manifests.py; the dashboard's copies select
`node=~"$node"` (the dashboard's node variable), the rules' none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.gpu_resources import DRA_DRIVER, Allocation

RESOURCE_API_GROUP = "resource.k8s.io"
RESOURCE_API_VERSION = "v1"

# kube-state-metrics' custom resource state: a metric is <metricNamePrefix>_<name>, and every
# series carries customresource_group/_version/_kind besides the labels configured here.
# Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/pkg/customresourcestate/config.go (GetMetricNamePrefix)
# Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/pkg/customresourcestate/registry_factory.go (compile, compiledInfo)
METRIC_PREFIX = "gpu_cluster_dra"
DEVICE_METRIC = f"{METRIC_PREFIX}_device_info"
ALLOCATED_METRIC = f"{METRIC_PREFIX}_claim_allocated_device_info"
REQUEST_METRIC = f"{METRIC_PREFIX}_claim_request_info"

# Placeholder -> the text it stands for, in the dashboard (node matcher `, node=~"$node"`) or
# the rules (none); filled in before `$gpu_resources` and `$dcgm_job`.
PLACEHOLDER = re.compile(r"\$gpus_[a-z_]+")
_DASHBOARD_NODES = ', node=~"$node"'

_DEVICE_PLUGIN: Mapping[str, str] = {
    # Per node and GPU resource: what pods may be given, and what running or pending pods ask.
    "allocatable": 'sum by (node, resource) (kube_node_status_allocatable{resource=~"$gpu_resources"%s})',
    "allocated": (
        'sum by (node, resource) (kube_pod_container_resource_requests{resource=~"$gpu_resources"%s}'
        " * on (namespace, pod) group_left () max by (namespace, pod)"
        ' (kube_pod_status_phase{phase=~"Pending|Running"} == 1))'
    ),
    # One series or more per GPU node (labelled node): the node variable and the absence alerts.
    "node_series": 'kube_node_status_capacity{resource=~"$gpu_resources"%s}',
    # The node variable's own query: never filtered by the variable.
    "listed_node_series": 'kube_node_status_allocatable{resource=~"$gpu_resources"}',
    # Nodes that should have GPUs and can give none.
    "unusable_nodes": 'sum by (node) (kube_node_status_allocatable{resource=~"$gpu_resources"%s}) == 0',
    # Pods (namespace, pod) that ask for a GPU.
    "requesting_pods": (
        'max by (namespace, pod) (kube_pod_container_resource_requests{resource=~"$gpu_resources"%s} > 0)'
    ),
    "allocator": "NVIDIA device plugin",
}

# A published device's `resource`: type-profile joined (mig-1g.10gb for a MIG device), the
# whole GPU's "gpu-" (no profile) made "gpu". No `$1`: Grafana would read it as a variable.
_DEVICES = (
    f'label_replace(label_join({DEVICE_METRIC}{{driver="{DRA_DRIVER}"%s}}, "resource", "-",'
    ' "type", "profile"), "resource", "gpu", "resource", "gpu-")'
)
# Devices held by a claim for a workload; an admin-access claim (dcgm-exporter's own, which
# holds every GPU of its node to monitor it) takes nothing away from pods.
_ALLOCATED = f'{ALLOCATED_METRIC}{{driver="{DRA_DRIVER}", admin_access!="true"}}'
_DRA: Mapping[str, str] = {
    "allocatable": f"count by (node, resource) ({_DEVICES})",
    "allocated": f"count by (node, resource) ({_DEVICES} and on (driver, pool, device) {_ALLOCATED})",
    "node_series": f'{DEVICE_METRIC}{{driver="{DRA_DRIVER}"%s}}',
    "listed_node_series": f'{DEVICE_METRIC}{{driver="{DRA_DRIVER}"}}',
    # A node of the cluster that dcgm-exporter sees GPUs on, or that published devices in the
    # last day, and publishes none now: the kubelet deletes a driver's slices once its plugin
    # is gone, so "has had GPUs" needs a memory (the day), and DCGM still sees the GPUs.
    "unusable_nodes": (
        f'((group by (node) (max_over_time({DEVICE_METRIC}{{driver="{DRA_DRIVER}"%s}}[1d]))'
        ' or group by (node) (DCGM_FI_DEV_GPU_TEMP{job="$dcgm_job"%s}))'
        " and on (node) group by (node) (kube_node_info%s)"
        f' unless on (node) group by (node) ({DEVICE_METRIC}{{driver="{DRA_DRIVER}"%s}}))'
    ),
    # Pods asking through DRAExtendedResource (a container request of a DeviceClass's name),
    # or owning a claim (made from a template) that asks for one of the DeviceClasses.
    "requesting_pods": (
        '(max by (namespace, pod) (kube_pod_container_resource_requests{resource=~"$gpu_resources"%s} > 0)'
        f' or max by (namespace, pod) ({REQUEST_METRIC}{{device_class=~"$device_classes", pod!=""%s}}))'
    ),
    "allocator": "NVIDIA DRA driver's kubelet plugin",
}
SERIES: Mapping[Allocation, Mapping[str, str]] = {"device-plugin": _DEVICE_PLUGIN, "dra": _DRA}


def _regex(names: tuple[str, ...]) -> str:
    """An anchored RE2 alternation of `names` taken literally, as a PromQL string's content."""
    return "|".join(re.escape(n).replace("\\", "\\\\") for n in names) or "$^"


def series(
    allocation: Allocation, *, dashboard: bool, device_classes: tuple[str, ...] = ()
) -> dict[str, str]:
    """Placeholder (`$gpus_<name>`) -> text for `allocation`: with the dashboard's node matcher
    or (rules) none. `device_classes` are the DeviceClasses a GPU claim names (dra)."""
    nodes = _DASHBOARD_NODES if dashboard else ""
    values = {}
    for name, template in SERIES[allocation].items():
        text = template.replace("%s", nodes)
        values[f"$gpus_{name}"] = text.replace("$device_classes", _regex(device_classes))
    return values


def fill(text: str, values: Mapping[str, str], where: str) -> str:
    """`text` with every `$gpus_<name>` replaced; an unknown one is an error naming `where`."""

    def one(match: re.Match[str]) -> str:
        if match[0] not in values:
            raise ValueError(f"{where}: unknown placeholder {match[0]} (known: {sorted(values)})")
        return values[match[0]]

    return PLACEHOLDER.sub(one, text)


def custom_resource_state() -> dict[str, Any]:
    """kube-state-metrics' custom resource state configuration for DRA (the chart's
    customResourceState.config), exporting, each with value 1:

    - DEVICE_METRIC: one series per device of a ResourceSlice: node, driver, pool, device, the
      driver's `type` (gpu, mig) and `profile` (MIG) attributes;
    - ALLOCATED_METRIC: one per device allocated to a ResourceClaim: namespace, claim, request,
      driver, pool, device, admin_access ("true" for an admin-access result);
    - REQUEST_METRIC: one per request of a ResourceClaim (exactly one DeviceClass): namespace,
      claim, pod (the claim's owner, for a claim made from a pod's template), device_class.

    A path that is absent (a claim not yet allocated) yields no series; a label whose path is
    absent is left out. Info metrics are always 1.
    # Ref: https://github.com/kubernetes/kube-state-metrics/blob/main/docs/metrics/extend/customresourcestate-metrics.md
    # Ref: k8s.io/api@v0.37.2 resource/v1/types.go (ResourceSliceSpec, DeviceRequestAllocationResult)
    """

    def gvk(kind: str) -> dict[str, str]:
        return {"group": RESOURCE_API_GROUP, "version": RESOURCE_API_VERSION, "kind": kind}

    def info(name: str, help_text: str, path: list[str], labels: dict[str, list[str]]) -> Any:
        return {
            "name": name,
            "help": help_text,
            "each": {"type": "Info", "info": {"path": path, "labelsFromPath": labels}},
        }

    claim_labels = {"namespace": ["metadata", "namespace"], "claim": ["metadata", "name"]}
    return {
        "kind": "CustomResourceStateMetrics",
        "spec": {
            "resources": [
                {
                    "groupVersionKind": gvk("ResourceSlice"),
                    "metricNamePrefix": METRIC_PREFIX,
                    "labelsFromPath": {
                        "node": ["spec", "nodeName"],
                        "driver": ["spec", "driver"],
                        "pool": ["spec", "pool", "name"],
                    },
                    "metrics": [
                        info(
                            DEVICE_METRIC.removeprefix(METRIC_PREFIX + "_"),
                            "A device a DRA driver publishes in a ResourceSlice.",
                            ["spec", "devices"],
                            {
                                "device": ["name"],
                                "type": ["attributes", "type", "string"],
                                "profile": ["attributes", "profile", "string"],
                            },
                        )
                    ],
                },
                {
                    "groupVersionKind": gvk("ResourceClaim"),
                    "metricNamePrefix": METRIC_PREFIX,
                    "labelsFromPath": claim_labels,
                    "metrics": [
                        info(
                            ALLOCATED_METRIC.removeprefix(METRIC_PREFIX + "_"),
                            "A device allocated to a ResourceClaim.",
                            ["status", "allocation", "devices", "results"],
                            {
                                "request": ["request"],
                                "driver": ["driver"],
                                "pool": ["pool"],
                                "device": ["device"],
                                "admin_access": ["adminAccess"],
                            },
                        ),
                        {
                            **info(
                                REQUEST_METRIC.removeprefix(METRIC_PREFIX + "_"),
                                "A request of a ResourceClaim for devices of one DeviceClass.",
                                ["spec", "devices", "requests"],
                                {
                                    "request": ["name"],
                                    "device_class": ["exactly", "deviceClassName"],
                                },
                            ),
                            # From the claim itself: the pod whose template made it.
                            "labelsFromPath": {
                                "pod": ["metadata", "ownerReferences", "[kind=Pod]", "name"]
                            },
                        },
                    ],
                },
            ]
        },
    }


def rbac_rules() -> list[dict[str, Any]]:
    """What kube-state-metrics may read for custom_resource_state: list and watch of the two
    resources (its reflectors list, then watch), nothing else (the chart's rbac.extraRules)."""
    return [
        {
            "apiGroups": [RESOURCE_API_GROUP],
            "resources": ["resourceclaims", "resourceslices"],
            "verbs": ["list", "watch"],
        }
    ]


def exported_metrics() -> set[str]:
    """The metric names custom_resource_state makes kube-state-metrics export."""
    names = set()
    for resource in custom_resource_state()["spec"]["resources"]:
        for metric in resource["metrics"]:
            names.add(f"{resource['metricNamePrefix']}_{metric['name']}")
    return names
