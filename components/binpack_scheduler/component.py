"""BinpackScheduler: a second kube-scheduler that packs GPU pods onto the fewest nodes.

The component and its Args only: the settings model and its rules are in
components/binpack_scheduler/settings.py, the KubeSchedulerConfiguration and every object below
are built in components/binpack_scheduler/manifests.py. In kube-system (by default):

    ConfigMap (the rendered config) ───────────┐
    ServiceAccount ────────────────────────────┤
    its ClusterRole ──> ClusterRoleBinding ────┼──> Deployment of kube-scheduler
    Role on its Lease ──> RoleBinding ─────────┤
    the authentication reader ──> RoleBinding ─┤
    its Lease (created here, never by it) ─────┘

The rendered configuration is an output (stack output `schedulerConfig`); the GPU resources it
weighs are `gpu_resources`, which the gate and the monitoring take.

# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field

from components.binpack_scheduler import manifests
from components.binpack_scheduler.settings import (
    NO_GPU_RESOURCES,
    UPSTREAM_IMAGE,
    BinpackSchedulerSettings,
    SchedulerProfile,
)
from components.cluster_access import ClusterAccess, ClusterLayer
from components.gpu_resources import GpuResources
from components.kubernetes_names import service_account_user
from components.settings import PROJECT, Runtime

TOKEN = f"{PROJECT}:index:BinpackScheduler"


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
    advertised: Annotated[GpuResources, Runtime()] = NO_GPU_RESOURCES
    """What the GPU Operator's device plugin advertises (GpuOperatorSettings.gpu_resources());
    the GPU resources are these and gpu_resources."""

    @property
    def profile(self) -> SchedulerProfile:
        """The settings' profile with what the device plugin advertises."""
        return self.profile_with(self.advertised)

    @property
    def scheduler_image(self) -> str:
        """The image the pods run: `image`, or the upstream one tagged kubernetes_version."""
        return self.image or f"{self.image_repository}:{self.kubernetes_version}"


class BinpackScheduler(ClusterLayer):
    """Runs kube-scheduler with a bin-packing profile as a Deployment."""

    scheduler_name: pulumi.Output[str]
    """spec.schedulerName GPU pods must use; resolves once the Deployment exists."""
    config_yaml: pulumi.Output[str]
    """The rendered KubeSchedulerConfiguration."""
    namespace: pulumi.Output[str]
    """Namespace of the Deployment and its Lease."""
    identity: pulumi.Output[str]
    """The username the scheduler authenticates as (its ServiceAccount's): the one identity
    the gate lets allocate GPU devices through DRA."""
    gpu_resources: GpuResources
    """The GPU resources the scheduler weighs as GPUs (what the device plugin advertises and
    `gpuResources` adds): what the gate routes and the monitoring counts. Known from the
    config, so a plain value."""

    def __init__(
        self, name: str, args: BinpackSchedulerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, args.access, opts)
        child = self.children
        profile = args.profile
        sched, ns, lease_ns = profile.scheduler_name, args.namespace, profile.lease_namespace
        config_yaml = manifests.render_config_yaml(profile)

        config = manifests.config_map(sched, ns, config_yaml)
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config", metadata=config["metadata"], data=config["data"], opts=child
        )
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa", metadata=manifests.service_account(sched, ns)["metadata"], opts=child
        )
        cluster_role = manifests.scheduler_role(sched, args.gang_scheduling)
        scheduler_role = k8s.rbac.v1.ClusterRole(
            f"{name}-role",
            metadata=cluster_role["metadata"],
            rules=cluster_role["rules"],
            opts=child,
        )
        role = manifests.lease_role(sched, lease_ns)
        lease_role = k8s.rbac.v1.Role(
            f"{name}-lease", metadata=role["metadata"], rules=role["rules"], opts=child
        )
        # The scheduler may not create its Lease (RBAC cannot limit `create` to a name).
        lease = k8s.coordination.v1.Lease(
            f"{name}-leader-lease",
            metadata=manifests.lease(sched, lease_ns)["metadata"],
            opts=child,
        )
        # Each binding names its role by the role's output, so it follows the role.
        refs = {
            manifests.SCHEDULER: _ref("ClusterRole", scheduler_role),
            manifests.LEASE: _ref("Role", lease_role),
        }
        bindings = [
            _bind(f"{name}-{suffix}", binding, refs.get(suffix, binding["roleRef"]), child)
            for suffix, binding in manifests.role_bindings(sched, ns, lease_ns).items()
        ]
        deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=manifests.object_meta(sched, sched, ns),
            spec=_deployment_spec(args, sched, config_yaml, account, config_map),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[*bindings, lease])
            ),
        )

        self.scheduler_name = deployment.metadata.apply(lambda _: sched)
        self.config_yaml = pulumi.Output.from_input(config_yaml)
        self.namespace = deployment.metadata.apply(lambda _: ns)
        self.identity = account.metadata.name.apply(lambda n: service_account_user(ns, n))
        self.gpu_resources = args.gpu_resources_with(args.advertised)
        self.register_outputs(
            {
                "scheduler_name": self.scheduler_name,
                "config_yaml": self.config_yaml,
                "namespace": self.namespace,
                "identity": self.identity,
            }
        )


def _ref(
    kind: str, role: k8s.rbac.v1.ClusterRole | k8s.rbac.v1.Role
) -> pulumi.Output[dict[str, str]]:
    """A binding's reference to `role`, by its name output."""
    return role.metadata.name.apply(lambda n: manifests.role_ref(kind, n))


def _deployment_spec(
    args: BinpackSchedulerArgs,
    scheduler_name: str,
    config_yaml: str,
    account: k8s.core.v1.ServiceAccount,
    config_map: k8s.core.v1.ConfigMap,
) -> pulumi.Output[Any]:
    """The Deployment's spec; the pod names its ServiceAccount and ConfigMap by their outputs,
    so the Deployment follows them."""
    return pulumi.Output.all(account.metadata.name, config_map.metadata.name).apply(
        lambda names: manifests.deployment(
            scheduler_name,
            args.namespace,
            replicas=args.replicas,
            image=args.scheduler_image,
            requests=args.requests,
            config_yaml=config_yaml,
            service_account=names[0],
            config_map=names[1],
            feature_gates=args.profile.feature_gates,
        )["spec"]
    )


_BINDING_KINDS: dict[str, type[k8s.rbac.v1.ClusterRoleBinding] | type[k8s.rbac.v1.RoleBinding]] = {
    "ClusterRoleBinding": k8s.rbac.v1.ClusterRoleBinding,
    "RoleBinding": k8s.rbac.v1.RoleBinding,
}


def _bind(
    name: str, binding: Mapping[str, Any], role_ref: pulumi.Input[Any], opts: pulumi.ResourceOptions
) -> pulumi.Resource:
    """`binding` (a RoleBinding or a ClusterRoleBinding, as its kind says) referring to `role_ref`."""
    kind = _BINDING_KINDS[binding["kind"]]
    return kind(
        name,
        metadata=binding["metadata"],
        role_ref=role_ref,
        subjects=binding["subjects"],
        opts=opts,
    )
