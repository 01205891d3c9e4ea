"""ExtendedResourceNode: advertise extended resources (e.g. example.com/dongle: 4) on one node.

One dynamic resource per (node, resource) (components/providers/extended_resource.py): a JSON
patch of the node's status (`/` in the resource name escaped as `~1`), read back by `pulumi
refresh`, removed exactly by destroy. A missing node or refused credentials fail with a message
naming the node and the API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import pulumi
from pydantic import AfterValidator

from components.cluster_access import ClusterAccess
from components.providers.extended_resource import ExtendedResource
from components.settings import (
    DEVICE_PLUGIN_DOMAINS,
    NODE_NAME,
    NodeRef,
    Rule,
    Runtime,
    Settings,
    is_int,
    is_qualified_name,
    problem,
)

TOKEN = "gpu-cluster:index:ExtendedResourceNode"


def extended_resource_name_problem(name: str) -> str | None:
    """Why `name` is not a valid extended resource name to advertise here, or None when it is.

    # Ref: https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources
    """
    if name.startswith("requests."):
        return "must not start with 'requests.'"
    domain, sep, _ = name.partition("/")
    if not sep:
        return "must be 'domain/name', e.g. example.com/dongle"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved for native resources"
    if not is_qualified_name(name):
        return "must be a DNS subdomain, '/', then 1-63 alphanumerics, '-', '_' or '.'"
    if domain in DEVICE_PLUGIN_DOMAINS:
        return (
            f"{domain} resources belong to a device plugin, which advertises them; "
            "use your own domain, e.g. example.com/dongle"
        )
    return None


def _check_name(name: Any) -> bool:
    if not isinstance(name, str):
        return False
    why = extended_resource_name_problem(name)
    if why:
        raise problem(f"not an extended resource name: {why}")
    return True


EXTENDED_RESOURCE_NAME = Rule(
    "expected an extended resource name: domain/name (e.g. example.com/dongle), outside the "
    f"kubernetes.io domain and the device plugins' domains ({', '.join(DEVICE_PLUGIN_DOMAINS)})",
    _check_name,
)
COUNT = Rule("expected a non-negative integer", lambda v: is_int(v) and v >= 0)


def _non_empty(resources: Mapping[str, int]) -> Mapping[str, int]:
    if not resources:
        raise problem("expected a non-empty {domain/resource: count}")
    return resources


Resources = Annotated[
    dict[Annotated[str, EXTENDED_RESOURCE_NAME], Annotated[int, COUNT]], AfterValidator(_non_empty)
]
"""{extended resource name: count} on one node."""

ExtendedResourcesSettings = dict[Annotated[str, NodeRef()], Resources]
"""The stack config's extendedResources: {node name: {extended resource name: count}}."""


class ExtendedResourceNodeArgs(Settings):
    """Inputs of ExtendedResourceNode: one node's entry of extendedResources, plus the access."""

    node: Annotated[str, NODE_NAME]
    """Node name."""
    resources: Resources
    """{extended resource name: count} to advertise in status.capacity."""
    access: Annotated[ClusterAccess, Runtime()]
    """Cluster credentials (the kubeconfig reaches the provider as a secret)."""


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
