"""BinpackScheduler: a second kube-scheduler that packs GPU pods onto the fewest nodes.

The default profile spreads pods (LeastAllocated), so two 4-GPU nodes that each hold a 1-GPU
pod leave no room for a 2-GPU pod. This profile scores nodes by how full they would be
(NodeResourcesFit with the RequestedToCapacityRatio scoring strategy), weighting GPUs far
above cpu and memory, so GPU pods fill one node before the next. NodeResourcesBalancedAllocation
(weight 3, over cpu, memory and nvidia.com/gpu) keeps a node's GPU share in step with its cpu
and memory shares, so packing does not use up a node's cpu or memory while its GPUs are free.

With `scoring: fragmentation` the profile scores with GpuFragmentation instead (scheduler/, Go):
each pod goes where it uses up the least of the cluster's room for the GPU pod shapes that
arrive; that needs `image`, built from scheduler/ (upstream kube-scheduler lacks the plugin).

It runs as a Deployment of registry.k8s.io/kube-scheduler:<kubernetesVersion> (or `image`) in
kube-system, reading a kubescheduler.config.k8s.io/v1 configuration from a ConfigMap whose hash
is a pod annotation (a config change rolls the pods). It authenticates with its ServiceAccount (no
hostPath to the control plane's scheduler.conf), serves HTTPS on 10259 with /livez and /readyz
probes, runs with system-cluster-critical priority, tolerates the control-plane taint and elects
a leader on its own Lease named after the scheduler. RBAC is kubeadm's scheduler roles plus one
Role on that Lease, because system:kube-scheduler only covers the Lease named kube-scheduler.
A name whose Lease the control plane's own components hold in kube-system (kube-scheduler,
kube-controller-manager, cloud-controller-manager, apiserver-*) is refused: the two would take
turns at one lock and one of them would stop. What counts as a GPU is the one definition in
components/gpu_resources.py, which the admission gate uses too.
The rendered configuration is an output (stack output `schedulerConfig`).

# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, Self

import pulumi
import pulumi_kubernetes as k8s
import yaml
from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from components.cluster_access import ClusterAccess
from components.gpu_resources import GpuResources, is_gpu_resource
from components.settings import (
    DEVICE_PLUGIN_DOMAINS,
    IMAGE,
    Runtime,
    Settings,
    between,
    choice,
    is_dns1123_label,
    is_qualified_name,
    problem,
    text,
    unique,
)

TOKEN = "gpu-cluster:index:BinpackScheduler"
CONFIG_KEY = "config.yaml"
CONFIG_DIR = "/etc/kubernetes/gpu-binpack-scheduler"
SECURE_PORT = 10259
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
BALANCED_ALLOCATION = "NodeResourcesBalancedAllocation"
NODE_RESOURCES_FIT = "NodeResourcesFit"

# How the profile scores nodes: kube-scheduler's own plugins (RequestedToCapacityRatio and
# BalancedAllocation, above), or the GpuFragmentation plugin of scheduler/ (an image built from
# it: README, "The fragmentation-aware scheduler").
BINPACK = "binpack"
FRAGMENTATION = "fragmentation"
SCORINGS = (BINPACK, FRAGMENTATION)
FRAGMENTATION_PLUGIN = "GpuFragmentation"
# Its weight against the score plugins the profile keeps (TaintToleration 3, NodeAffinity 2,
# PodTopologySpread 2, InterPodAffinity 2, ImageLocality 1): fragmentation decides, a pod's
# own preferences still break its near-ties.
FRAGMENTATION_WEIGHT = 10
UPSTREAM_IMAGE = "registry.k8s.io/kube-scheduler"


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
    advertised: GpuResources | None = None
    """What the GPU Operator's device plugin advertises; GPUs besides the GPU domains'."""

    def __post_init__(self) -> None:
        lease = lease_conflict(self.scheduler_name)
        if lease:
            raise ValueError(f"scheduler_name: got {self.scheduler_name!r}; {lease}")

    @property
    def gpu_resource_names(self) -> tuple[str, ...]:
        """The GPU resources the profile weighs (GpuFragmentation counts them as GPUs)."""
        return tuple(r.name for r in self.resources if is_gpu_resource(r.name, self.advertised))


def lease_conflict(name: str) -> str:
    """Why a scheduler named `name` would contend for a control-plane Lease; "" if it does not."""
    if name in CONTROL_PLANE_LEASES or name.startswith(CONTROL_PLANE_LEASE_PREFIX):
        return (
            f"its leader-election Lease kube-system/{name} would be one the control plane "
            f"holds ({', '.join(CONTROL_PLANE_LEASES)}, {CONTROL_PLANE_LEASE_PREFIX}*): "
            f"choose another name, e.g. {DEFAULT_SCHEDULER_NAME}"
        )
    return ""


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

    @field_validator("resource_weights")
    @classmethod
    def _weights_a_gpu(cls, weights: dict[str, int]) -> dict[str, int]:
        if not any(is_gpu_resource(name) for name in weights):
            raise problem(
                "expected at least one GPU resource (a device plugin's: "
                f"{', '.join(d + '/...' for d in DEVICE_PLUGIN_DOMAINS)}, e.g. nvidia.com/gpu); "
                "without one the profile does not bin-pack GPU pods"
            )
        return weights

    @property
    def profile(self) -> SchedulerProfile:
        """The KubeSchedulerConfiguration profile these settings describe."""
        return SchedulerProfile(
            scheduler_name=self.name,
            shape=self.shape,
            resources=tuple(
                ResourceWeight(name=n, weight=w) for n, w in self.resource_weights.items()
            ),
            percentage_of_nodes_to_score=self.percentage_of_nodes_to_score,
            balanced_weight=self.balanced_allocation.weight,
            balanced_resources=self.balanced_allocation.resources,
            scoring=self.scoring,
        )


def render_config(profile: SchedulerProfile, kubeconfig: str | None = None) -> dict[str, Any]:
    """The KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) for `profile`.

    With `kubeconfig`, the scheduler connects with that file (local runs); without, it uses
    its in-cluster service-account credentials.
    """
    if profile.scoring == FRAGMENTATION:
        entry = _fragmentation_entry(profile)
    else:
        entry = _binpack_entry(profile)
    if profile.percentage_of_nodes_to_score is not None:
        entry["percentageOfNodesToScore"] = profile.percentage_of_nodes_to_score
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # Its own Lease, so it never contends with the cluster's kube-scheduler and two
        # replicas of this scheduler never both schedule.
        "leaderElection": {
            "leaderElect": profile.leader_elect,
            "resourceName": profile.scheduler_name,
            "resourceNamespace": profile.lease_namespace,
        },
        "profiles": [entry],
    }
    if kubeconfig:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    return config


def _fragmentation_entry(profile: SchedulerProfile) -> dict[str, Any]:
    """GpuFragmentation scores; NodeResourcesFit still filters (its score is turned off, as
    is BalancedAllocation's: both would pull against it). It also counts every arriving pod
    (preFilter, so pods that fit one node or none are counted too) and follows its own
    placements (reserve). Its arguments name the GPU resources as the GPU Operator's settings
    advertise them; the rest keep the plugin's defaults (scheduler/fragmentation/args.go)."""
    plugin = [{"name": FRAGMENTATION_PLUGIN}]
    args: dict[str, Any] = {
        "gpuResources": list(profile.gpu_resource_names),
        "migResourcePrefix": profile.mig_prefix,
    }
    if profile.shared_gpus:
        args["sharedResources"] = [{"name": n, "replicas": r} for n, r in profile.shared_gpus]
    return {
        "schedulerName": profile.scheduler_name,
        "plugins": {
            "preFilter": {"enabled": plugin},
            "preScore": {"enabled": plugin},
            "reserve": {"enabled": plugin},
            "score": {
                "enabled": [{"name": FRAGMENTATION_PLUGIN, "weight": FRAGMENTATION_WEIGHT}],
                "disabled": [{"name": NODE_RESOURCES_FIT}, {"name": BALANCED_ALLOCATION}],
            },
        },
        "pluginConfig": [{"name": FRAGMENTATION_PLUGIN, "args": args}],
    }


def _binpack_entry(profile: SchedulerProfile) -> dict[str, Any]:
    """RequestedToCapacityRatio with the profile's weights and shape, and BalancedAllocation."""
    fit_args = {
        "scoringStrategy": {
            "type": "RequestedToCapacityRatio",
            "resources": [{"name": r.name, "weight": r.weight} for r in profile.resources],
            "requestedToCapacityRatio": {
                "shape": [{"utilization": p.utilization, "score": p.score} for p in profile.shape]
            },
        }
    }
    entry: dict[str, Any] = {
        "schedulerName": profile.scheduler_name,
        "pluginConfig": [{"name": NODE_RESOURCES_FIT, "args": fit_args}],
    }
    # BalancedAllocation is a default score plugin (weight 1, cpu and memory); naming it in
    # `enabled` replaces its weight, `disabled` removes it.
    # Ref: https://kubernetes.io/docs/reference/scheduling/config/#scheduling-plugins
    if profile.balanced_weight == 0:
        entry["plugins"] = {"score": {"disabled": [{"name": BALANCED_ALLOCATION}]}}
    else:
        entry["plugins"] = {
            "score": {"enabled": [{"name": BALANCED_ALLOCATION, "weight": profile.balanced_weight}]}
        }
        # The plugin accepts only weight 1 per resource: it balances shares, it does not weigh.
        entry["pluginConfig"].append(
            {
                "name": BALANCED_ALLOCATION,
                "args": {
                    "resources": [{"name": r, "weight": 1} for r in profile.balanced_resources]
                },
            }
        )
    return entry


def render_config_yaml(profile: SchedulerProfile, kubeconfig: str | None = None) -> str:
    return yaml.safe_dump(render_config(profile, kubeconfig), sort_keys=False)


class BinpackSchedulerArgs(BinpackSchedulerSettings):
    """Inputs of BinpackScheduler: its settings plus the cluster and where it runs."""

    access: Annotated[ClusterAccess, Runtime()]
    """Cluster provider."""
    kubernetes_version: Annotated[str, Runtime()]
    """Cluster version, e.g. v1.37.2; picks the kube-scheduler image tag."""
    namespace: Annotated[str, Runtime()] = "kube-system"
    """Namespace of the Deployment (kube-system, beside the cluster's own scheduler)."""
    image_repository: Annotated[str, Runtime()] = UPSTREAM_IMAGE
    """Repository of the upstream image, tagged kubernetes_version (when `image` is unset)."""
    requests: Annotated[Mapping[str, str], Runtime()] = Field(
        default_factory=lambda: {"cpu": "100m", "memory": "128Mi"}
    )
    """Container resource requests."""
    gpu_resources: Annotated[Sequence[str], Runtime()] = ()
    """GPU resource names the device plugin advertises (GpuOperator's settings); each one
    resource_weights leaves out is weighted like its heaviest GPU resource."""
    gpu_shared: Annotated[Sequence[tuple[str, int]], Runtime()] = ()
    """(name, replicas) of the time-sliced GPU resources (GpuOperator's settings)."""
    gpu_prefixes: Annotated[Sequence[str], Runtime()] = ()
    """Prefixes of the MIG profile resources (GpuOperator's settings)."""

    @property
    def profile(self) -> SchedulerProfile:
        """The settings' profile, with every advertised GPU resource weighted."""
        base = super().profile
        advertised = GpuResources(
            names=tuple(self.gpu_resources),
            prefixes=tuple(self.gpu_prefixes),
            shared=tuple(self.gpu_shared),
        )
        weights = {r.name: r.weight for r in base.resources}
        gpu_weight = max(w for n, w in weights.items() if is_gpu_resource(n, advertised))
        for name in self.gpu_resources:
            weights.setdefault(name, gpu_weight)
        resources = tuple(ResourceWeight(name=n, weight=w) for n, w in weights.items())
        return replace(
            base,
            resources=resources,
            shared_gpus=advertised.shared,
            mig_prefix=next(iter(self.gpu_prefixes), ""),
            advertised=advertised,
        )


class BinpackScheduler(pulumi.ComponentResource):
    """Runs kube-scheduler with a bin-packing profile as a Deployment."""

    scheduler_name: pulumi.Output[str]
    """spec.schedulerName GPU pods must use; resolves once the Deployment exists."""
    config_yaml: pulumi.Output[str]
    """The rendered KubeSchedulerConfiguration."""
    namespace: pulumi.Output[str]
    """Namespace of the Deployment and its Lease."""

    def __init__(
        self, name: str, args: BinpackSchedulerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.access.provider)
        profile = args.profile
        ns = args.namespace
        sched = profile.scheduler_name
        config_yaml = render_config_yaml(profile)
        labels = {"app.kubernetes.io/name": sched, "app.kubernetes.io/part-of": "gpu-cluster"}
        meta = k8s.meta.v1.ObjectMetaArgs(name=sched, namespace=ns, labels=labels)

        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config", metadata=meta, data={CONFIG_KEY: config_yaml}, opts=child
        )
        account = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=meta, opts=child)
        subject = k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=sched, namespace=ns)

        def bind(
            suffix: str, role_kind: str, role: pulumi.Input[str], namespace: str | None
        ) -> pulumi.Resource:
            """Bind the service account to `role`: cluster-wide, or in `namespace`."""
            metadata = k8s.meta.v1.ObjectMetaArgs(
                name=f"{sched}:{suffix}", namespace=namespace, labels=labels
            )
            role_ref = k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind=role_kind, name=role
            )
            if namespace is None:
                return k8s.rbac.v1.ClusterRoleBinding(
                    f"{name}-{suffix}",
                    metadata=metadata,
                    role_ref=role_ref,
                    subjects=[subject],
                    opts=child,
                )
            return k8s.rbac.v1.RoleBinding(
                f"{name}-{suffix}",
                metadata=metadata,
                role_ref=role_ref,
                subjects=[subject],
                opts=child,
            )

        # system:kube-scheduler may get/update only the Lease named kube-scheduler; this
        # scheduler's own Lease needs the same two verbs on its own name.
        lease_role = k8s.rbac.v1.Role(
            f"{name}-lease",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=f"{sched}:lease", namespace=profile.lease_namespace, labels=labels
            ),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=["coordination.k8s.io"],
                    resources=["leases"],
                    resource_names=[sched],
                    verbs=["get", "update"],
                )
            ],
            opts=child,
        )
        bindings = [
            # The two roles kubeadm's own scheduler has; nothing broader.
            bind("kube-scheduler", "ClusterRole", "system:kube-scheduler", None),
            bind("volume-scheduler", "ClusterRole", "system:volume-scheduler", None),
            # Delegated authentication of the HTTPS endpoint reads a ConfigMap in kube-system.
            bind("auth-reader", "Role", "extension-apiserver-authentication-reader", "kube-system"),
            bind("lease", "Role", lease_role.metadata.name, profile.lease_namespace),
        ]

        probe = {"scheme": "HTTPS", "port": SECURE_PORT}
        spec: Any = {
            "replicas": args.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    # A new config rolls the pods; the scheduler reads it only at start.
                    "annotations": {
                        "gpu-cluster.io/config-sha256": hashlib.sha256(
                            config_yaml.encode()
                        ).hexdigest()
                    },
                },
                "spec": {
                    "serviceAccountName": account.metadata.name,
                    "priorityClassName": "system-cluster-critical",
                    "tolerations": [
                        {
                            "key": "node-role.kubernetes.io/control-plane",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        }
                    ],
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": labels},
                                    },
                                }
                            ]
                        }
                    },
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "kube-scheduler",
                            "image": args.image
                            or f"{args.image_repository}:{args.kubernetes_version}",
                            "command": [
                                "kube-scheduler",
                                f"--config={CONFIG_DIR}/{CONFIG_KEY}",
                                f"--secure-port={SECURE_PORT}",
                                "--v=2",
                            ],
                            "ports": [{"name": "https", "containerPort": SECURE_PORT}],
                            "livenessProbe": {
                                "httpGet": {**probe, "path": "/livez"},
                                "initialDelaySeconds": 15,
                                "periodSeconds": 10,
                                "failureThreshold": 8,
                            },
                            "readinessProbe": {
                                "httpGet": {**probe, "path": "/readyz"},
                                "periodSeconds": 10,
                            },
                            "resources": {"requests": dict(args.requests)},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "config", "configMap": {"name": config_map.metadata.name}}
                    ],
                },
            },
        }
        deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta,
            spec=spec,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=bindings)),
        )

        self.scheduler_name = deployment.metadata.apply(lambda _: sched)
        self.config_yaml = pulumi.Output.from_input(config_yaml)
        self.namespace = deployment.metadata.apply(lambda _: ns)
        self.register_outputs(
            {
                "scheduler_name": self.scheduler_name,
                "config_yaml": self.config_yaml,
                "namespace": self.namespace,
            }
        )
