"""Dynamic provider: one taint on one node, added and removed entry by entry.

The stack now puts the pool's taint on every node with one resource (pool_nodes.py); this
per-node resource stays so that a stack deployed with it can still update and destroy, and
the taint helpers here are shared with the pool. When the pool takes over a node's taint, the
per-node resource's delete (which the engine runs after) leaves it alone.

Server-side apply treats Node.spec.taints as one atomic list, so applying "our" list would
wipe taints that Kubernetes manages (node.kubernetes.io/unschedulable, not-ready, ...). This
provider instead reads the node, edits only the entry with its (key, effect), and writes the
list back with a resourceVersion precondition, retrying on conflict.

If the same (key, effect) was already on the node before the stack, the provider records it:
destroy then puts back exactly what was there, instead of removing someone else's taint.

# Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
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
    Mutate,
    NodeApi,
    NodeNotFound,
    connect,
    owned_by_another,
    ownership,
    ownership_key,
    stack_identity,
    update_node,
)
from components.providers.node_set import taken_over


def _same(taint: Mapping[str, Any], key: str, effect: str) -> bool:
    return taint.get("key") == key and taint.get("effect") == effect


def find_taint(node: Mapping[str, Any], key: str, effect: str) -> dict[str, Any] | None:
    """The node's taint with this (key, effect), or None."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if _same(taint, key, effect):
            return dict(taint)
    return None


def taint_ownership_key(key: str, effect: str) -> str:
    return ownership_key("taint", f"{key}:{effect}")


def claim_taint(
    owner: str,
    key: str,
    effect: str,
    wanted: Mapping[str, Any],
    mark: Mapping[str, str] | None = None,
) -> Mutate:
    """Put our taint on the node and record, on the node itself, that `owner` added it and
    which entry it replaced. A record of this owner (an interrupted run, a re-created stack)
    keeps its `previous`; a record of another owner is a conflict, never overwritten. `mark`
    adds fields to the record (node_set.SET_MARK)."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        record = ownership(node, taint_ownership_key(key, effect))
        name = str((node.get("metadata") or {}).get("name"))
        owned_by_another(record, owner, f"taint {key}:{effect}", name)
        previous = record.get("previous") if record else find_taint(node, key, effect)
        patch = set_taint(key, effect, wanted)(node) or {}
        fields = {"owner": owner, "previous": previous, **(mark or {})}
        if record is None or any(record.get(k) != v for k, v in fields.items()):
            note = json.dumps(fields, sort_keys=True)
            patch["metadata"] = {"annotations": {taint_ownership_key(key, effect): note}}
        return patch or None

    return mutate


def release_taint(owner: str, key: str, effect: str, fallback: Mapping[str, Any] | None) -> Mutate:
    """Undo our taint: restore the entry it replaced and drop the record. A taint another stack
    or the pool's node set (pool_nodes.py) now holds is left alone; without a record (older
    state) `fallback` is what it replaced."""

    def mutate(node: Mapping[str, Any]) -> dict[str, Any] | None:
        record = ownership(node, taint_ownership_key(key, effect))
        if record is not None and (record.get("owner") != owner or taken_over(record)):
            return None  # another stack's, or the pool's node set holds it now
        previous = record.get("previous") if record else fallback
        patch = set_taint(key, effect, previous)(node) or {}
        if record is not None:
            patch["metadata"] = {"annotations": {taint_ownership_key(key, effect): None}}
        return patch or None

    return mutate


def taint_entry(key: str, value: str, effect: str) -> dict[str, Any]:
    """A taint as the API stores it (an empty value is omitted)."""
    return {"key": key, "effect": effect, **({"value": value} if value else {})}


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


def equal_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all((a.get(f) or "") == (b.get(f) or "") for f in ("key", "value", "effect"))


class NodeTaintProvider(RunCredentials):
    """CRUD for one (key, effect) taint on one node."""

    def __init__(self, connect_api: Connect = connect) -> None:
        super().__init__()
        self._connect = connect_api

    def _api(self, props: Mapping[str, Any]) -> NodeApi:
        return self._connect(*self.credentials())

    def _claim(self, props: Mapping[str, Any]) -> dict[str, Any]:
        api = self._api(props)
        node, key, effect = props["node"], props["key"], props["effect"]
        wanted = taint_entry(key, props["value"], effect)
        live = update_node(api, node, claim_taint(props["owner"], key, effect, wanted))
        record = ownership(live, taint_ownership_key(key, effect)) or {}
        return {**props, "present": True, "previous": record.get("previous")}

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._claim(props)
        return CreateResult(id_=f"{props['node']}/{props['key']}:{props['effect']}", outs=outs)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._claim(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in ("node", "key", "effect") if olds.get(k) != news.get(k)]
        # Credentials are how this run reaches the cluster, not part of the taint: another
        # machine's kubeconfig (CI's preview) or a rotated certificate is no change.
        changed = [k for k in ("value",) if olds.get(k) != news.get(k)]
        if not olds.get("present", True):
            changed.append("present")  # removed behind the stack's back: put it back
        return DiffResult(
            changes=bool(replaces or changed), replaces=replaces, delete_before_replace=True
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        try:
            node = self._api(props).get_node(props["node"])
        except NodeNotFound:
            return ReadResult(id_=None, outs={})  # the node is gone, and its taint with it
        live = find_taint(node, props["key"], props["effect"])
        outs = {**props, "present": live is not None}
        if live is not None:
            outs["value"] = live.get("value") or ""
        return ReadResult(id_=id_, outs=outs)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        # Restore the entry that predates the stack, if any; otherwise remove ours.
        mutate = release_taint(
            str(props.get("owner") or ""), props["key"], props["effect"], props.get("previous")
        )
        try:
            update_node(self._api(props), props["node"], mutate)
        except NodeNotFound:
            return  # a decommissioned node: nothing left to undo


class NodeTaint(Resource, module="gpu-cluster", name="NodeTaint"):
    """One taint on one node, leaving every other taint alone."""

    node: pulumi.Output[str]
    key: pulumi.Output[str]
    value: pulumi.Output[str]
    effect: pulumi.Output[str]
    previous: pulumi.Output[dict[str, Any] | None]
    """The entry with the same (key, effect) that was on the node before; destroy restores it."""

    def __init__(
        self,
        name: str,
        *,
        node: pulumi.Input[str],
        key: pulumi.Input[str],
        value: pulumi.Input[str],
        effect: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
        provider: NodeTaintProvider | None = None,
    ) -> None:
        props = {
            "node": node,
            "key": key,
            "value": value,
            "effect": effect,
            # Recorded on the node with the taint, so another stack never undoes it.
            "owner": stack_identity(),
        }
        super().__init__(provider or NodeTaintProvider(), name, props, opts)
