"""The replay's GPUs under Dynamic Resource Allocation (`--dra`): slices, claim templates, pods.

In DRA mode a node advertises no nvidia.com/gpu: its GPUs are the devices of one ResourceSlice
of the driver gpu.nvidia.com (tools/harness/dra.py, the stand-in for NVIDIA's DRA driver:
devices gpu-0 ... with attribute type=gpu), and the driver's DeviceClasses are installed once.
A GPU pod asks for its whole GPUs through one ResourceClaim made from a ResourceClaimTemplate
of its GPU count (`gpu-<n>`: n devices of the class gpu.nvidia.com), made once in the replay's
namespace; the real kube-controller-manager (its resourceclaim controller) makes each pod's
claim, kube-scheduler's DynamicResources plugin allocates the devices. CPU-only pods are as in
the device-plugin replay.

Shared GPUs: the device-plugin replay rounds a pod with gpu_milli < 1000 up to one whole
nvidia.com/gpu (the stack enables no sharing; bench/openb_trace.py, `gpu_request`). Here it
claims one whole GPU device the same way, so both modes replay the same demand. NVIDIA's DRA
driver shares a GPU only between the pods of one claim (time-slicing or MPS in the claim's
config) or through MIG devices of a MIG layout set beforehand; the trace names neither the
pods that would share a claim nor a MIG layout, so either would be a different workload.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.openb_trace import TraceNode
from bench.replay_results import GPU
from components.gpu_resources import GPU_DEVICE_CLASS
from tools.harness.dra import (
    RESOURCE_API,
    claim_pod_spec,
    claim_template,
    resource_slice,
)

DEVICE_CLASSES = f"/apis/{RESOURCE_API}/deviceclasses"
RESOURCE_SLICES = f"/apis/{RESOURCE_API}/resourceslices"
CLAIM_CONTROLLER = "resourceclaim-controller"
"""kube-controller-manager's controller that makes a pod's claims from its templates."""


def claims_path(namespace: str) -> str:
    return f"/apis/{RESOURCE_API}/namespaces/{namespace}/resourceclaims"


def templates_path(namespace: str) -> str:
    return f"/apis/{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"


def template_name(gpus: int) -> str:
    """The claim template of pods asking for `gpus` whole GPUs."""
    if gpus < 1:
        raise ValueError(f"gpus {gpus}: a claim template asks for at least one GPU")
    return f"gpu-{gpus}"


def claim_templates(gpu_counts: Iterable[int]) -> list[dict[str, Any]]:
    """One template per GPU count the pods ask for (CPU-only pods need none), by count."""
    return [
        claim_template(template_name(n), GPU_DEVICE_CLASS, n)
        for n in sorted({n for n in gpu_counts if n > 0})
    ]


def node_slice(node: TraceNode) -> dict[str, Any]:
    """The ResourceSlice the driver publishes for `node`: its GPUs as devices."""
    return resource_slice(node.name, node.gpus)


def dra_capacity(capacity: Mapping[str, str]) -> dict[str, str]:
    """A node's capacity as a kubelet reports it when the DRA driver serves its GPUs."""
    return {name: value for name, value in capacity.items() if name != GPU}


def claim_pod(pod: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """`pod` (bench.replay_cluster.pod_object) asking for its `gpus` through a claim of the
    template of that count instead of nvidia.com/gpu; a CPU-only pod is returned unchanged."""
    if gpus < 1:
        return dict(pod)
    spec = dict(pod["spec"])
    containers = []
    for container in spec.pop("containers"):
        resources = {
            kind: {name: value for name, value in values.items() if name != GPU}
            for kind, values in container.get("resources", {}).items()
        }
        containers.append({**container, "resources": resources})
    return {**pod, "spec": claim_pod_spec(template_name(gpus), containers, **spec)}


def claims_made(pods: Sequence[Mapping[str, Any]]) -> int:
    """How many of `pods` (objects as the API returns them) name every claim they use in their
    status: until then the scheduler's PreEnqueue keeps a pod out of its queue."""
    made = 0
    for pod in pods:
        wanted = {c["name"] for c in pod.get("spec", {}).get("resourceClaims") or []}
        statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
        if wanted and wanted <= {s["name"] for s in statuses if s.get("resourceClaimName")}:
            made += 1
    return made
