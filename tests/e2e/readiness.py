"""When an applied object is ready, as pulumi-kubernetes decides it (its await logic).

Each check takes the live object (a dict as the API server returns it) and returns None once
it is ready, else why not: the message an `up` that timed out would show.
Ref: https://www.pulumi.com/registry/packages/kubernetes/installation-configuration/#await-logic
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

Check = Callable[[Mapping[str, Any], Any], "str | None"]


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _true(obj: Mapping[str, Any], kind: str) -> bool:
    condition = _condition(obj, kind)
    return condition is not None and condition.get("status") == "True"


def _observed(obj: Mapping[str, Any]) -> str | None:
    generation = (obj.get("metadata") or {}).get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    if generation is not None and observed != generation:
        return f"generation {generation} not yet observed (observed {observed})"
    return None


def deployment(obj: Mapping[str, Any], api: Any) -> str | None:
    """Available=True; past the first generation also Progressing with NewReplicaSetAvailable."""
    if reason := _observed(obj):
        return reason
    status = obj.get("status") or {}
    wanted = (obj.get("spec") or {}).get("replicas", 1)
    if status.get("updatedReplicas", 0) < wanted:
        return f"{status.get('updatedReplicas', 0)} of {wanted} replicas updated"
    if not _true(obj, "Available"):
        available = _condition(obj, "Available") or {}
        return f"not Available: {available.get('message', 'no condition yet')}"
    progressing = _condition(obj, "Progressing") or {}
    if (obj.get("metadata") or {}).get("generation", 1) > 1 and progressing.get(
        "reason"
    ) != "NewReplicaSetAvailable":
        return f"rollout in progress: {progressing.get('message', '')}"
    return None


def daemon_set(obj: Mapping[str, Any], api: Any) -> str | None:
    """Every scheduled pod updated and available."""
    if reason := _observed(obj):
        return reason
    status = obj.get("status") or {}
    desired = status.get("desiredNumberScheduled", 0)
    for field in ("updatedNumberScheduled", "numberAvailable"):
        if status.get(field, 0) < desired:
            return f"{field} {status.get(field, 0)} of {desired}"
    return None


def stateful_set(obj: Mapping[str, Any], api: Any) -> str | None:
    if reason := _observed(obj):
        return reason
    status = obj.get("status") or {}
    wanted = (obj.get("spec") or {}).get("replicas", 1)
    if status.get("readyReplicas", 0) < wanted:
        return f"{status.get('readyReplicas', 0)} of {wanted} replicas ready"
    if status.get("currentRevision") != status.get("updateRevision"):
        return "rollout in progress"
    return None


def job(obj: Mapping[str, Any], api: Any) -> str | None:
    if _true(obj, "Failed"):
        return f"failed: {(_condition(obj, 'Failed') or {}).get('message', '')}"
    return None if _true(obj, "Complete") else "not complete"


def pod(obj: Mapping[str, Any], api: Any) -> str | None:
    if (obj.get("status") or {}).get("phase") == "Succeeded":
        return None
    scheduled = _condition(obj, "PodScheduled") or {}
    if scheduled.get("status") == "False":
        return f"unschedulable: {scheduled.get('message', '')}"
    return None if _true(obj, "Ready") else "not Ready"


def service(obj: Mapping[str, Any], api: Any) -> str | None:
    """A Service with a selector waits until a ready pod backs it (an endpoint)."""
    spec = obj.get("spec") or {}
    if spec.get("type") == "ExternalName" or not spec.get("selector"):
        return None
    metadata = obj.get("metadata") or {}
    slices = client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        metadata.get("namespace", "default"),
        label_selector=f"kubernetes.io/service-name={metadata.get('name')}",
    )
    for endpoint_slice in slices.items:
        for endpoint in endpoint_slice.endpoints or []:
            if endpoint.conditions is None or endpoint.conditions.ready is not False:
                return None
    return "no ready endpoint: no ready pod matches the selector"


def custom_resource_definition(obj: Mapping[str, Any], api: Any) -> str | None:
    return None if _true(obj, "Established") else "not Established"


def persistent_volume_claim(obj: Mapping[str, Any], api: Any) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return None if phase == "Bound" else f"phase {phase}"


CHECKS: dict[str, Check] = {
    "apps/v1/Deployment": deployment,
    "apps/v1/DaemonSet": daemon_set,
    "apps/v1/StatefulSet": stateful_set,
    "batch/v1/Job": job,
    "v1/Pod": pod,
    "v1/Service": service,
    "v1/PersistentVolumeClaim": persistent_volume_claim,
    "apiextensions.k8s.io/v1/CustomResourceDefinition": custom_resource_definition,
}


def not_ready(obj: Mapping[str, Any], api: Any) -> str | None:
    """Why `obj` is not ready yet, or None (kinds without a check are ready once they exist)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if annotations.get("pulumi.com/skipAwait") == "true":
        return None
    check = CHECKS.get(f"{obj.get('apiVersion')}/{obj.get('kind')}")
    return check(obj, api) if check is not None else None
