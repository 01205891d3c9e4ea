"""ExtendedResourceNodes: advertise extended resources (e.g. example.com/dongle: 4) on nodes.

One dynamic resource for the whole layer (components/providers/extended_resource_nodes.py): per
node, a JSON patch of its status (`/` in the resource name escaped as `~1`), read back by
`pulumi refresh`, and destroy puts back what was advertised before. The engine sees one
resource however many nodes there are; the provider diffs and patches per node, and the
component fails the run naming every node that could not be changed (a missing node, refused
credentials, another stack's resource) while the others are done.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import pulumi
from pydantic import AfterValidator

from components.cluster_access import ClusterAccess
from components.gpu_resources import DEVICE_PLUGIN_DOMAINS
from components.kubernetes_names import NodeRef, extended_resource_problem
from components.providers.extended_resource_nodes import ExtendedResourceNodeSet
from components.providers.node_set import failure_message
from components.settings import PROJECT, Rule, Runtime, Settings, is_int, problem

TOKEN = f"{PROJECT}:index:ExtendedResourceNodes"


def extended_resource_name_problem(name: str) -> str | None:
    """Why `name` is not a valid extended resource name to advertise here, or None when it is:
    an extended resource name outside the device plugins' domains."""
    why = extended_resource_problem(name)
    if why is not None:
        return why
    domain = name.partition("/")[0]
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

ExtendedResourceNodesSettings = dict[Annotated[str, NodeRef()], Resources]
"""The stack config's extendedResources: {node name: {extended resource name: count}}."""


class ExtendedResourceNodesArgs(Settings):
    """Inputs of ExtendedResourceNodes: the stack config's extendedResources, plus the access."""

    nodes: ExtendedResourceNodesSettings
    """{node name: {extended resource name: count}} to advertise in status.capacity."""
    access: Annotated[ClusterAccess, Runtime()]
    """Cluster access: the node set waits for its claim (the node providers read the
    credentials from the stack config)."""


class ExtendedResourceNodes(pulumi.ComponentResource):
    """Patches the nodes' status so the scheduler sees extra countable resources."""

    nodes: pulumi.Output[list[str]]
    """The nodes with advertised resources."""
    resources: pulumi.Output[dict[str, dict[str, Any]]]
    """{node: {resource: live advertised count}} as last read from the nodes."""

    def __init__(
        self, name: str, args: ExtendedResourceNodesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        wanted = {node: dict(sorted(counts.items())) for node, counts in sorted(args.nodes.items())}
        advertised = ExtendedResourceNodeSet(
            f"{name}-nodes",
            nodes=wanted,
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.access.after(opts)),
        )
        self.nodes = pulumi.Output.from_input(list(wanted))
        self.resources = pulumi.Output.all(advertised.applied, advertised.failed).apply(
            lambda state: _live_counts(state[0], state[1], wanted)
        )
        self.register_outputs({"nodes": self.nodes, "resources": self.resources})


def _live_counts(
    applied: dict[str, Any] | None, failed: dict[str, str] | None, wanted: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """{node: {resource: count}}: the live counts the provider last saw (the wanted ones
    when it reports none, as under mocks); every node failed is named in one error."""
    if failed:
        raise pulumi.RunError(failure_message("advertise extended resources", failed, len(wanted)))
    return {
        node: dict(((applied or {}).get(node) or {}).get("live") or counts)
        for node, counts in wanted.items()
    }
