"""ExtendedResourceNode: advertise extended resources (e.g. example.com/dongle: 4) on one node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from components.cluster_access import ClusterAccess
from components.providers.extended_resource import ExtendedResource

TOKEN = "gpu-cluster:index:ExtendedResourceNode"


@dataclass(frozen=True, kw_only=True)
class ExtendedResourceNodeArgs:
    """Inputs of ExtendedResourceNode."""

    access: ClusterAccess
    """Cluster credentials (the kubeconfig reaches the provider as a secret)."""
    node: str
    """Node name."""
    resources: Mapping[str, int]
    """{extended resource name: count} to advertise in status.capacity."""


class ExtendedResourceNode(pulumi.ComponentResource):
    """Patches a node's status so the scheduler sees extra countable resources."""

    node: pulumi.Output[str]
    """The node name."""
    resources: pulumi.Output[dict[str, Any]]
    """{resource: live advertised count} as last read from the node."""

    def __init__(
        self, name: str, args: ExtendedResourceNodeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        advertised = {
            resource: ExtendedResource(
                f"{name}-{resource.replace('/', '-')}",
                node=args.node,
                resource=resource,
                quantity=count,
                kubeconfig=args.access.kubeconfig,
                context=args.access.context,
                opts=child,
            )
            for resource, count in sorted(args.resources.items())
        }
        names = list(advertised)
        self.node = pulumi.Output.from_input(args.node)
        self.resources = pulumi.Output.all(*(r.quantity for r in advertised.values())).apply(
            lambda counts: dict(zip(names, counts, strict=True))
        )
        self.register_outputs({"node": self.node, "resources": self.resources})
