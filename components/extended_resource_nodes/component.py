"""ExtendedResourceNodes: advertise extended resources (e.g. example.com/dongle: 4) on nodes.

One dynamic resource for the whole layer (components/extended_resource_nodes/provider.py): per
node, a JSON patch of its status (`/` in the resource name escaped as `~1`), read back by
`pulumi refresh`, and destroy puts back what was advertised before. The engine sees one
resource however many nodes there are; the provider diffs and patches per node, and the
component fails the run naming every node that could not be changed (a missing node, refused
credentials, another stack's resource) while the others are done.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

import pulumi

from components.cluster_access import ClusterAccess
from components.extended_resource_nodes.provider import ExtendedResourceNodeSet
from components.extended_resource_nodes.settings import ExtendedResourceNodesSettings
from components.providers.node_set import failure_message
from components.settings import PROJECT, Runtime, Settings

TOKEN = f"{PROJECT}:index:ExtendedResourceNodes"


class ExtendedResourceNodesArgs(Settings):
    """Inputs of ExtendedResourceNodes: the stack config's extendedResources, plus the access."""

    nodes: ExtendedResourceNodesSettings
    """{node name: {extended resource name: count}} to advertise in status.capacity."""
    access: Annotated[ClusterAccess, Runtime()]
    """Cluster access: the node set waits for its claim (the node providers read the
    credentials from the stack config)."""

    @classmethod
    def from_settings(cls, settings: ExtendedResourceNodesSettings, **inputs: Any) -> Self:
        """These inputs from the extendedResources settings plus the runtime inputs, as every
        layer's arguments are built (components/settings.py, Settings.from_settings)."""
        return cls.model_validate({"nodes": settings, **inputs})


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
