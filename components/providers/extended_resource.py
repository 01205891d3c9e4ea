"""Dynamic provider: one extended resource advertised in a node's status.

create/update JSON-patch `status.capacity[<resource>]` and `status.allocatable[<resource>]`
through /api/v1/nodes/<node>/status; delete removes exactly those two keys. read reports the
live value, so `pulumi refresh` notices when the kubelet dropped the resource on
re-registration and the next `pulumi up` puts it back.

The stack now advertises every node's resources with one resource (advertised_resources.py);
this per-(node, resource) one stays so that a stack deployed with it can still update and
destroy. When the node set takes over a node's record, this resource's delete (which the
engine runs after) leaves it alone.

# Ref: https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    UpdateResult,
)

from components.providers.credentials import RunCredentials
from components.providers.node_api import (
    Connect,
    NodeApi,
    NodeNotFound,
    connect,
    json_pointer_escape,
    owned_by_another,
    ownership,
    ownership_key,
    stack_identity,
    update_node,
)
from components.providers.node_set import taken_over

# Allocatable is what the scheduler fits pods against. The kubelet derives it from capacity
# on its next status sync; setting both makes the resource schedulable at once.
STATUS_FIELDS = ("capacity", "allocatable")


def live_quantity(node: dict[str, Any], resource: str) -> int | None:
    """The advertised capacity of `resource` on `node`, or None when it is not there."""
    value = (node.get("status") or {}).get("capacity", {}).get(resource)
    return int(value) if value is not None else None


class ExtendedResourceProvider(RunCredentials):
    """CRUD for `status.capacity[<resource>]` of one node."""

    def __init__(self, connect_api: Connect = connect) -> None:
        super().__init__()
        self._connect = connect_api

    def _api(self, props: dict[str, Any]) -> NodeApi:
        return self._connect(*self.credentials())

    def _advertise(self, props: dict[str, Any]) -> dict[str, Any]:
        api, node, resource = self._api(props), props["node"], props["resource"]
        annotation = ownership_key("capacity", resource)

        def claim(live: Mapping[str, Any]) -> dict[str, Any] | None:
            # Record on the node, before the status changes, that this stack advertises the
            # resource and what was advertised before it (kept from an earlier run of ours).
            record = ownership(live, annotation)
            owned_by_another(record, props["owner"], f"extended resource {resource}", node)
            if record is not None:
                return None
            status = live.get("status") or {}
            previous = {f: (status.get(f) or {}).get(resource) for f in STATUS_FIELDS}
            note = json.dumps({"owner": props["owner"], "previous": previous}, sort_keys=True)
            return {"metadata": {"annotations": {annotation: note}}}

        update_node(api, node, claim)
        name = json_pointer_escape(resource)
        value = str(int(props["quantity"]))
        # "add" on an object member replaces an existing value (RFC 6902, 4.1).
        ops = [{"op": "add", "path": f"/status/{f}/{name}", "value": value} for f in STATUS_FIELDS]
        api.patch_status(node, ops)
        return {**props, "quantity": int(props["quantity"])}

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._advertise(props)
        return CreateResult(id_=f"{props['node']}/{props['resource']}", outs=outs)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._advertise(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in ("node", "resource") if olds.get(k) != news.get(k)]
        # Credentials are how this run reaches the cluster, not part of the resource.
        changed = [k for k in ("quantity",) if olds.get(k) != news.get(k)]
        return DiffResult(
            changes=bool(replaces or changed), replaces=replaces, delete_before_replace=True
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        try:
            node = self._api(props).get_node(props["node"])
        except NodeNotFound:
            return ReadResult(id_=None, outs={})  # the node is gone, and its capacity with it
        return ReadResult(
            id_=id_, outs={**props, "quantity": live_quantity(node, props["resource"])}
        )

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        api, node, resource = self._api(props), props["node"], props["resource"]
        annotation = ownership_key("capacity", resource)
        try:
            live = api.get_node(node)
        except NodeNotFound:
            return  # a decommissioned node: nothing left to undo
        record = ownership(live, annotation)
        if record is not None and (record.get("owner") != props.get("owner") or taken_over(record)):
            return  # another stack advertises it now, or the node set holds it: not ours to undo
        previous = (record or {}).get("previous") or {}
        status = live.get("status") or {}
        name = json_pointer_escape(resource)
        ops: list[dict[str, Any]] = []
        for f in STATUS_FIELDS:
            before = previous.get(f)
            if before is not None:  # what was advertised before this stack comes back
                ops.append({"op": "add", "path": f"/status/{f}/{name}", "value": str(before)})
            elif resource in (status.get(f) or {}):
                ops.append({"op": "remove", "path": f"/status/{f}/{name}"})
        if ops:
            api.patch_status(node, ops)
        if record is not None:
            update_node(api, node, lambda _live: {"metadata": {"annotations": {annotation: None}}})


class ExtendedResource(Resource, module="gpu-cluster", name="ExtendedResource"):
    """`status.capacity[resource] = quantity` on one node."""

    node: pulumi.Output[str]
    resource: pulumi.Output[str]
    quantity: pulumi.Output[int | None]
    """The live advertised count (None after the kubelet dropped it, until the next up)."""

    def __init__(
        self,
        name: str,
        *,
        node: pulumi.Input[str],
        resource: pulumi.Input[str],
        quantity: pulumi.Input[int],
        opts: pulumi.ResourceOptions | None = None,
        provider: ExtendedResourceProvider | None = None,
    ) -> None:
        props = {
            "node": node,
            "resource": resource,
            "quantity": quantity,
            # Recorded on the node, so another stack never undoes it.
            "owner": stack_identity(),
        }
        super().__init__(provider or ExtendedResourceProvider(), name, props, opts)
