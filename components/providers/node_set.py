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
  `up` retries just those nodes;
- read lists the nodes once: a node that is gone drops out of `applied`, drift is marked;
- delete releases every applied node (a node that is gone is done) and fails naming the nodes
  it could not release, which stay in the state for the next `destroy`.

Ownership stays on the nodes (node_api.ownership): a second stack is refused per node, and
destroy puts back what each node had before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

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


class NodeSetProvider(RunCredentials):
    """CRUD of one layer's edit on a set of nodes; subclasses say what a node's edit is.

    A subclass implements `wanted` (props -> {node: spec}), `claim` (apply a spec to one
    node, returning the record kept in `applied`), `release` (undo a record) and `observe`
    (compare a live node with its record).
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

    def claim(
        self,
        api: NodeApi,
        live: dict[str, Any],
        spec: Any,
        record: Mapping[str, Any] | None,
        props: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Apply `spec` to the node `live` (as listed: a write starts from it, and re-reads
        the node only on a conflict); return what to keep in `applied`."""
        raise NotImplementedError

    def release(
        self,
        api: NodeApi,
        live: dict[str, Any],
        record: Mapping[str, Any],
        props: Mapping[str, Any],
    ) -> None:
        """Undo on the node `live` what this stack recorded there (nothing if it has no record)."""
        raise NotImplementedError

    def observe(
        self, live: Mapping[str, Any], record: Mapping[str, Any], props: Mapping[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError

    # The set.

    def plan(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """(nodes to claim, nodes to release) to get from the state `olds` to `news`."""
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
        return claim, release

    def _release_all(
        self, api: NodeApi, records: Mapping[str, Any], props: Mapping[str, Any]
    ) -> tuple[dict[str, None], dict[str, str]]:
        live = _by_name(api.list_nodes()) if records else {}

        def release(node: str) -> None:
            if node in live:  # a node that is gone took the edit with it
                self.release(api, live[node], records[node], props)

        return for_each_node(records, release, self._workers)

    def _apply(self, olds: Mapping[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        api = self._api()
        wanted = self.wanted(news)
        before: dict[str, Any] = dict(olds.get("applied") or {})
        to_claim, to_release = self.plan(olds, news)
        released, release_failed = self._release_all(
            api, {node: before[node] for node in to_release}, olds
        )
        # One LIST instead of a read per node: each write starts from the listed node.
        live = _by_name(api.list_nodes()) if to_claim else {}

        def claim(node: str) -> dict[str, Any]:
            if node not in live:
                raise NodeNotFound(f"node {node!r} not found on API server {api.server}")
            return self.claim(api, live[node], wanted[node], before.get(node), news)

        claimed, claim_failed = for_each_node(to_claim, claim, self._workers)
        # A node that failed keeps its earlier record: still applied as before, retried next.
        applied = {node: r for node, r in before.items() if node not in released}
        applied.update(
            {node: {**r, "spec": wanted[node], "drift": False} for node, r in claimed.items()}
        )
        return {**news, "applied": applied, "failed": {**release_failed, **claim_failed}}

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=self.resource_id(props), outs=self._apply({}, props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._apply(olds, news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in self.replace_keys if olds.get(k) != news.get(k)]
        to_claim, to_release = self.plan(olds, news)
        return DiffResult(
            changes=bool(replaces or to_claim or to_release),
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
        _, failed = self._release_all(self._api(), applied, props)
        if failed:
            raise NodeApiError(failure_message(f"undo {self.what}", failed, len(applied)))
