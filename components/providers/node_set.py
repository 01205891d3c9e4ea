"""One dynamic resource per layer for an edit on many nodes: diffed per node, applied in parallel.

The engine's cost per resource is what a fleet pays with Python dynamic providers: a resource
per node and per item made `pulumi up` on 1,213 GPU nodes take 9x the time of a plain client
doing the same patches, and printed thousands of progress lines (bench/README.md, "Fleet
scale"). A node-set resource carries the whole layer instead: its inputs are the wanted state
of every node, its outputs what was applied on each node (`applied`) and which nodes failed
(`failed`).

- diff compares per node, without calling the cluster: a no-op `up` is a single diff;
- create/update touch only the nodes that changed (new, edited, drifted, failed before, or
  removed from the inventory, which are released), `CONNECTIONS` nodes at a time, starting
  from one LIST of the nodes (a write re-reads its node only after a conflict);
- a node that fails does not stop the others: the resource is saved with what was applied,
  and its component fails the run naming every failed node (`failure_message`); the next
  `up` retries just those nodes, and forgets those that left the layer (a node deleted from
  the cluster, then taken out of the inventory): `failed` is the last run's alone;
- read lists the nodes once: a node that is gone drops out of `applied`, drift is marked;
- delete releases every applied node (a node that is gone is done) and fails naming the nodes
  it could not release, which stay in the state for the next `destroy`.

Ownership stays on the nodes (node_api.ownership): each record names the stack's id
(node_api.stack_identity, kept in the stack's state, so a rename keeps it and another backend's
stack of the same names is another owner), what the stack wrote and what it replaced. A second
stack is refused per node. An item is the stack's only while its live value is what the stack
wrote: destroy, or a node or item leaving the layer, puts back what was there before only
then, and otherwise leaves the value someone set since and drops the record; `up` puts an
item back when it is gone, and refuses, naming the node, to overwrite a value someone set since.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    UpdateResult,
)

from components.providers.credentials import RunCredentials
from components.providers.node_api import (
    CONNECTIONS,
    Connect,
    NodeApi,
    NodeApiError,
    NodeNotFound,
    connect,
)

T = TypeVar("T")

SET_MARK = {"by": "node-set"}
"""Written into the ownership records of node-set resources: the per-item resources of an
earlier version of the stack, deleted after the node set took their nodes over, leave such a
record (and what it stands for) alone."""


def taken_over(record: Mapping[str, Any] | None) -> bool:
    """Whether a node-set resource now holds this ownership record."""
    return record is not None and record.get("by") == SET_MARK["by"]


@dataclass(frozen=True)
class Owner:
    """Whose ownership records a node set writes, and which ones it takes for its own."""

    id: str
    """The stack's id (node_api.stack_identity), written into every record."""
    label: str = ""
    """organization/project/stack, written beside the id for a reader."""
    former: frozenset[str] = frozenset()
    """Identities the stack wrote records under before it had an id (organization/project/
    stack, also under an earlier name): its own on the nodes its state lists."""

    def holds(self, record: Mapping[str, Any] | None) -> bool:
        """Whether `record` is this stack's."""
        if record is None:
            return False
        owner = record.get("owner")
        if owner == self.id or owner in self.former:
            return True
        # The per-node resources of earlier versions recorded organization/project/stack and
        # no mark; the node set takes their records over (and marks them) on its first `up`.
        return bool(self.label) and owner == self.label and not taken_over(record)

    def refuse_another(self, record: Mapping[str, Any] | None, what: str, node: str) -> None:
        """Refuse to take over what another stack added."""
        if record is not None and not self.holds(record):
            raise NodeApiError(
                f"{what} on node {node!r} is managed by {describe_owner(record)}; two stacks "
                "must not manage the same item"
            )

    def record(self, previous: Any, value: Any) -> dict[str, Any]:
        """The ownership record of an item: who wrote `value`, replacing `previous`."""
        label = {"stack": self.label} if self.label else {}
        return {"owner": self.id, **label, "previous": previous, "value": value, **SET_MARK}

    def without_former(self) -> Owner:
        """This owner on a node its state does not list."""
        return Owner(self.id, self.label)


def describe_owner(record: Mapping[str, Any]) -> str:
    """How an error names the stack that wrote `record`."""
    owner, label = record.get("owner"), record.get("stack")
    if not label or label == owner:
        return f"stack {owner!r}"
    return f"stack {label!r} (stack id {owner})"


def owner_of(props: Mapping[str, Any], state: Mapping[str, Any]) -> Owner:
    """The owner a node set's `props` name. Its `state` (outputs) adds the identities the
    stack wrote records under before: the state's `owner`, when it was another (the
    organization/project/stack of a state older than the stack's id), and `former_owners`."""
    current = str(props["owner"])
    former = {str(o) for o in state.get("former_owners") or ()}
    if state.get("owner"):
        former.add(str(state["owner"]))
    former.discard(current)
    return Owner(current, str(props.get("stack") or ""), frozenset(former))


def written(record: Mapping[str, Any], fallback: Any) -> Any:
    """What the stack wrote for `record`'s item: the record says so (written from this version
    on), or else `fallback` (the stack's state); None when neither knows."""
    return record.get("value", fallback)


def refuse_set_since(
    what: str,
    node: str,
    live: Any,
    wrote: Any,
    wanted: Any,
    same: Callable[[Any, Any], bool] = operator.eq,
) -> None:
    """Refuse to overwrite a value someone set since the stack wrote its own: `live` is there,
    and is neither what the stack wrote (`wrote`, None when unknown) nor what it wants now. A
    value that is gone is no one's: `up` puts it back."""
    if live is None or wrote is None or same(live, wrote) or same(live, wanted):
        return
    raise NodeApiError(
        f"{what} on node {node!r} was changed since this stack set it (the stack set {wrote!r}, "
        f"the node has {live!r}); it is left as it is: set it back to let `up` manage it, or "
        "take the node out of the layer (the stack then leaves the value and forgets it)"
    )


def for_each_node(
    nodes: Iterable[str], fn: Callable[[str], T], workers: int = CONNECTIONS
) -> tuple[dict[str, T], dict[str, str]]:
    """`fn(node)` for every node, `workers` at a time: ({node: result}, {node: error message})."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {node: pool.submit(fn, node) for node in nodes}
    done: dict[str, T] = {}
    failed: dict[str, str] = {}
    for node, future in futures.items():
        error = future.exception()
        if error is None:
            done[node] = future.result()
        elif isinstance(error, NodeApiError):
            failed[node] = str(error)
        else:
            failed[node] = f"{type(error).__name__}: {error}"
    return done, failed


def failure_message(what: str, failed: Mapping[str, str], total: int) -> str:
    """One error for every failed node, each on its own line with its reason."""
    lines = [f"{what}: {len(failed)} of {total} nodes failed, the others are done:"]
    lines += [f"  {node}: {failed[node]}" for node in sorted(failed)]
    return "\n".join(lines)


def _by_name(nodes: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str((n.get("metadata") or {}).get("name")): n for n in nodes}


def merge_patches(*patches: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """JSON merge patches combined into one (later ones win; None values are kept)."""
    merged: dict[str, Any] = {}
    for patch in patches:
        for key, value in (patch or {}).items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
                merged[key] = merge_patches(merged[key], value)
            else:
                merged[key] = dict(value) if isinstance(value, Mapping) else value
    return merged or None


@dataclass(frozen=True)
class NodeStep:
    """One node's turn in a run of its set: what `claim` and `release` work from."""

    api: NodeApi
    live: dict[str, Any]
    """The node as listed."""
    record: Mapping[str, Any] | None
    """What the state holds for the node (what the stack applied there last), if anything."""
    owner: Owner
    props: Mapping[str, Any]
    """The set's inputs (for a release: those it was applied with)."""

    @property
    def node(self) -> str:
        return str(self.live["metadata"]["name"])


class Plan(NamedTuple):
    """What an `up` does to get a node set from its state to its inputs."""

    claim: list[str]
    """Nodes to apply (new, edited, drifted, failed before)."""
    release: list[str]
    """Nodes the state holds that left the layer: undone."""
    forget: list[str]
    """Nodes that failed and left the layer without ever being applied: dropped from `failed`."""

    def __bool__(self) -> bool:
        return bool(self.claim or self.release or self.forget)


class NodeSetProvider(RunCredentials):
    """CRUD of one layer's edit on a set of nodes; subclasses say what a node's edit is.

    A subclass implements `wanted` (props -> {node: spec}), `claim` (apply a spec to one
    node, returning the record kept in `applied`), `release` (undo a record) and `observe`
    (compare a live node with its record). `claim` and `release` get the `Owner` whose
    records they write and recognize.

    Props: the subclass's inputs plus `owner` (the stack's id) and `stack` (its label); the
    outputs add `applied`, `failed` and `former_owners` (see `owner_of`).
    """

    what = "node edit"
    """How errors name the layer's edit."""
    replace_keys: tuple[str, ...] = ()
    """Inputs whose change replaces the resource (release every node, then claim again)."""

    def __init__(self, connect_api: Connect = connect, workers: int = CONNECTIONS) -> None:
        super().__init__()
        self._connect = connect_api
        self._workers = workers

    def _api(self) -> NodeApi:
        return self._connect(*self.credentials())

    # What a subclass says about one node.

    def resource_id(self, props: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def wanted(self, props: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def claim(self, step: NodeStep, spec: Any) -> dict[str, Any]:
        """Apply `spec` to the node `step.live` (as listed: a write starts from it, and re-reads
        the node only on a conflict); `step.record` is what the state holds for the node (what
        the stack applied there last), if anything. Return what to keep in `applied`."""
        raise NotImplementedError

    def release(self, step: NodeStep) -> None:
        """Undo on the node `step.live` what this stack recorded there (`step.record`)."""
        raise NotImplementedError

    def observe(
        self, live: Mapping[str, Any], record: Mapping[str, Any], props: Mapping[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError

    # The set.

    def plan(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> Plan:
        """What to do to get from the state `olds` to the inputs `news`."""
        wanted = self.wanted(news)
        applied: Mapping[str, Any] = olds.get("applied") or {}
        failed: Mapping[str, str] = olds.get("failed") or {}
        claim = [
            node
            for node, spec in wanted.items()
            if node not in applied
            or node in failed
            or applied[node].get("spec") != spec
            or applied[node].get("drift")
        ]
        release = [node for node in applied if node not in wanted]
        forget = [node for node in failed if node not in wanted and node not in applied]
        return Plan(claim, release, forget)

    def _release_all(
        self,
        api: NodeApi,
        records: Mapping[str, Any],
        owner: Owner,
        props: Mapping[str, Any],
    ) -> tuple[dict[str, None], dict[str, str]]:
        live = _by_name(api.list_nodes()) if records else {}

        def release(node: str) -> None:
            if node not in live:
                return  # a node that is gone took the edit with it
            try:
                self.release(NodeStep(api, live[node], records[node], owner, props))
            except NodeNotFound:
                return  # deleted meanwhile: nothing left to undo

        return for_each_node(records, release, self._workers)

    def _apply(self, olds: Mapping[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        api = self._api()
        wanted = self.wanted(news)
        before: dict[str, Any] = dict(olds.get("applied") or {})
        plan = self.plan(olds, news)
        # Records of an identity the stack had before are its own on the nodes it applied.
        owner = owner_of(news, olds)
        released, release_failed = self._release_all(
            api, {node: before[node] for node in plan.release}, owner, olds
        )
        # One LIST instead of a read per node: each write starts from the listed node.
        live = _by_name(api.list_nodes()) if plan.claim else {}

        def claim(node: str) -> dict[str, Any]:
            if node not in live:
                raise NodeNotFound(f"node {node!r} not found on API server {api.server}")
            known = owner if node in before else owner.without_former()
            return self.claim(
                NodeStep(api, live[node], before.get(node), known, news), wanted[node]
            )

        claimed, claim_failed = for_each_node(plan.claim, claim, self._workers)
        # A node that failed keeps its earlier record: still applied as before, retried next.
        applied = {node: r for node, r in before.items() if node not in released}
        applied.update(
            {node: {**r, "spec": wanted[node], "drift": False} for node, r in claimed.items()}
        )
        # `failed` is this run's alone: a node that left the layer is no longer retried.
        return {
            **news,
            "applied": applied,
            "failed": {**release_failed, **claim_failed},
            "former_owners": sorted(owner.former),
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=self.resource_id(props), outs=self._apply({}, props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._apply(olds, news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in self.replace_keys if olds.get(k) != news.get(k)]
        # A new owner id (the first `up` of a stack that had none) goes into the state.
        changed = bool(replaces) or olds.get("owner") != news.get("owner")
        return DiffResult(
            changes=changed or bool(self.plan(olds, news)),
            replaces=replaces,
            delete_before_replace=True,
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        live = _by_name(self._api().list_nodes())
        applied = {
            node: self.observe(live[node], record, props)
            for node, record in (props.get("applied") or {}).items()
            if node in live  # a node that is gone took this edit with it
        }
        return ReadResult(id_=id_, outs={**props, "applied": applied})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        applied: Mapping[str, Any] = props.get("applied") or {}
        _, failed = self._release_all(self._api(), applied, owner_of(props, props), props)
        if failed:
            raise NodeApiError(failure_message(f"undo {self.what}", failed, len(applied)))
