"""Dynamic provider: ExtendedResourceNodes' extended resources on every node, as one resource.

Per node, one JSON patch of the status subresource (with a resourceVersion precondition,
retried on conflict) sets `status.capacity[<resource>]` and `status.allocatable[<resource>]`
(`/` in the name escaped as `~1`) and, in the same write, records on the node who advertises
each resource, the count and what was advertised before (an ownership annotation per
resource; the node status endpoint keeps metadata, and the provider checks the records came
back). Destroy puts back what was advertised before, or removes the keys, where the node still
advertises the count the stack set; a count someone set since stays (and `up` refuses to
overwrite it). `pulumi refresh` notices a count the kubelet dropped or reset to 0 on
re-registration, and the next `up` puts it back: the kubelet's reset is no one's edit
(`zeroed_by_kubelet`). Counts are compared as quantities, since the API server keeps them in
canonical form (1000 as "1k"). The set mechanics are components/providers/node_set.py's.

# Ref: https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pulumi
from pulumi.dynamic import Resource

from components.providers.node_api import (
    NodeApiError,
    annotation_ops,
    json_pointer_escape,
    ownership,
    ownership_key,
    patch_status_guarded,
    stack_identity,
    stack_label,
)
from components.providers.node_set import (
    NodeSetProvider,
    NodeStep,
    Owner,
    refuse_set_since,
    written,
)
from components.settings import PROJECT

# Allocatable is what the scheduler fits pods against. The kubelet derives it from capacity
# on its next status sync; setting both makes the resource schedulable at once.
STATUS_FIELDS = ("capacity", "allocatable")
KUBELET_RESET = "0"
"""The count the kubelet resets an extended resource to."""


def _quantity(value: Any) -> Decimal:
    from kubernetes.utils import parse_quantity

    return Decimal(parse_quantity(value))


def same_count(a: Any, b: Any) -> bool:
    """Whether two counts (None: not advertised) are the same quantity. The API server keeps a
    count in its canonical form, not as written: 1000 comes back as "1k"."""
    if a is None or b is None:
        return a is None and b is None
    return _quantity(a) == _quantity(b)


def live_quantity(node: dict[str, Any], resource: str) -> int | None:
    """The advertised capacity of `resource` on `node`, or None when it is not there."""
    value = (node.get("status") or {}).get("capacity", {}).get(resource)
    return int(_quantity(value)) if value is not None else None


def zeroed_by_kubelet(status: Mapping[str, Any], resource: str) -> bool:
    """Whether `resource` is at 0 in both capacity and allocatable: what the kubelet leaves of
    every extended resource when it registers again under an existing Node without its device
    manager's checkpoint (a host reimaged or reinstalled), for whoever advertised a count to
    set it again. Not an edit of anyone's: a count the stack set comes back with the next `up`.

    # Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/kubelet/kubelet_node_status.go
    (reconcileExtendedResource; pkg/kubelet/cm/devicemanager/manager.go
    ShouldResetExtendedResourceCapacity) and https://github.com/kubernetes/kubernetes/pull/64784
    """
    values = [(status.get(f) or {}).get(resource) for f in STATUS_FIELDS]
    return all(same_count(value, KUBELET_RESET) for value in values)


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
            if not same_count((status.get(f) or {}).get(resource), count):
                # "add" on an object member replaces an existing value (RFC 6902, 4.1).
                ops.append({"op": "add", "path": f"/status/{f}/{name}", "value": str(count)})
    for resource, previous in sorted(restore.items()):
        name = json_pointer_escape(resource)
        for f in STATUS_FIELDS:
            before, now = previous.get(f), (status.get(f) or {}).get(resource)
            if before is not None and not same_count(now, before):
                ops.append({"op": "add", "path": f"/status/{f}/{name}", "value": str(before)})
            elif before is None and now is not None:
                ops.append({"op": "remove", "path": f"/status/{f}/{name}"})
    return ops


def _count(count: int | None) -> str | None:
    """A count as the node's status holds it."""
    return None if count is None else str(count)


class ExtendedResourceNodesProvider(NodeSetProvider):
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

    def claim(self, step: NodeStep, spec: Any) -> dict[str, Any]:
        node, owner = step.node, step.owner
        before: Mapping[str, int] = (step.record or {}).get("spec") or {}
        dropped = sorted(set(before) - set(spec))

        def ops_for(live: Mapping[str, Any]) -> list[dict[str, Any]]:
            # The record of who advertises each resource, the count and what was advertised
            # before (kept from an earlier run of ours) goes in the same write as the counts.
            status = live.get("status") or {}
            notes: dict[str, str | None] = {}
            for resource, found in self._records(live, sorted(spec)).items():
                what = f"extended resource {resource}"
                owner.refuse_another(found, what, node)
                count = (status.get("capacity") or {}).get(resource)
                previous = {f: (status.get(f) or {}).get(resource) for f in STATUS_FIELDS}
                if found is not None:
                    wrote = written(found, _count(before.get(resource)))
                    # The kubelet's reset is no one's edit: the stack's count goes back.
                    seen = None if zeroed_by_kubelet(status, resource) else count
                    refuse_set_since(what, node, seen, wrote, spec[resource], same_count)
                    previous = found.get("previous") or {}
                note = owner.record(previous, str(spec[resource]))
                if found != note:
                    notes[capacity_ownership_key(resource)] = json.dumps(note, sort_keys=True)
            restore, forget = self._release_plan(live, dropped, owner, before)
            notes.update({capacity_ownership_key(r): None for r in forget})
            return annotation_ops(live, notes) + _status_ops(live, spec, restore)

        live = patch_status_guarded(step.api, node, ops_for, first=step.live)
        records = self._records(live, sorted(spec))
        if any(found is None for found in records.values()):
            # Never advertise without the record destroy needs to undo it exactly.
            raise NodeApiError(
                f"API server {step.api.server} did not keep the ownership annotations written with "
                f"the status of node {node!r}"
            )
        return {"previous": {r: (found or {}).get("previous") for r, found in records.items()}}

    def _release_plan(
        self,
        live: Mapping[str, Any],
        resources: list[str],
        owner: Owner,
        spec: Mapping[str, int],
    ) -> tuple[dict[str, Mapping[str, Any]], list[str]]:
        """Of `resources`, those whose record this stack holds (to forget), and of them those
        still advertised with the count the stack set: {resource: what was advertised before}
        (to put back). A count someone set since, or one that is gone, stays as it is. A count
        the kubelet reset to 0 is never advertised again, but a resource that was not there
        before the stack goes: its 0 is the stack's count, reset."""
        status = live.get("status") or {}
        capacity = status.get("capacity") or {}
        restore: dict[str, Mapping[str, Any]] = {}
        forget: list[str] = []
        for resource, found in self._records(live, resources).items():
            if found is None or not owner.holds(found):
                continue  # released already, or another stack's
            forget.append(resource)
            wrote = written(found, _count(spec.get(resource)))
            previous: Mapping[str, Any] = found.get("previous") or {}
            if wrote is None or same_count(capacity.get(resource), wrote):
                restore[resource] = previous
            elif zeroed_by_kubelet(status, resource) and previous.get("capacity") is None:
                restore[resource] = {}
        return restore, forget

    def release(self, step: NodeStep) -> None:
        owner = step.owner
        spec: Mapping[str, int] = (step.record or {}).get("spec") or {}

        def ops_for(live: Mapping[str, Any]) -> list[dict[str, Any]]:
            # What was advertised before comes back, and the records go, in one write.
            restore, forget = self._release_plan(live, sorted(spec), owner, spec)
            drop = {capacity_ownership_key(r): None for r in forget}
            return annotation_ops(live, drop) + _status_ops(live, {}, restore)

        patch_status_guarded(step.api, step.node, ops_for, first=step.live)

    def observe(
        self, live: Mapping[str, Any], record: Mapping[str, Any], props: Mapping[str, Any]
    ) -> dict[str, Any]:
        spec: Mapping[str, int] = record.get("spec") or {}
        counts = {r: live_quantity(dict(live), r) for r in spec}
        return {**record, "live": counts, "drift": counts != dict(spec)}


class ExtendedResourceNodeSet(Resource, module=PROJECT, name="ExtendedResourceNodeSet"):
    """ExtendedResourceNodes' node set: `status.capacity[resource] = count` for every (node,
    resource) of the layer."""

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
        provider: ExtendedResourceNodesProvider | None = None,
    ) -> None:
        props = {
            "nodes": nodes,
            # Recorded on each node, so another stack never undoes it.
            "owner": stack_identity(),
            "stack": stack_label(),
            "applied": None,
            "failed": None,
        }
        super().__init__(provider or ExtendedResourceNodesProvider(), name, props, opts)
