"""Node access shared by the dynamic providers: one client, one retry loop, one error style.

pulumi-kubernetes cannot express the two node edits this project needs: a JSON patch of the
node's *status* subresource (extended resources) and a per-entry edit of spec.taints that
keeps the taints Kubernetes manages. Both providers go through `NodeApi`, implemented here
with the official `kubernetes` client (kubeconfig contexts, exec/OIDC plugins, TLS, proxies).

Also who the stack is on the cluster (`stack_identity`): an id minted once per stack and kept
in its state, which the claim on the cluster and the ownership records on the nodes carry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import pulumi
import yaml
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)

from components.settings import PROJECT

FIELD_MANAGER = PROJECT
CONNECTIONS = 8
"""Node calls in flight at once (the node-set providers' thread pool, the client's pool)."""
LIST_PAGE = 500


class NodeApiError(RuntimeError):
    """A node operation failed; the message names the node and the API server."""


class NotFound(NodeApiError):
    """The object does not exist."""


class NodeNotFound(NotFound):
    """The node does not exist."""


class Conflict(NodeApiError):
    """The object changed since it was read (resourceVersion precondition failed)."""


class NodeApi(Protocol):
    """The few node calls the providers make. Nodes travel as plain JSON dicts."""

    server: str

    def get_node(self, name: str) -> dict[str, Any]: ...

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node of the cluster (one paged LIST, not one read per node)."""
        ...

    def patch_status(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply a JSON patch (RFC 6902) to /api/v1/nodes/<name>/status."""
        ...

    def merge_patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Apply a JSON merge patch to the node; a metadata.resourceVersion in it is a precondition."""
        ...


def json_pointer_escape(token: str) -> str:
    """Escape one JSON-pointer token: `~` as `~0`, `/` as `~1` (RFC 6901, section 3)."""
    return token.replace("~", "~0").replace("/", "~1")


def api_client_from_kubeconfig(
    kubeconfig: str, context: str | None, connections: int | None = None
) -> Any:
    """A `kubernetes.client.ApiClient` from kubeconfig content ("" uses the default lookup).

    `connections` sizes the client's connection pool for that many concurrent calls.
    """
    from kubernetes import client, config

    try:
        document = yaml.safe_load(kubeconfig) if kubeconfig.strip() else None
    except yaml.YAMLError as exc:
        raise NodeApiError(f"the kubeconfig is not valid YAML: {exc}") from exc
    configuration = client.Configuration()
    try:
        if document:
            config.load_kube_config_from_dict(
                document, context=context, client_configuration=configuration
            )
        else:
            config.load_kube_config(context=context, client_configuration=configuration)
    except Exception as exc:
        raise NodeApiError(f"cannot load kubeconfig (context {context!r}): {exc}") from exc
    if connections:
        configuration.connection_pool_maxsize = max(
            connections, configuration.connection_pool_maxsize
        )
    return client.ApiClient(configuration)


def call_api(
    server: str,
    subject: str,
    what: str,
    fn: Callable[[], Any],
    not_found: type[NotFound] = NotFound,
) -> Any:
    """Run one client call; map its failure to an error naming `subject` and the server."""
    from kubernetes.client.exceptions import ApiException

    try:
        return fn()
    except ApiException as exc:
        raise api_error(exc.status, _reason(exc), subject, what, server, not_found) from exc
    except Exception as exc:  # connection refused, DNS, TLS
        raise NodeApiError(
            f"cannot {what} {subject}: API server {server} unreachable: {exc}"
        ) from exc


class KubeNodeApi:
    """NodeApi over the official kubernetes client (safe to share between threads)."""

    def __init__(self, kubeconfig: str, context: str | None) -> None:
        from kubernetes import client

        api_client = api_client_from_kubeconfig(kubeconfig, context, CONNECTIONS)
        self.server = str(api_client.configuration.host)
        self._core = client.CoreV1Api(api_client)

    def _call(self, node: str, what: str, fn: Callable[[], Any]) -> dict[str, Any]:
        response = call_api(self.server, f"node {node!r}", what, fn, NodeNotFound)
        return dict(json.loads(response.data))

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call(name, "read", lambda: self._core.read_node(name, _preload_content=False))

    def list_nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page: dict[str, Any] = {"limit": LIST_PAGE, "_preload_content": False}
            if token:
                page["_continue"] = token
            response = call_api(
                self.server, "the nodes", "list", functools.partial(self._core.list_node, **page)
            )
            body = json.loads(response.data)
            items += body.get("items") or []
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return items

    def patch_status(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return self._patch(name, "patch the status of", self._core.patch_node_status, ops, "json")

    def merge_patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._patch(name, "patch", self._core.patch_node, patch, "merge")

    def _patch(
        self, name: str, doing: str, call: Callable[..., Any], body: Any, kind: str
    ) -> dict[str, Any]:
        """`call` (a CoreV1Api node patch) with a JSON Patch or a JSON Merge Patch body."""
        content_type = f"application/{kind}-patch+json"
        return self._call(
            name,
            doing,
            lambda: call(
                name,
                body,
                field_manager=FIELD_MANAGER,
                _content_type=content_type,
                _preload_content=False,
            ),
        )


def _reason(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _api_error(status: int, reason: str, node: str, what: str, server: str) -> NodeApiError:
    """Map an HTTP status on a node call to the error a platform engineer can act on."""
    return api_error(status, reason, f"node {node!r}", what, server, NodeNotFound)


STALE_CREDENTIALS_HINT = (
    "If the credentials changed since the last `pulumi up`, run `pulumi refresh --run-program` "
    "or `pulumi destroy --run-program`: without it the engine reuses the provider "
    "configuration saved by the last up"
)


def api_error(
    status: int,
    reason: str,
    subject: str,
    what: str,
    server: str,
    not_found: type[NotFound] = NotFound,
) -> NodeApiError:
    """Map an HTTP status to an error naming `subject` (e.g. "node 'gpu-1'") and the server."""
    if status == 404:
        return not_found(f"{subject} not found on API server {server}")
    if status == 409:
        return Conflict(f"{subject} changed on API server {server} while updating it: {reason}")
    if status == 401:
        return NodeApiError(
            f"API server {server} refused the credentials to {what} {subject} "
            f"(HTTP {status}): {reason}. {STALE_CREDENTIALS_HINT}"
        )
    if status == 403:
        return NodeApiError(
            f"API server {server} refused the credentials to {what} {subject} "
            f"(HTTP {status}): {reason}"
        )
    return NodeApiError(f"cannot {what} {subject} on API server {server} (HTTP {status}): {reason}")


Connect = Callable[[str, "str | None"], NodeApi]
Mutate = Callable[[Mapping[str, Any]], "dict[str, Any] | None"]


def connect(kubeconfig: str, context: str | None) -> NodeApi:
    """The production NodeApi factory; providers take another one in tests."""
    return KubeNodeApi(kubeconfig, context)


def stack_label() -> str:
    """organization/project/stack of the running program: how a record names its stack to a
    reader. Not an identity: `pulumi stack rename` changes it, and two self-managed backends
    may hold stacks of the same names."""
    return f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"


class StackIdentityProvider(ResourceProvider):
    """Mints the stack's id when the resource is created; an update (a renamed stack's new
    label) keeps it, and nothing replaces it."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=uuid.uuid4().hex, outs=dict(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=olds.get("label") != news.get("label"), replaces=[])

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=dict(news))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_=id_, outs=props)


class StackIdentity(Resource, module=PROJECT, name="StackIdentity"):
    """The stack's id (this resource's id): minted on the stack's first `up`, kept in its state."""

    label: pulumi.Output[str]
    """organization/project/stack when last run (for a reader)."""

    def __init__(
        self, name: str, *, label: str, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(StackIdentityProvider(), name, {"label": label}, opts)


IDENTITY_NAME = "stack-identity"
_identity_lock = threading.Lock()
_identity: tuple[Any, pulumi.Output[str]] | None = None
"""The run (its resource monitor) and the id registered for it."""


def stack_identity() -> pulumi.Output[str]:
    """The running stack's id: who owns what the stack records on the cluster (its claim, the
    ownership records on the nodes).

    A random id minted on the stack's first `up` and kept in its state (the StackIdentity
    resource, registered by the first call of each run), so `pulumi stack rename` keeps it,
    and two self-managed backends holding stacks of the same project and stack names have two.
    It is known once that resource exists: at the first `up`'s preview it is unknown.
    """
    global _identity
    run = pulumi.runtime.settings.get_monitor()
    with _identity_lock:
        if _identity is None or _identity[0] is not run:
            _identity = (run, StackIdentity(IDENTITY_NAME, label=stack_label()).id)
        return _identity[1]


OWNERSHIP_PREFIX = f"ownership.{PROJECT}.io/"
"""Prefix of the node annotations that record what the stack added and what it replaced."""


def ownership_key(kind: str, name: str) -> str:
    """The node annotation recording who added `name` (a taint, a capacity) and what it replaced."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{OWNERSHIP_PREFIX}{kind}-{digest}"


def ownership(node: Mapping[str, Any], annotation: str) -> dict[str, Any] | None:
    """The ownership record stored under `annotation` on `node`, or None."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(annotation)
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def update_node(
    api: NodeApi,
    name: str,
    mutate: Mutate,
    *,
    first: dict[str, Any] | None = None,
    attempts: int = 8,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Read-modify-write of one node, retried when someone else wrote in between.

    `first` is the node as just read (e.g. from a LIST): the first attempt starts from it
    instead of reading the node again.
    """
    return read_modify_write(
        lambda: api.get_node(name),
        lambda patch: api.merge_patch(name, patch),
        mutate,
        first=first,
        attempts=attempts,
        sleep=sleep,
    )


def patch_status_guarded(
    api: NodeApi,
    name: str,
    ops_for: Callable[[Mapping[str, Any]], list[dict[str, Any]]],
    *,
    first: dict[str, Any] | None = None,
    attempts: int = 8,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Read-modify-write through the status subresource, retried when someone else wrote.

    `ops_for` gets the live node and returns JSON patch ops (status, metadata.annotations), or
    [] when nothing needs to change. They are sent after a `replace` of metadata.resourceVersion
    with the version read, so the API server answers 409 if the node moved on; the loop then
    re-reads it. `first` is the node as just read (e.g. from a LIST).

    # Ref: https://github.com/kubernetes/kubernetes/blob/master/pkg/registry/core/node/strategy.go
    (the node status strategy resets only spec: metadata written with the status is kept)
    """
    for attempt in range(attempts):
        live = first if attempt == 0 and first is not None else api.get_node(name)
        ops = ops_for(live)
        if not ops:
            return live
        version = live.get("metadata", {}).get("resourceVersion")
        guard = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
        try:
            return api.patch_status(name, [guard, *ops])
        except Conflict:
            if attempt == attempts - 1:
                raise
            sleep(_backoff(attempt))
    raise AssertionError("unreachable")


def annotation_ops(
    node: Mapping[str, Any], changes: Mapping[str, str | None]
) -> list[dict[str, Any]]:
    """JSON patch ops setting (a value) or removing (None) these annotations of `node`."""
    current = (node.get("metadata") or {}).get("annotations")
    if current is None:
        added = {k: v for k, v in changes.items() if v is not None}
        return [{"op": "add", "path": "/metadata/annotations", "value": added}] if added else []
    ops: list[dict[str, Any]] = []
    for key, value in changes.items():
        path = f"/metadata/annotations/{json_pointer_escape(key)}"
        if value is not None:
            ops.append({"op": "add", "path": path, "value": value})
        elif key in current:
            ops.append({"op": "remove", "path": path})
    return ops


def _backoff(attempt: int) -> float:
    return min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())


def read_modify_write(
    read: Callable[[], dict[str, Any]],
    write: Callable[[dict[str, Any]], dict[str, Any]],
    mutate: Mutate,
    *,
    first: dict[str, Any] | None = None,
    attempts: int = 8,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Read-modify-write of one object, retried when someone else wrote in between.

    `mutate` gets the live object and returns a merge patch (without resourceVersion) or None
    when nothing needs to change. The patch carries the resourceVersion that was read, so
    the API server rejects it with 409 if the object moved on; the loop then re-reads and
    re-applies `mutate` to the fresh object, so a concurrent write is never lost.
    """
    for attempt in range(attempts):
        live = first if attempt == 0 and first is not None else read()
        patch = mutate(live)
        if patch is None:
            return live
        version = live.get("metadata", {}).get("resourceVersion")
        patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": version}}
        try:
            return write(patch)
        except Conflict:
            if attempt == attempts - 1:
                raise
            sleep(_backoff(attempt))
    raise AssertionError("unreachable")
