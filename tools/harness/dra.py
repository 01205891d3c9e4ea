"""A stand-in for the DRA Driver for NVIDIA GPUs, at its API boundary.

No kubelet and no GPU run here, so nothing would publish a node's GPUs. The real driver's
kubelet plugin publishes, for its node, one ResourceSlice of driver `gpu.nvidia.com` (one pool
named after the node) whose devices are the node's GPUs (attribute `type` `gpu`) and the MIG
devices its MIG layout made (`type` `mig`, `profile` such as `1g.10gb`); its chart installs the
DeviceClasses pods claim from. This module writes exactly those objects through the API and
nothing else: the real kube-controller-manager makes claims from templates, the real
kube-scheduler (or the stack's) allocates devices, and kwok's kubelets run the pods.

Everything it writes carries STAND_IN_LABEL, so `withdraw` removes exactly that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import dynamic
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from components.gpu_resources import DRA_DRIVER, GPU_DEVICE_CLASS, MIG_DEVICE_CLASS
from tools.harness.fake_nodes import FakeNode, gpu_node

DRIVER = DRA_DRIVER
"""The driver name of NVIDIA's DRA driver (its ResourceSlices' spec.driver)."""
RESOURCE_API = "resource.k8s.io/v1"
STAND_IN_LABEL = {"app.kubernetes.io/managed-by": "dra-driver-stand-in"}
PRODUCT = "NVIDIA H100 80GB HBM3"
GPU_MEMORY = "80Gi"


def dra_node(name: str, cpu: str = "32", memory: str = "256Gi") -> FakeNode:
    """A GPU node as a kubelet reports it when the DRA driver, not the device plugin, serves
    its GPUs: no GPU count in capacity or allocatable."""
    counted = gpu_node(name, 0, cpu, memory)
    return FakeNode(
        counted.name,
        {k: v for k, v in counted.capacity.items() if not k.startswith("nvidia.com/")},
        counted.labels,
    )


def _attributes(**values: str) -> dict[str, Any]:
    return {key: {"string": value} for key, value in values.items()}


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the driver's chart installs: whole GPUs and MIG devices of the driver."""
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": name, "labels": dict(STAND_IN_LABEL)},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f"device.driver == '{DRIVER}' && "
                            f"device.attributes['{DRIVER}'].type == '{kind}'"
                        }
                    }
                ]
            },
        }
        for name, kind in ((GPU_DEVICE_CLASS, "gpu"), (MIG_DEVICE_CLASS, "mig"))
    ]


def resource_slice(
    node: str, gpus: int, mig: Mapping[str, int] | None = None, generation: int = 1
) -> dict[str, Any]:
    """The slice the driver's kubelet plugin on `node` publishes: `gpus` whole GPUs
    (gpu-0, ...) and, per MIG profile, that many MIG devices (mig-1g-10gb-0, ...)."""
    devices: list[dict[str, Any]] = [
        {
            "name": f"gpu-{index}",
            "attributes": _attributes(type="gpu", productName=PRODUCT, uuid=f"GPU-{node}-{index}"),
            "capacity": {"memory": {"value": GPU_MEMORY}},
        }
        for index in range(gpus)
    ]
    for profile in sorted(mig or {}):
        devices.extend(
            {
                # A device name is a DNS label: no dots (1g.10gb -> mig-1g-10gb-0).
                "name": f"mig-{profile.replace('.', '-')}-{index}",
                "attributes": _attributes(type="mig", profile=profile, productName=PRODUCT),
            }
            for index in range((mig or {})[profile])
        )
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}", "labels": dict(STAND_IN_LABEL)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _resource(api_client: Any, kind: str) -> Any:
    return dynamic.DynamicClient(api_client).resources.get(api_version=RESOURCE_API, kind=kind)


def publish(
    api_client: Any,
    gpus: Mapping[str, int],
    mig: Mapping[str, Mapping[str, int]] | None = None,
    *,
    classes: bool = True,
) -> None:
    """Publish each node's slice (`gpus[node]` whole GPUs, `mig[node]` MIG devices by profile)
    and, with `classes`, the driver's DeviceClasses; an object already there is replaced."""
    objects = (device_classes() if classes else []) + [
        resource_slice(node, count, (mig or {}).get(node)) for node, count in gpus.items()
    ]
    for obj in objects:
        resource = _resource(api_client, obj["kind"])
        try:
            resource.create(body=obj)
        except ConflictError:
            current = resource.get(name=obj["metadata"]["name"])
            obj["metadata"]["resourceVersion"] = current.metadata.resourceVersion
            resource.replace(body=obj)


def withdraw(api_client: Any) -> None:
    """Delete every object the stand-in published."""
    selector = ",".join(f"{k}={v}" for k, v in STAND_IN_LABEL.items())
    for kind in ("ResourceSlice", "DeviceClass"):
        resource = _resource(api_client, kind)
        for item in resource.get(label_selector=selector).items:
            with contextlib.suppress(NotFoundError):
                resource.delete(name=item.metadata.name)


def claim_template(
    name: str, device_class: str, count: int = 1, selector: str | None = None
) -> dict[str, Any]:
    """A ResourceClaimTemplate asking for `count` devices of `device_class`."""
    request: dict[str, Any] = {
        "name": "devices",
        "exactly": {
            "deviceClassName": device_class,
            "allocationMode": "ExactCount",
            "count": count,
        },
    }
    if selector:
        request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def claim_pod_spec(
    template: str, containers: Iterable[Mapping[str, Any]], **spec: Any
) -> dict[str, Any]:
    """A pod spec whose containers use one claim made from `template` (named `devices`)."""
    return {
        **spec,
        "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
        "containers": [
            {
                **container,
                "resources": {**container.get("resources", {}), "claims": [{"name": "devices"}]},
            }
            for container in containers
        ],
    }
