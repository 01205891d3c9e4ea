"""The gate's sample table (components/opa_gate/policies/samples.yaml): sample pods and the verdict each
engine must reach on them, read into plain objects for the live tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict, cast

import yaml

from components.gpu_resources import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    allocation_device_classes,
    gated_names,
    gated_prefixes,
)

SAMPLES_FILE = (
    Path(__file__).resolve().parents[2] / "components" / "opa_gate" / "policies" / "samples.yaml"
)
Verdict = Literal["allowed", "routed", "refused"]
VERDICTS: tuple[Verdict, ...] = ("allowed", "routed", "refused")
# The engines that only refuse, and the one that routes.
REFUSING_ENGINES = ("opa", "validating-admission-policy")
ROUTING_ENGINE = "mutating-admission-policy"
# Where a sample is created: a namespace the gate judges, the GPU Operator's own, or one whose
# pods may name the stack's PriorityClasses without a GPU (priority_class_namespaces).
Namespace = Literal["gated", "operator", "serving"]
NAMESPACES: tuple[Namespace, ...] = ("gated", "operator", "serving")
# What a sample's container may carry besides its resources' limits and claims.
CONTAINER_FIELDS = ("env", "securityContext")
# The name of the ephemeral container a sample's `debug` adds.
DEBUG_CONTAINER = "debug-0"


# In the table, stand for the GPU Operator's namespace and for the namespace a sample is
# created in (the test chooses both names).
OPERATOR_PLACEHOLDER = "{operator}"
NAMESPACE_PLACEHOLDER = "{namespace}"
# In a message, stand for the pod (namespace/name) and for the `serving` namespace.
POD_PLACEHOLDER = "{pod}"
SERVING_PLACEHOLDER = "{serving}"


@dataclass(frozen=True)
class Identity:
    """Who creates the pod (impersonated): a user name and its groups."""

    user: str
    groups: tuple[str, ...]

    def in_namespaces(self, operator: str, namespace: str) -> Identity:
        """This identity with OPERATOR_PLACEHOLDER and NAMESPACE_PLACEHOLDER replaced."""

        def filled(text: str) -> str:
            return text.replace(OPERATOR_PLACEHOLDER, operator).replace(
                NAMESPACE_PLACEHOLDER, namespace
            )

        return Identity(user=filled(self.user), groups=tuple(filled(g) for g in self.groups))


@dataclass(frozen=True)
class Sample:
    name: str
    spec: dict[str, Any]
    """The pod's spec as a user writes it; containers hold only their resources' limits and
    claims (and CONTAINER_FIELDS), and get a name and image when built."""
    refuse: Verdict
    """The verdict of the refusing engines."""
    route: Verdict
    """The verdict of the routing engine."""
    message: str | None
    """Part of the refusal message; {pod} stands for namespace/name, {serving} for the
    `serving` namespace."""
    namespace: Namespace = "gated"
    """Where the pod is created."""
    identity: Identity | None = None
    """Who creates it, OPERATOR_PLACEHOLDER standing for the operator's namespace; None: the
    cluster admin."""
    metadata: dict[str, Any] | None = None
    """Annotations and owner references of the pod."""
    bind: str | None = None
    """The node the pod is bound to (pods/binding) once created, before `debug`."""
    debug: dict[str, Any] | None = None
    """An ephemeral container (its env) added to the created pod by an UPDATE of
    pods/ephemeralcontainers, as `kubectl debug` adds one: the verdicts are this update's."""
    tolerate: list[dict[str, Any]] | None = None
    """Tolerations added to the created pod by an UPDATE of the pod (a pod's tolerations may
    grow): the verdicts are this update's."""

    @property
    def updates(self) -> bool:
        """Whether the verdicts are those of an update of the created pod, not its creation."""
        return self.debug is not None or self.tolerate is not None

    def verdict(self, engine: str) -> Verdict:
        return self.route if engine == ROUTING_ENGINE else self.refuse

    def wanted(self, pod: str, serving: str) -> str:
        """The part of the refusal the table expects ("" when none), for the pod `pod`
        (namespace/name) and the `serving` namespace `serving`."""
        return (
            (self.message or "").replace(POD_PLACEHOLDER, pod).replace(SERVING_PLACEHOLDER, serving)
        )

    def creator(self, operator_namespace: str, namespace: str) -> Identity | None:
        """Who creates the pod, when the operator's namespace is `operator_namespace` and the
        pod's is `namespace`."""
        if self.identity is None:
            return None
        return self.identity.in_namespaces(operator_namespace, namespace)

    def debug_container(self) -> dict[str, Any]:
        """The ephemeral container `debug` describes, named and with an image."""
        assert self.debug is not None, f"{self.name} adds no ephemeral container"
        return {
            "name": DEBUG_CONTAINER,
            "image": "registry.invalid/debug:1",
            **{k: self.debug[k] for k in CONTAINER_FIELDS if k in self.debug},
        }

    def pod(self, name: str) -> dict[str, Any]:
        spec = dict(self.spec)
        for field in ("containers", "initContainers"):
            if field in spec:
                spec[field] = [
                    {
                        "name": f"{field.lower()[:4]}-{i}",
                        "image": "registry.invalid/sample:1",
                        "resources": {
                            k: container[k] for k in ("limits", "claims") if k in container
                        },
                        **{k: container[k] for k in CONTAINER_FIELDS if k in container},
                    }
                    for i, container in enumerate(spec[field])
                ]
        spec.setdefault("automountServiceAccountToken", False)
        metadata = {**(self.metadata or {}), "name": name}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


# The API group and version of what a pod's resource claims name.
RESOURCE_API = "resource.k8s.io/v1"
CLAIM_KINDS = ("ResourceClaimTemplate", "ResourceClaim")
# The engines that judge DRA claims (the stack config refuses opa with DRA).
DRA_ENGINES = ("validating-admission-policy", ROUTING_ENGINE)


@dataclass(frozen=True)
class ClaimObject:
    """A ResourceClaimTemplate or ResourceClaim of the DRA samples' namespace."""

    kind: str
    name: str
    requests: tuple[str | tuple[str, ...], ...]
    """Each device request's DeviceClass (exactly), or its firstAvailable alternatives."""

    def classes(self) -> set[str]:
        """Every DeviceClass the object's requests may be allocated from."""
        return {c for r in self.requests for c in ((r,) if isinstance(r, str) else r)}

    def manifest(self) -> dict[str, Any]:
        """The object as the API takes it (resource.k8s.io/v1), one device of each class."""

        def one(name: str, device_class: str) -> dict[str, Any]:
            return {
                "name": name,
                "deviceClassName": device_class,
                "allocationMode": "ExactCount",
                "count": 1,
            }

        requests: list[dict[str, Any]] = []
        for i, request in enumerate(self.requests):
            if isinstance(request, str):
                exactly = one(f"r{i}", request)
                del exactly["name"]
                requests.append({"name": f"r{i}", "exactly": exactly})
            else:
                requests.append(
                    {
                        "name": f"r{i}",
                        "firstAvailable": [one(f"a{j}", c) for j, c in enumerate(request)],
                    }
                )
        claim_spec = {"devices": {"requests": requests}}
        spec = {"spec": claim_spec} if self.kind == "ResourceClaimTemplate" else claim_spec
        return {
            "apiVersion": RESOURCE_API,
            "kind": self.kind,
            "metadata": {"name": self.name},
            "spec": spec,
        }


@dataclass(frozen=True)
class DraTable:
    """The DRA samples: the objects their claims name, and the verdicts of the native engines
    under a DRA stack's gate data."""

    device_classes: tuple[str, ...]
    """The GPU DeviceClasses (the GPU Operator's with allocation dra)."""
    other_classes: tuple[str, ...]
    """DeviceClasses of devices that are no GPU (NICs, dongles)."""
    objects: list[ClaimObject]
    samples: list[Sample]

    @property
    def gpu_resources(self) -> list[str]:
        """The extended resource names of the GPU DeviceClasses (DRAExtendedResource)."""
        return [DEVICE_CLASS_RESOURCE_PREFIX + c for c in self.device_classes]

    def lookups(self) -> dict[str, list[dict[str, Any]]]:
        """The objects by kind, as the claim policies' paramRef selector finds them."""
        return {
            kind: [o.manifest() for o in self.objects if o.kind == kind] for kind in CLAIM_KINDS
        }

    def asks_for_gpu(self, sample: Sample) -> bool:
        """Whether the sample's pod asks for a GPU in DRA mode: a GPU class's extended resource
        above zero, or a claim naming an object that may be allocated from a GPU class."""
        by_reference = {
            (
                "resourceClaimTemplateName"
                if o.kind == "ResourceClaimTemplate"
                else "resourceClaimName",
                o.name,
            ): o
            for o in self.objects
        }
        for claim in sample.spec.get("resourceClaims", []):
            for field in ("resourceClaimTemplateName", "resourceClaimName"):
                found = by_reference.get((field, claim.get(field, "")))
                if found is not None and found.classes() & set(self.device_classes):
                    return True
        containers = [
            c for field in ("containers", "initContainers") for c in sample.spec.get(field, [])
        ]
        return any(
            name in self.gpu_resources and str(value) not in ("0", "0m")
            for c in containers
            for name, value in (c.get("limits") or {}).items()
        )


class PoolFence(TypedDict):
    """gate_data()'s arguments for the pool's nodes and where pods without a GPU may run there."""

    pool_nodes: list[str]
    pool_namespaces: list[str]
    pool_daemonsets: list[str]


@dataclass(frozen=True)
class SampleTable:
    scheduler: str
    gpu_resources: list[str]
    gpu_resource_prefixes: list[str]
    pool_taint: dict[str, str]
    """The GPU pool's taint (TaintedGpuPool's gpuPool.taint)."""
    gang_pods: bool
    """Whether the stack's scheduler places gangs (scheduler.gangScheduling)."""
    gang_namespaces: tuple[Namespace, ...]
    """The namespaces (by kind) whose PodGroups it places (scheduler.gangNamespaces)."""
    pool_nodes: list[str]
    """The GPU pool's nodes (TaintedGpuPool's nodes)."""
    pool_namespaces: tuple[Namespace, ...]
    """The namespaces (by kind) whose pods may run on them without a GPU
    (admission.poolNamespaces)."""
    pool_daemonsets: tuple[tuple[Namespace, str], ...]
    """The DaemonSets (namespace kind, name) whose pods may (admission.poolDaemonSets)."""
    priority_classes: list[str]
    """The stack's PriorityClasses (GpuPriorityClasses' names): for GPU pods, and for pods in
    the `serving` namespace (the gate data's priority_class_namespaces)."""
    other_priority_classes: list[str]
    """PriorityClasses of the cluster that are not the stack's."""
    samples: list[Sample]
    """Judged under a device-plugin stack's gate data, by every engine."""
    dra: DraTable
    """Judged under a DRA stack's gate data, by DRA_ENGINES."""

    def gang_namespace_names(self, names: Mapping[Namespace, str]) -> list[str]:
        """The gate data's gang_namespaces, with `names` the test's name for each kind."""
        return [names[kind] for kind in self.gang_namespaces]

    def pool_fence(self, names: Mapping[Namespace, str]) -> PoolFence:
        """gate_data()'s pool_nodes, pool_namespaces and pool_daemonsets, with `names` the
        test's name for each namespace kind."""
        return {
            "pool_nodes": list(self.pool_nodes),
            "pool_namespaces": [names[kind] for kind in self.pool_namespaces],
            "pool_daemonsets": [f"{names[kind]}/{name}" for kind, name in self.pool_daemonsets],
        }

    def priority_class_objects(self) -> list[dict[str, Any]]:
        """The PriorityClasses the samples name (scheduling.k8s.io/v1), as a live test creates
        them: the Priority admission plugin refuses a pod whose class does not exist."""
        names = [*self.priority_classes, *self.other_priority_classes]
        return [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": 1000 * (len(names) - i),
            }
            for i, name in enumerate(names)
        ]

    def asks_for_gpu(self, sample: Sample) -> bool:
        """Whether the sample's pod asks for a GPU as the gate counts them: a resource the gate
        data gates (every GPU of components/gpu_resources.py and the table's) above zero in a
        container's limits, or a DRA claim."""
        names = set(gated_names(self.gpu_resources))
        prefixes = tuple(gated_prefixes(self.gpu_resource_prefixes))
        containers = [
            c for field in ("containers", "initContainers") for c in sample.spec.get(field, [])
        ]
        return bool(sample.spec.get("resourceClaims")) or any(
            (name in names or name.startswith(prefixes)) and str(value) not in ("0", "0m")
            for c in containers
            for name, value in (c.get("limits") or {}).items()
        )


def _identity(raw: dict[str, Any] | None) -> Identity | None:
    if raw is None:
        return None
    return Identity(user=raw["user"], groups=tuple(raw.get("groups", ())))


def _samples(entries: list[Any]) -> list[Sample]:
    samples = []
    for entry in entries:
        both = entry.get("verdict")
        samples.append(
            Sample(
                name=entry["name"],
                spec=entry["pod"],
                refuse=entry.get("refuse", both),
                route=entry.get("route", both),
                message=entry.get("message"),
                namespace=entry.get("namespace", "gated"),
                identity=_identity(entry.get("as")),
                metadata=entry.get("metadata"),
                bind=entry.get("bind"),
                debug=entry.get("debug"),
                tolerate=entry.get("tolerate"),
            )
        )
    return samples


def _claim_object(raw: dict[str, Any]) -> ClaimObject:
    if raw["kind"] not in CLAIM_KINDS:
        raise ValueError(f"dra.objects: kind {raw['kind']!r} is not one of {list(CLAIM_KINDS)}")
    requests = tuple(r if isinstance(r, str) else tuple(r) for r in raw["requests"])
    return ClaimObject(kind=raw["kind"], name=raw["name"], requests=requests)


def _namespace_kinds(raw: list[str]) -> tuple[Namespace, ...]:
    unknown = sorted(set(raw) - set(NAMESPACES))
    if unknown:
        raise ValueError(f"namespace kinds {unknown} are not one of {list(NAMESPACES)}")
    return tuple(cast(Namespace, kind) for kind in raw)


def load_samples(path: Path = SAMPLES_FILE) -> SampleTable:
    raw = yaml.safe_load(path.read_text())
    dra = raw["dra"]
    return SampleTable(
        scheduler=raw["scheduler"],
        gpu_resources=list(raw["gpu_resources"]),
        gpu_resource_prefixes=list(raw["gpu_resource_prefixes"]),
        pool_taint=dict(raw["pool_taint"]),
        gang_pods=bool(raw.get("gang_pods", False)),
        gang_namespaces=_namespace_kinds(raw.get("gang_namespaces", [])),
        pool_nodes=list(raw.get("pool_nodes", [])),
        pool_namespaces=_namespace_kinds(raw.get("pool_namespaces", [])),
        pool_daemonsets=tuple(
            (_namespace_kinds([d["namespace"]])[0], d["name"])
            for d in raw.get("pool_daemonsets", [])
        ),
        priority_classes=list(raw.get("priority_classes", [])),
        other_priority_classes=list(raw.get("other_priority_classes", [])),
        samples=_samples(raw["samples"]),
        dra=DraTable(
            device_classes=allocation_device_classes("dra"),
            other_classes=tuple(dra["other_classes"]),
            objects=[_claim_object(o) for o in dra["objects"]],
            samples=_samples(dra["samples"]),
        ),
    )
