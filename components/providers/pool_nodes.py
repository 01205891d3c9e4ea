"""Dynamic provider: the GPU pool's taint and labels on every pool node, as one resource.

Per node, one merge patch (with a resourceVersion precondition, retried on conflict) edits
only the pool's entry of spec.taints, so the taints Kubernetes manages stay (server-side
apply would treat spec.taints as one atomic list), and sets the pool's labels. The same patch
records on the node who added each item and what it replaced (an ownership annotation per
taint and per label): destroy puts back exactly what was there, and a second stack is refused.
The set mechanics (per-node diff, parallel patches, one error naming every failed node) are
components/providers/node_set.py's.

# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import Resource

from components.providers.node_api import (
    Mutate,
    NodeApi,
    NodeNotFound,
    owned_by_another,
    ownership,
    ownership_key,
    stack_identity,
    update_node,
)
from components.providers.node_set import SET_MARK, NodeSetProvider, merge_patches, taken_over
from components.providers.node_taint import (
    claim_taint,
    equal_taint,
    find_taint,
    set_taint,
    taint_entry,
    taint_ownership_key,
)


def label_ownership_key(name: str) -> str:
    return ownership_key("label", name)


def claim_label(owner: str, name: str, value: str) -> Mutate:
    """Set the label and record, on the node, that `owner` set it and the value it replaced."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = node.get("metadata") or {}
        key = label_ownership_key(name)
        record = ownership(node, key)
        owned_by_another(record, owner, f"label {name}", str(meta.get("name")))
        patch: dict[str, Any] = {}
        if (meta.get("labels") or {}).get(name) != value:
            patch["labels"] = {name: value}
        if not taken_over(record):
            previous = record.get("previous") if record else (meta.get("labels") or {}).get(name)
            note = json.dumps({"owner": owner, "previous": previous, **SET_MARK}, sort_keys=True)
            patch["annotations"] = {key: note}
        return {"metadata": patch} if patch else None

    return mutate


def release_label(owner: str, name: str) -> Mutate:
    """Put back the value the label had before `owner` set it, and drop the record."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        key = label_ownership_key(name)
        record = ownership(node, key)
        if record is None or record.get("owner") != owner:
            return None  # released already, or another stack's now
        previous = record.get("previous")
        patch: dict[str, Any] = {"annotations": {key: None}}
        if ((node.get("metadata") or {}).get("labels") or {}).get(name) != previous:
            patch["labels"] = {name: previous}
        return {"metadata": patch}

    return mutate


def release_pool_taint(owner: str, key: str, effect: str) -> Mutate:
    """Put back the taint entry the pool's replaced, and drop the record."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        record = ownership(node, taint_ownership_key(key, effect))
        if record is None or record.get("owner") != owner:
            return None  # released already, or another stack's now
        patch = set_taint(key, effect, record.get("previous"))(node)
        return merge_patches(
            patch, {"metadata": {"annotations": {taint_ownership_key(key, effect): None}}}
        )

    return mutate


def _combined(mutates: list[Mutate]) -> Mutate:
    """Several mutate functions on the same node as one patch (they touch disjoint fields)."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        return merge_patches(*(m(node) for m in mutates))

    return mutate


class GpuPoolNodesProvider(NodeSetProvider):
    """The pool's taint and labels on a set of nodes."""

    what = "the GPU pool's taint and labels"
    replace_keys = ("key", "effect")

    def resource_id(self, props: Mapping[str, Any]) -> str:
        return f"{props['key']}:{props['effect']}"

    def wanted(self, props: Mapping[str, Any]) -> dict[str, Any]:
        spec = {"value": props["value"], "labels": dict(props.get("labels") or {})}
        return {node: spec for node in props["nodes"]}

    def claim(
        self,
        api: NodeApi,
        live: dict[str, Any],
        spec: Any,
        record: Mapping[str, Any] | None,
        props: Mapping[str, Any],
    ) -> dict[str, Any]:
        owner, key, effect = props["owner"], props["key"], props["effect"]
        wanted = taint_entry(key, spec["value"], effect)
        dropped = set(((record or {}).get("spec") or {}).get("labels") or {}) - set(spec["labels"])
        mutate = _combined(
            [claim_taint(owner, key, effect, wanted, SET_MARK)]
            + [claim_label(owner, name, value) for name, value in spec["labels"].items()]
            + [release_label(owner, name) for name in sorted(dropped)]
        )
        live = update_node(api, live["metadata"]["name"], mutate, first=live)
        taint = ownership(live, taint_ownership_key(key, effect)) or {}
        return {"previous": taint.get("previous")}

    def release(
        self,
        api: NodeApi,
        live: dict[str, Any],
        record: Mapping[str, Any],
        props: Mapping[str, Any],
    ) -> None:
        owner, key, effect = props["owner"], props["key"], props["effect"]
        labels = (record.get("spec") or {}).get("labels") or {}
        mutate = _combined(
            [release_pool_taint(owner, key, effect)]
            + [release_label(owner, name) for name in sorted(labels)]
        )
        try:
            update_node(api, live["metadata"]["name"], mutate, first=live)
        except NodeNotFound:
            return  # deleted meanwhile: nothing left to undo

    def observe(
        self, live: Mapping[str, Any], record: Mapping[str, Any], props: Mapping[str, Any]
    ) -> dict[str, Any]:
        spec = record.get("spec") or {}
        taint = find_taint(live, props["key"], props["effect"])
        wanted = taint_entry(props["key"], spec.get("value", ""), props["effect"])
        labels = (live.get("metadata") or {}).get("labels") or {}
        drift = taint is None or not equal_taint(taint, wanted)
        drift = drift or any(labels.get(k) != v for k, v in (spec.get("labels") or {}).items())
        return {**record, "drift": drift}


class GpuPoolNodes(Resource, module="gpu-cluster", name="GpuPoolNodes"):
    """The pool's taint and labels on every pool node, leaving every other taint alone."""

    applied: pulumi.Output[dict[str, Any]]
    """{node: what was applied there and the taint entry it replaced}."""
    failed: pulumi.Output[dict[str, str]]
    """{node: why its last change failed}; empty when every node is done."""

    def __init__(
        self,
        name: str,
        *,
        nodes: pulumi.Input[list[str]],
        key: pulumi.Input[str],
        value: pulumi.Input[str],
        effect: pulumi.Input[str],
        labels: pulumi.Input[dict[str, str]],
        opts: pulumi.ResourceOptions | None = None,
        provider: GpuPoolNodesProvider | None = None,
    ) -> None:
        props = {
            "nodes": nodes,
            "key": key,
            "value": value,
            "effect": effect,
            "labels": labels,
            # Recorded on each node with what it added, so another stack never undoes it.
            "owner": stack_identity(),
            "applied": None,
            "failed": None,
        }
        super().__init__(provider or GpuPoolNodesProvider(), name, props, opts)
