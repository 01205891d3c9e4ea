"""Dynamic provider: the extended resources advertised on every node of the layer, as one resource.

Per node: a merge patch records on the node who advertises each resource and what was
advertised before (an ownership annotation per resource), then one JSON patch of the status
subresource sets `status.capacity[<resource>]` and `status.allocatable[<resource>]` (`/` in
the name escaped as `~1`). Destroy puts back what was advertised before, or removes the keys;
`pulumi refresh` notices a count the kubelet dropped on re-registration, and the next `up`
puts it back. The set mechanics are components/providers/node_set.py's.

# Ref: https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import Resource

from components.providers.extended_resource import STATUS_FIELDS, live_quantity
from components.providers.node_api import (
    NodeApi,
    NodeNotFound,
    json_pointer_escape,
    owned_by_another,
    ownership,
    ownership_key,
    stack_identity,
    update_node,
)
from components.providers.node_set import SET_MARK, NodeSetProvider, taken_over


def capacity_ownership_key(resource: str) -> str:
    return ownership_key("capacity", resource)


def _status_ops(
    live: Mapping[str, Any], set_to: Mapping[str, int], restore: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """JSON patch ops: advertise `set_to`; put back `restore` ({resource: {field: value|None}})."""
    status = live.get("status") or {}
    ops: list[dict[str, Any]] = []
    for resource, count in sorted(set_to.items()):
        name = json_pointer_escape(resource)
        for f in STATUS_FIELDS:
            if (status.get(f) or {}).get(resource) != str(count):
                # "add" on an object member replaces an existing value (RFC 6902, 4.1).
                ops.append({"op": "add", "path": f"/status/{f}/{name}", "value": str(count)})
    for resource, previous in sorted(restore.items()):
        name = json_pointer_escape(resource)
        for f in STATUS_FIELDS:
            before, now = previous.get(f), (status.get(f) or {}).get(resource)
            if before is not None and now != before:
                ops.append({"op": "add", "path": f"/status/{f}/{name}", "value": str(before)})
            elif before is None and now is not None:
                ops.append({"op": "remove", "path": f"/status/{f}/{name}"})
    return ops


class AdvertisedResourcesProvider(NodeSetProvider):
    """{node: {extended resource: count}} advertised in the nodes' status."""

    what = "the advertised extended resources"

    def resource_id(self, props: Mapping[str, Any]) -> str:
        return "extended-resources"

    def wanted(self, props: Mapping[str, Any]) -> dict[str, Any]:
        return {
            node: {r: int(c) for r, c in counts.items()}
            for node, counts in (props.get("nodes") or {}).items()
        }

    def _records(self, live: Mapping[str, Any], resources: list[str]) -> dict[str, Any]:
        return {r: ownership(live, capacity_ownership_key(r)) for r in resources}

    def claim(
        self,
        api: NodeApi,
        live: dict[str, Any],
        spec: Any,
        record: Mapping[str, Any] | None,
        props: Mapping[str, Any],
    ) -> dict[str, Any]:
        owner, node = props["owner"], str(live["metadata"]["name"])
        dropped = sorted(set((record or {}).get("spec") or {}) - set(spec))

        def claim(live: Mapping[str, Any]) -> dict[str, Any] | None:
            # Record on the node, before the status changes, that this stack advertises each
            # resource and what was advertised before it (kept from an earlier run of ours).
            status = live.get("status") or {}
            notes: dict[str, Any] = {}
            for resource, found in self._records(live, sorted(spec)).items():
                owned_by_another(found, owner, f"extended resource {resource}", node)
                if taken_over(found):
                    continue
                previous = (found or {}).get("previous") or {
                    f: (status.get(f) or {}).get(resource) for f in STATUS_FIELDS
                }
                note = {"owner": owner, "previous": previous, **SET_MARK}
                notes[capacity_ownership_key(resource)] = json.dumps(note, sort_keys=True)
            return {"metadata": {"annotations": notes}} if notes else None

        live = update_node(api, node, claim, first=live)
        restore = self._ours(live, dropped, owner)
        ops = _status_ops(live, spec, restore)
        if ops:
            live = api.patch_status(node, ops)
        if restore:
            live = self._forget(api, live, list(restore))
        return {
            "previous": {
                r: (rec or {}).get("previous")
                for r, rec in self._records(live, sorted(spec)).items()
            },
            "live": dict(spec),
        }

    def _ours(
        self, live: Mapping[str, Any], resources: list[str], owner: str
    ) -> dict[str, Mapping[str, Any]]:
        """{resource: what was advertised before} for those of `resources` this stack holds."""
        return {
            r: found.get("previous") or {}
            for r, found in self._records(live, resources).items()
            if found is not None and found.get("owner") == owner
        }

    def _forget(self, api: NodeApi, live: dict[str, Any], resources: list[str]) -> dict[str, Any]:
        """Drop this stack's records of `resources` from the node (after their status)."""
        annotations: dict[str, Any] = {capacity_ownership_key(r): None for r in resources}
        return update_node(
            api,
            live["metadata"]["name"],
            lambda _live: {"metadata": {"annotations": annotations}},
            first=live,
        )

    def release(
        self,
        api: NodeApi,
        live: dict[str, Any],
        record: Mapping[str, Any],
        props: Mapping[str, Any],
    ) -> None:
        try:
            restore = self._ours(live, sorted(record.get("spec") or {}), props["owner"])
            ops = _status_ops(live, {}, restore)
            if ops:
                live = api.patch_status(live["metadata"]["name"], ops)
            if restore:
                self._forget(api, live, list(restore))
        except NodeNotFound:
            return  # deleted meanwhile: nothing left to undo

    def observe(
        self, live: Mapping[str, Any], record: Mapping[str, Any], props: Mapping[str, Any]
    ) -> dict[str, Any]:
        spec: Mapping[str, int] = record.get("spec") or {}
        counts = {r: live_quantity(dict(live), r) for r in spec}
        return {**record, "live": counts, "drift": counts != dict(spec)}


class AdvertisedResources(Resource, module="gpu-cluster", name="AdvertisedResources"):
    """`status.capacity[resource] = count` for every (node, resource) of the layer."""

    applied: pulumi.Output[dict[str, Any]]
    """{node: {spec, live: {resource: live count or None}, previous}}."""
    failed: pulumi.Output[dict[str, str]]
    """{node: why its last change failed}; empty when every node is done."""

    def __init__(
        self,
        name: str,
        *,
        nodes: pulumi.Input[dict[str, dict[str, int]]],
        opts: pulumi.ResourceOptions | None = None,
        provider: AdvertisedResourcesProvider | None = None,
    ) -> None:
        props = {
            "nodes": nodes,
            # Recorded on each node, so another stack never undoes it.
            "owner": stack_identity(),
            "applied": None,
            "failed": None,
        }
        super().__init__(provider or AdvertisedResourcesProvider(), name, props, opts)
