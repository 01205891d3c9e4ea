"""The scheduler section of the stack config: BinpackScheduler's settings model and its rules.

The default profile spreads pods (LeastAllocated), so two 4-GPU nodes that each hold a 1-GPU
pod leave no room for a 2-GPU pod. The binpack profile scores nodes by how full they would be
(NodeResourcesFit with the RequestedToCapacityRatio scoring strategy), weighting GPUs far
above cpu and memory, so GPU pods fill one node before the next. NodeResourcesBalancedAllocation
(weight 3, over cpu, memory and nvidia.com/gpu) keeps a node's GPU share in step with its cpu
and memory shares, so packing does not use up a node's cpu or memory while its GPUs are free.

With `scoring: fragmentation` the profile scores with GpuFragmentation instead (scheduler/, Go):
each pod goes where it uses up the least of the cluster's room for the GPU pod shapes that
arrive; that needs `image`, built from scheduler/ (upstream kube-scheduler lacks the plugin).

A name whose Lease the control plane's own components hold in kube-system (kube-scheduler,
kube-controller-manager, cloud-controller-manager, apiserver-*) is refused: the two would take
turns at one lock and one of them would stop. What counts as a GPU is the one definition in
components/gpu_resources.py; `gpuResources` adds names to it, for the scheduler, the admission
gate and the monitoring alike (gpu_resources_with()).

# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Self

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from components.gpu_resources import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    GPU_RESOURCE_NAME,
    GPU_RESOURCES_SHOWN,
    GpuResources,
    is_gpu_resource,
)
from components.handoffs import NO_NEEDS, ControlPlaneNeeds
from components.images import IMAGE
from components.kubernetes_names import is_dns1123_label, is_qualified_name
from components.settings import BOOL, Settings, between, choice, problem, text, unique

GANG_NAMESPACE = text(
    is_dns1123_label,
    "expected the name of a namespace (DNS-1123 label) whose PodGroups the stack's scheduler "
    "places",
)
# The cluster's own kube-scheduler answers to this name; a second profile with it would make
# every ordinary pod a candidate for both schedulers.
DEFAULT_SCHEDULER = "default-scheduler"
DEFAULT_SCHEDULER_NAME = "gpu-binpack-scheduler"
# The leader-election Leases the control plane's components hold in kube-system, where this
# scheduler's Lease, named after it, lives too: kube-scheduler's and kube-controller-manager's
# (their leaderElection.resourceName defaults), cloud-controller-manager's, and each API
# server's identity Lease, apiserver-<hash of its host name>.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/scheduler/apis/config/v1/defaults.go
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-controller-manager/app/options/options.go
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/server/config.go
CONTROL_PLANE_LEASES = ("kube-scheduler", "kube-controller-manager", "cloud-controller-manager")
CONTROL_PLANE_LEASE_PREFIX = "apiserver-"
# Resources a pod can request without a domain.
# Ref: https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/
NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage")
# GpuFragmentation models at most 16 GPU resources (whole, shared and MIG profiles together,
# scheduler/fragmentation/model.go MaxKinds): the added names leave room for the operator's.
MAX_ADDED_GPU_RESOURCES = 8
_HUGEPAGES = re.compile(r"hugepages-[0-9]+(Ki|Mi|Gi|Ti|Pi|Ei)?", re.ASCII)


class ShapePoint(Settings):
    """One point of the utilization -> score curve."""

    utilization: Annotated[int, between(0, 100)]
    """Requested / allocatable, in percent."""
    score: Annotated[int, between(0, 10)]
    """Score at that utilization (kube-scheduler's maximum is 10)."""


@dataclass(frozen=True, kw_only=True)
class ResourceWeight:
    """How much one resource counts in the node score."""

    name: str
    """Resource name, e.g. nvidia.com/gpu."""
    weight: int
    """Weight (1..100)."""


DEFAULT_SHAPE = (ShapePoint(utilization=0, score=0), ShapePoint(utilization=100, score=10))
DEFAULT_WEIGHTS = (
    ResourceWeight(name="nvidia.com/gpu", weight=100),
    ResourceWeight(name="cpu", weight=1),
    ResourceWeight(name="memory", weight=1),
)
# Balancing the GPU share against the cpu and memory shares keeps packed nodes from running out
# of cpu or memory first and stranding their free GPUs (bench/README.md, the sweep; upstream's
# default is weight 1 over cpu and memory).
DEFAULT_BALANCED_WEIGHT = 3
DEFAULT_BALANCED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")

# How the profile scores nodes: kube-scheduler's own plugins (RequestedToCapacityRatio and
# BalancedAllocation, above), or the GpuFragmentation plugin of scheduler/ (an image built from
# it: README, "The fragmentation-aware scheduler").
BINPACK = "binpack"
FRAGMENTATION = "fragmentation"
SCORINGS = (BINPACK, FRAGMENTATION)

# Gang scheduling: kube-scheduler's GangScheduling plugin, on in every profile with the
# GenericWorkload feature gate (beta and off by default in v1.37), over the PodGroups of
# scheduling.k8s.io/v1beta1, which the API server serves only with that gate and the version
# turned on (runtime-config). v1.35 and v1.36 have only alpha APIs of another shape
# (spec.workloadRef, then scheduling.k8s.io/v1alpha2).
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/scheduler/apis/config/v1/default_plugins.go
GANG_FEATURE_GATE = "GenericWorkload"
GANG_GROUP_VERSION = "scheduling.k8s.io/v1beta1"
GANG_RESOURCE = "podgroups"
GANG_MIN_MINOR = 37
UPSTREAM_IMAGE = "registry.k8s.io/kube-scheduler"
# Nothing advertised: the GPU resources of the settings alone (no GPU Operator).
NO_GPU_RESOURCES = GpuResources(names=(), prefixes=())


@dataclass(frozen=True, kw_only=True)
class SchedulerProfile:
    """What the KubeSchedulerConfiguration says; rendered by `render_config`."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    """Profile schedulerName that GPU pods set in spec.schedulerName."""
    shape: Sequence[ShapePoint] = DEFAULT_SHAPE
    """Utilization -> score curve; rising means bin-packing."""
    resources: Sequence[ResourceWeight] = DEFAULT_WEIGHTS
    """Resources scored, with weights."""
    percentage_of_nodes_to_score: int | None = None
    """Share of feasible nodes scored per pod; None keeps the scheduler's adaptive default."""
    balanced_weight: int = DEFAULT_BALANCED_WEIGHT
    """NodeResourcesBalancedAllocation's plugin weight; 0 disables the plugin."""
    balanced_resources: Sequence[str] = DEFAULT_BALANCED_RESOURCES
    """Resources whose requested shares BalancedAllocation keeps even on a node."""
    leader_elect: bool = True
    """Take part in leader election (off only for a single local process)."""
    lease_namespace: str = "kube-system"
    """Namespace of the scheduler's own Lease."""
    scoring: str = BINPACK
    """binpack (the plugins above) or fragmentation (GpuFragmentation, over the GPU
    resources among `resources`)."""
    shared_gpus: Sequence[tuple[str, int]] = ()
    """(name, replicas) of time-sliced GPU resources: GpuFragmentation counts one unit as
    1/replicas of a GPU."""
    mig_prefix: str = ""
    """Prefix of MIG profile resources GpuFragmentation counts as slices of a GPU; "" for
    none (no MIG, or MIG devices advertised as whole GPUs)."""
    gpus: GpuResources | None = None
    """The GPU resources pods ask for (BinpackSchedulerSettings.gpu_resources_with()): GPUs
    besides components/gpu_resources.py's GPU_NAMES and GPU_PREFIXES."""
    gang_scheduling: bool = False
    """Gang scheduling of PodGroups (the GenericWorkload gate on the scheduler)."""
    claim_binpack: bool = False
    """Score pods that ask for DRA GPUs through ResourceClaims by how full the node's devices
    would be (GpuClaimBinpack, in the image built from scheduler/; scoring binpack only)."""

    @property
    def feature_gates(self) -> dict[str, bool]:
        """The feature gates the scheduler runs with (none but what gangs need)."""
        return {GANG_FEATURE_GATE: True} if self.gang_scheduling else {}

    def __post_init__(self) -> None:
        lease = lease_conflict(self.scheduler_name)
        if lease:
            raise ValueError(f"scheduler_name: got {self.scheduler_name!r}; {lease}")

    @property
    def gpu_resource_names(self) -> tuple[str, ...]:
        """The GPU resources the profile weighs (GpuFragmentation counts them as GPUs)."""
        return tuple(r.name for r in self.resources if is_gpu_resource(r.name, self.gpus))

    @property
    def gpu_weight(self) -> int:
        """The heaviest weight of a GPU resource among `resources` (0 without one)."""
        gpus = set(self.gpu_resource_names)
        return max((r.weight for r in self.resources if r.name in gpus), default=0)


def dra_resource_names(gpus: GpuResources) -> tuple[str, ...]:
    """The extended resource names of DeviceClasses among `gpus` (allocation dra:
    GpuOperatorSettings.gpu_resources()); none with the device plugin."""
    return tuple(n for n in gpus.names if n.startswith(DEVICE_CLASS_RESOURCE_PREFIX))


def is_upstream_image(image: str | None) -> bool:
    """Unset (the upstream image, tagged kubernetesVersion) or registry.k8s.io/kube-scheduler."""
    return image is None or image.startswith((f"{UPSTREAM_IMAGE}:", f"{UPSTREAM_IMAGE}@"))


def lease_conflict(name: str) -> str:
    """Why a scheduler named `name` would contend for a control-plane Lease; "" if it does not."""
    if name in CONTROL_PLANE_LEASES or name.startswith(CONTROL_PLANE_LEASE_PREFIX):
        return (
            f"its leader-election Lease kube-system/{name} would be one the control plane "
            f"holds ({', '.join(CONTROL_PLANE_LEASES)}, {CONTROL_PLANE_LEASE_PREFIX}*): "
            f"choose another name, e.g. {DEFAULT_SCHEDULER_NAME}"
        )
    return ""


def _at_most(count: int) -> Callable[[Sequence[str]], Sequence[str]]:
    """An AfterValidator for lists: `count` items at most."""

    def check(items: Sequence[str]) -> Sequence[str]:
        if len(items) > count:
            raise problem(
                f"expected at most {count} names (the fragmentation scheduler models 16 GPU "
                "resources, the GPU Operator's and MIG profiles included)"
            )
        return items

    return check


def is_requestable_resource(name: str) -> bool:
    """A resource name a pod can request: native (cpu, memory, ...) or `domain/name`."""
    if name in NATIVE_RESOURCES or _HUGEPAGES.fullmatch(name):
        return True
    return "/" in name and is_qualified_name(name)


SCHEDULER_NAME = text(
    lambda v: is_dns1123_label(v) and v != DEFAULT_SCHEDULER,
    "expected a DNS-1123 label (lowercase alphanumerics and '-', <= 63) other than "
    f"{DEFAULT_SCHEDULER}, which the cluster's own kube-scheduler uses",
)
RESOURCE_NAME = text(
    is_requestable_resource,
    "expected a resource a pod can request: cpu, memory, ephemeral-storage, hugepages-<size> "
    "or domain/name (e.g. nvidia.com/gpu)",
)


class BalancedAllocationSettings(Settings):
    """NodeResourcesBalancedAllocation in the binpack profile."""

    weight: Annotated[
        int, between(0, 100, "expected a plugin weight from 0 (plugin off) to 100")
    ] = DEFAULT_BALANCED_WEIGHT
    """Plugin weight in the node score (NodeResourcesFit's is 1); 0 turns the plugin off."""
    resources: Annotated[
        tuple[Annotated[str, RESOURCE_NAME], ...],
        AfterValidator(unique("each resource at most once")),
    ] = DEFAULT_BALANCED_RESOURCES
    """Resources whose requested / allocatable shares the plugin keeps even (at least two)."""

    @field_validator("resources")
    @classmethod
    def _two_or_more(cls, resources: tuple[str, ...]) -> tuple[str, ...]:
        if len(resources) < 2:
            raise problem(
                "expected at least two resources (the plugin balances their shares), "
                "e.g. [cpu, memory, nvidia.com/gpu]",
                value=list(resources),
            )
        return resources


class BinpackSchedulerSettings(Settings):
    """The bin-packing kube-scheduler (the stack config's scheduler)."""

    name: Annotated[str, SCHEDULER_NAME] = DEFAULT_SCHEDULER_NAME
    """Profile schedulerName that GPU pods set in spec.schedulerName."""
    replicas: Annotated[int, between(1, 5)] = 2
    """Deployment replicas; leader election makes more than one safe."""
    shape: tuple[ShapePoint, ...] = DEFAULT_SHAPE
    """Utilization -> score curve (RequestedToCapacityRatio); rising means bin-packing."""
    resource_weights: dict[
        Annotated[str, RESOURCE_NAME],
        Annotated[int, between(1, 100, "expected an integer weight from 1 to 100")],
    ] = Field(default_factory=lambda: {w.name: w.weight for w in DEFAULT_WEIGHTS})
    """{resource name: weight} scored by the profile; at least one must be a GPU resource."""
    percentage_of_nodes_to_score: Annotated[int, between(0, 100)] | None = None
    """Share of feasible nodes scored per pod; unset keeps the scheduler's adaptive default."""
    balanced_allocation: BalancedAllocationSettings = Field(
        default_factory=lambda: BalancedAllocationSettings()
    )
    """NodeResourcesBalancedAllocation: prefer nodes whose resources end up used in even shares."""
    scoring: Annotated[str, choice(SCORINGS)] = BINPACK
    """How nodes are scored: binpack (kube-scheduler's own plugins: shape, resourceWeights,
    balancedAllocation) or fragmentation (the GpuFragmentation plugin: each pod goes where it
    uses up the least room of the GPU pod shapes that arrive; needs scheduler.image)."""
    image: Annotated[str, IMAGE] | None = None
    """Scheduler image, repository:tag or repository@sha256:digest; unset:
    registry.k8s.io/kube-scheduler:<kubernetesVersion>. scoring fragmentation needs an image
    built from scheduler/ (README: the fragmentation-aware scheduler)."""
    gpu_resources: Annotated[
        tuple[Annotated[str, GPU_RESOURCE_NAME], ...],
        AfterValidator(unique("each resource at most once")),
        AfterValidator(_at_most(MAX_ADDED_GPU_RESOURCES)),
    ] = ()
    """Extended resources that are GPUs besides the built-in ones (nvidia.com/gpu,
    nvidia.com/gpu.shared, nvidia.com/mig-*, amd.com/gpu, gpu.intel.com/i915,
    gpu.intel.com/xe), e.g. AMD partitions (amd.com/cpx_nps4) or a renamed time-sliced GPU: the
    scheduler weighs them like its heaviest GPU resource, the gate routes pods that ask for
    them, the monitoring counts them (at most 8). Any other resource, NICs in nvidia.com
    included (nvidia.com/hostdev), is no GPU."""

    gang_scheduling: Annotated[bool, BOOL] = False
    """Gang scheduling: the pods of a PodGroup (scheduling.k8s.io/v1beta1, policy gang with
    minCount; each pod names it in spec.schedulingGroup.podGroupName) are bound all together
    or not at all, in either scoring. Needs Kubernetes v1.37 and an API server serving
    scheduling.k8s.io/v1beta1 with the GenericWorkload feature gate: with controlPlane.enabled
    the stack turns both on; without, the preview checks the cluster serves PodGroups."""
    gang_namespaces: Annotated[
        tuple[Annotated[str, GANG_NAMESPACE], ...],
        AfterValidator(unique("each namespace at most once")),
    ] = ()
    """With gangScheduling, the namespaces whose PodGroups the stack's scheduler places: the
    gate keeps every pod of a PodGroup there on it, a CPU-only launcher too. Empty: every
    namespace (every PodGroup of the cluster). Elsewhere a PodGroup's pods are judged as any
    pod (GPU pods routed, the others left to their scheduler), so another team's gangs on
    another scheduler are neither moved nor refused."""

    @field_validator("name")
    @classmethod
    def _own_lease(cls, name: str) -> str:
        lease = lease_conflict(name)
        if lease:
            raise problem(lease)
        return name

    @model_validator(mode="after")
    def _fragmentation_needs_its_image(self) -> Self:
        if self.scoring == FRAGMENTATION and self.image is None:
            raise problem(
                "scoring fragmentation needs the GpuFragmentation plugin, which "
                f"{UPSTREAM_IMAGE} does not have: set scheduler.image to an image built from "
                "scheduler/ (README), or use scoring binpack",
                at=".image",
                value="unset",
            )
        if self.scoring == FRAGMENTATION:
            # A binpack key changed from its default would have no effect: say so.
            defaults = BinpackSchedulerSettings.model_construct()
            for field in ("shape", "resource_weights", "balanced_allocation"):
                if getattr(self, field) != getattr(defaults, field):
                    raise problem(
                        "applies to scoring binpack only; GpuFragmentation scores by the pod "
                        "shapes it learns (remove the key, or use scoring binpack)",
                        at=f".{to_camel(field)}",
                        value=getattr(self, field),
                    )
        return self

    @field_validator("shape")
    @classmethod
    def _rising(cls, shape: tuple[ShapePoint, ...]) -> tuple[ShapePoint, ...]:
        if len(shape) < 2:
            raise problem(
                "expected at least two {utilization, score} points",
                value=[p.model_dump() for p in shape],
            )
        for i in range(1, len(shape)):
            previous = shape[i - 1].utilization
            if shape[i].utilization <= previous:
                raise problem(
                    f"utilizations must strictly increase; previous is {previous}",
                    at=f"[{i}].utilization",
                    value=shape[i].utilization,
                )
        return shape

    @model_validator(mode="after")
    def _gang_namespaces_need_gangs(self) -> Self:
        if self.gang_namespaces and not self.gang_scheduling:
            raise problem(
                "gangNamespaces says whose PodGroups the stack's scheduler places, which it does "
                "only with scheduler.gangScheduling true: set it, or leave gangNamespaces empty",
                at=".gangNamespaces",
                value=list(self.gang_namespaces),
            )
        return self

    @model_validator(mode="after")
    def _weights_a_gpu(self) -> Self:
        added = self.gpu_resources_with(NO_GPU_RESOURCES)
        if not any(is_gpu_resource(name, added) for name in self.resource_weights):
            raise problem(
                f"expected at least one GPU resource ({GPU_RESOURCES_SHOWN}, or one of "
                "scheduler.gpuResources); without one the profile does not bin-pack GPU pods",
                at=".resourceWeights",
                value=self.resource_weights,
            )
        return self

    @property
    def control_plane_needs(self) -> ControlPlaneNeeds:
        """What the control plane must have on for these settings: with gangs, the
        GenericWorkload gate and scheduling.k8s.io/v1beta1."""
        if not self.gang_scheduling:
            return NO_NEEDS
        return ControlPlaneNeeds(
            key="scheduler.gangScheduling",
            feature_gates={GANG_FEATURE_GATE: True},
            runtime_config={GANG_GROUP_VERSION: True},
        )

    def gpu_resources_with(self, advertised: GpuResources) -> GpuResources:
        """The GPU resources pods ask for: what the device plugin advertises
        (GpuOperatorSettings.gpu_resources()) and `gpu_resources`."""
        return advertised.adding(self.gpu_resources)

    @property
    def profile(self) -> SchedulerProfile:
        """The KubeSchedulerConfiguration profile these settings describe (no GPU Operator)."""
        return self.profile_with(NO_GPU_RESOURCES)

    def profile_with(self, advertised: GpuResources) -> SchedulerProfile:
        """The profile with what the device plugin advertises: every GPU resource
        (gpu_resources_with()) that resource_weights leaves out is weighted like its heaviest
        GPU resource; GpuFragmentation counts them, time-sliced ones and MIG profiles too.

        With DRA (`advertised` names DeviceClasses' extended resources): BalancedAllocation
        balances those names too when it balances a GPU resource, and, with scoring binpack
        and an image of this project's (not upstream's), GpuClaimBinpack scores the pods that
        ask through ResourceClaims. Nothing changes for the device plugin."""
        gpus = self.gpu_resources_with(advertised)
        weights = dict(self.resource_weights)
        gpu_weight = max(w for n, w in weights.items() if is_gpu_resource(n, gpus))
        for name in gpus.names:
            weights.setdefault(name, gpu_weight)
        dra = dra_resource_names(gpus)
        balanced = self.balanced_allocation.resources
        if dra and any(is_gpu_resource(r, gpus) for r in balanced):
            balanced = tuple(dict.fromkeys([*balanced, *dra]))
        return SchedulerProfile(
            scheduler_name=self.name,
            shape=self.shape,
            resources=tuple(ResourceWeight(name=n, weight=w) for n, w in weights.items()),
            percentage_of_nodes_to_score=self.percentage_of_nodes_to_score,
            balanced_weight=self.balanced_allocation.weight,
            balanced_resources=balanced,
            scoring=self.scoring,
            shared_gpus=gpus.shared,
            mig_prefix=next(iter(gpus.prefixes), ""),
            gpus=gpus,
            gang_scheduling=self.gang_scheduling,
            claim_binpack=bool(dra)
            and self.scoring == BINPACK
            and not is_upstream_image(self.image),
        )
