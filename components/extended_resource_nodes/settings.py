"""The extendedResources section of the stack config: ExtendedResourceNodes' settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator

from components.gpu_resources import DEVICE_PLUGIN_DOMAINS
from components.kubernetes_names import NodeRef, extended_resource_problem
from components.settings import Rule, is_int, problem


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
