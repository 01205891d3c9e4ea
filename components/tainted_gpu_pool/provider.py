"""Dynamic provider: the GPU pool's taint and labels on every pool node, as one resource.

Per node, one merge patch (with a resourceVersion precondition, retried on conflict) edits
only the pool's entry of spec.taints, so the taints Kubernetes manages stay (server-side
apply would treat spec.taints as one atomic list), and sets the pool's labels. The same patch
records on the node who added each item, the value it set and what it replaced (an ownership
annotation per taint and per label): destroy puts back what was there where the node still has
what the stack set, leaves a value someone set since (say the pool's taint key reused to
quarantine a node), and a second stack is refused. The set mechanics (per-node diff, parallel
patches, one error naming every failed node, who owns a record) are
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
    ownership,
    ownership_key,
    stack_identity,
    stack_label,
    update_node,
)
from components.providers.node_set import (
    NodeSetProvider,
    NodeStep,
    Owner,
    merge_patches,
    refuse_set_since,
    written,
)
from components.settings import PROJECT


def _same(taint: Mapping[str, Any], key: str, effect: str) -> bool:
    return taint.get("key") == key and taint.get("effect") == effect


def find_taint(node: Mapping[str, Any], key: str, effect: str) -> dict[str, Any] | None:
    """The node's taint with this (key, effect), or None."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if _same(taint, key, effect):
            return dict(taint)
    return None


def taint_entry(key: str, value: str, effect: str) -> dict[str, Any]:
    """A taint as the API stores it (an empty value is omitted)."""
    return {"key": key, "effect": effect, **({"value": value} if value else {})}


def equal_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all((a.get(f) or "") == (b.get(f) or "") for f in ("key", "value", "effect"))


def set_taint(key: str, effect: str, wanted: Mapping[str, Any] | None) -> Mutate:
    """A mutate function for update_node: make the (key, effect) entry `wanted`, or drop it.

    Every other taint is kept as it is, in its place.
    """

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        taints = list((node.get("spec") or {}).get("taints") or [])
        current = next((t for t in taints if _same(t, key, effect)), None)
        if current is None and wanted is None:
            return None
        if current is not None and wanted is not None and equal_taint(current, wanted):
            return None
        new = [t for t in taints if not _same(t, key, effect)] + ([dict(wanted)] if wanted else [])
        return {"spec": {"taints": new or None}}

    return mutate


def taint_ownership_key(key: str, effect: str) -> str:
    return ownership_key("taint", f"{key}:{effect}")


def label_ownership_key(name: str) -> str:
    return ownership_key("label", name)


def _node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name"))


def _note(record: Mapping[str, Any] | None, owner: Owner, previous: Any, value: Any) -> str | None:
    """The record to write, or None when the node has it already."""
    note = owner.record(previous, value)
    return None if record == note else json.dumps(note, sort_keys=True)


def claim_label(owner: Owner, name: str, value: str, wrote: str | None = None) -> Mutate:
    """Set the label and record, on the node, that `owner` set it and the value it replaced.

    `wrote` is what the stack's state says it set before (for records that do not say). A value
    someone set since is refused, never overwritten; a label that is gone is put back.
    """

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = node.get("metadata") or {}
        key = label_ownership_key(name)
        record = ownership(node, key)
        owner.refuse_another(record, f"label {name}", _node_name(node))
        live = (meta.get("labels") or {}).get(name)
        previous = live
        if record is not None:
            before = written(record, wrote)
            refuse_set_since(f"label {name}", _node_name(node), live, before, value)
            previous = record.get("previous")
        patch: dict[str, Any] = {}
        if live != value:
            patch["labels"] = {name: value}
        note = _note(record, owner, previous, value)
        if note is not None:
            patch["annotations"] = {key: note}
        return {"metadata": patch} if patch else None

    return mutate


def release_label(owner: Owner, name: str, wrote: str | None = None) -> Mutate:
    """Drop the record and, if the label still has the value the stack set, put back the value
    it replaced; a value someone set since stays."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        key = label_ownership_key(name)
        record = ownership(node, key)
        if record is None or not owner.holds(record):
            return None  # released already, or another stack's now
        previous = record.get("previous")
        live = ((node.get("metadata") or {}).get("labels") or {}).get(name)
        before = written(record, wrote)
        patch: dict[str, Any] = {"annotations": {key: None}}
        if (before is None or live == before) and live != previous:
            patch["labels"] = {name: previous}
        return {"metadata": patch}

    return mutate


def claim_pool_taint(
    owner: Owner, key: str, effect: str, wanted: Mapping[str, Any], wrote: Any = None
) -> Mutate:
    """Make the pool's (key, effect) entry `wanted`, keeping every other taint, and record that
    `owner` added it and which entry it replaced. As for labels: a value someone set since is
    refused, an entry that is gone is put back."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        annotation = taint_ownership_key(key, effect)
        record = ownership(node, annotation)
        owner.refuse_another(record, f"taint {key}:{effect}", _node_name(node))
        live = find_taint(node, key, effect)
        previous = live
        if record is not None:
            before = written(record, wrote)
            what = f"taint {key}:{effect}"
            refuse_set_since(what, _node_name(node), live, before, wanted, equal_taint)
            previous = record.get("previous")
        patch = set_taint(key, effect, wanted)(node) or {}
        note = _note(record, owner, previous, dict(wanted))
        if note is not None:
            patch["metadata"] = {"annotations": {annotation: note}}
        return patch or None

    return mutate


def release_pool_taint(owner: Owner, key: str, effect: str, wrote: Any = None) -> Mutate:
    """Drop the record and, if the entry is still the one the stack set, put back the entry it
    replaced; an entry someone changed since (another value, or the entry gone) stays."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        annotation = taint_ownership_key(key, effect)
        record = ownership(node, annotation)
        if record is None or not owner.holds(record):
            return None  # released already, or another stack's now
        live = find_taint(node, key, effect)
        before = written(record, wrote)
        ours = before is None or (live is not None and equal_taint(live, before))
        patch = set_taint(key, effect, record.get("previous"))(node) if ours else None
        return merge_patches(patch, {"metadata": {"annotations": {annotation: None}}})

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

    def claim(self, step: NodeStep, spec: Any) -> dict[str, Any]:
        owner, record, props = step.owner, step.record, step.props
        key, effect = props["key"], props["effect"]
        wanted = taint_entry(key, spec["value"], effect)
        before = (record or {}).get("spec") or {}
        wrote = taint_entry(key, before["value"], effect) if "value" in before else None
        old_labels: Mapping[str, str] = before.get("labels") or {}
        dropped = sorted(set(old_labels) - set(spec["labels"]))
        mutate = _combined(
            [claim_pool_taint(owner, key, effect, wanted, wrote)]
            + [
                claim_label(owner, name, value, old_labels.get(name))
                for name, value in spec["labels"].items()
            ]
            + [release_label(owner, name, old_labels[name]) for name in dropped]
        )
        live = update_node(step.api, step.node, mutate, first=step.live)
        taint = ownership(live, taint_ownership_key(key, effect)) or {}
        return {"previous": taint.get("previous")}

    def release(self, step: NodeStep) -> None:
        owner, props = step.owner, step.props
        key, effect = props["key"], props["effect"]
        spec = (step.record or {}).get("spec") or {}
        wrote = taint_entry(key, spec["value"], effect) if "value" in spec else None
        labels: Mapping[str, str] = spec.get("labels") or {}
        mutate = _combined(
            [release_pool_taint(owner, key, effect, wrote)]
            + [release_label(owner, name, labels[name]) for name in sorted(labels)]
        )
        update_node(step.api, step.node, mutate, first=step.live)

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


class GpuPoolNodes(Resource, module=PROJECT, name="GpuPoolNodes"):
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
            "stack": stack_label(),
            "applied": None,
            "failed": None,
        }
        super().__init__(provider or GpuPoolNodesProvider(), name, props, opts)
