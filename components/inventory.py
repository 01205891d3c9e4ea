"""The stack's inventory (gpu-cluster:nodes): every node the layers touch, with the address
SSH connects to and the names it had before a rename."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from components.kubernetes_names import NODE_NAME, is_host
from components.settings import Settings, problem, text

NODE_ADDRESS = text(
    lambda v: v == "" or is_host(v),
    "expected a host name or an IP address (no port, scheme or path), e.g. 10.0.0.11",
)


class NodeSettings(Settings):
    """One node of the inventory."""

    name: Annotated[str, NODE_NAME]
    """The Kubernetes Node name."""
    address: Annotated[str, NODE_ADDRESS] = ""
    """Host name or IP address SSH connects to (layers that edit host files need one)."""
    previous_names: tuple[Annotated[str, NODE_NAME], ...] = ()
    """Names this host had in the inventory before a rename: its SSH commands carry over
    (Pulumi aliases) instead of being deleted on the old name and created on the new."""


def _nodes_once(nodes: tuple[NodeSettings, ...]) -> tuple[NodeSettings, ...]:
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        if node.name in seen:
            raise problem(
                "each node may be listed once; it is listed twice",
                at=f"[{i}].name",
                value=node.name,
            )
        seen.add(node.name)
    for i, node in enumerate(nodes):
        for j, old in enumerate(node.previous_names):
            if old in seen:
                raise problem(
                    "a previous name must not be a node of the inventory (its commands would "
                    "be claimed twice)",
                    at=f"[{i}].previousNames[{j}]",
                    value=old,
                )
    return nodes


Inventory = Annotated[tuple[NodeSettings, ...], AfterValidator(_nodes_once)]
"""The inventory: each node once, no previous name that is a node of it."""
