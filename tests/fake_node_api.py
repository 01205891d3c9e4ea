"""An in-memory stand-in for the node endpoints of kube-apiserver.

A fake, not the real thing: it exists so the providers' create/read/update/diff/delete logic
runs in milliseconds without a cluster. It follows the API server's rules that matter here:
JSON patch (add/remove/test, with `~1` escapes) on the status subresource (status and
metadata; a `replace` of metadata.resourceVersion is a precondition answered by 409), JSON merge patch
with a metadata.resourceVersion precondition answered by 409 Conflict, a resourceVersion
bumped on every write, and 404 for an unknown node. tests/integration runs the same provider
code against a real kube-apiserver.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

from pulumi.dynamic import ResourceProvider

from components.providers.node_api import Conflict, NodeApiError, NodeNotFound

P = TypeVar("P", bound="ResourceProvider")

SERVER = "https://fake-apiserver:6443"


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


class FakeNodeApi:
    server = SERVER

    def __init__(self, nodes: dict[str, dict[str, Any]] | None = None) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.reads = 0
        self.lists = 0
        self.before_write: Callable[[str], None] | None = None
        """Called before each write: lets a test slip in a concurrent change."""
        for name, node in (nodes or {}).items():
            self.add_node(name, node)

    def add_node(self, name: str, node: dict[str, Any] | None = None) -> None:
        body = copy.deepcopy(node or {})
        body.setdefault("metadata", {}).update(name=name, resourceVersion="1")
        body.setdefault("spec", {})
        body.setdefault("status", {}).setdefault("capacity", {"cpu": "8", "memory": "32Gi"})
        self.nodes[name] = body

    def _node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise NodeNotFound(f"node {name!r} not found on API server {SERVER}")
        return self.nodes[name]

    def _bump(self, node: dict[str, Any]) -> None:
        self.writes += 1
        meta = node["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def get_node(self, name: str) -> dict[str, Any]:
        self.reads += 1
        return copy.deepcopy(self._node(name))

    def list_nodes(self) -> list[dict[str, Any]]:
        self.lists += 1
        return [copy.deepcopy(node) for node in self.nodes.values()]

    def edit(self, name: str, fn: Callable[[dict[str, Any]], None]) -> None:
        """A write by someone else (kubectl, the kubelet, a controller)."""
        node = self._node(name)
        fn(node)
        self._bump(node)

    def patch_status(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        if self.before_write:
            self.before_write(name)
        node = copy.deepcopy(self._node(name))
        for op in ops:
            parts = [_unescape(p) for p in op["path"].split("/")[1:]]
            if parts == ["metadata", "resourceVersion"] and op["op"] == "replace":
                if op["value"] != node["metadata"]["resourceVersion"]:
                    raise Conflict(
                        f"node {name!r} changed on API server {SERVER} while updating it"
                    )
                continue
            # The node status strategy resets spec; metadata written with the status is kept.
            if parts[0] not in ("status", "metadata") or parts[:2] == ["metadata", "name"]:
                raise NodeApiError("the fake takes /status and /metadata paths on node status")
            parent = node
            for part in parts[:-1]:
                parent = parent.setdefault(part, {})
            leaf = parts[-1]
            if op["op"] == "add":
                parent[leaf] = op["value"]
            elif op["op"] == "remove":
                if leaf not in parent:
                    raise NodeApiError(f"remove of missing path {op['path']} (HTTP 422)")
                del parent[leaf]
            elif op["op"] == "test" and parent.get(leaf) != op["value"]:
                raise NodeApiError(f"test failed at {op['path']} (HTTP 422)")
        self.nodes[name] = node
        self._bump(node)
        return copy.deepcopy(node)

    def merge_patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.before_write:
            self.before_write(name)
        node = self._node(name)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            raise Conflict(f"node {name!r} changed on API server {SERVER} while updating it")
        merged = _merge(node, {k: v for k, v in patch.items() if k != "metadata"})
        # Annotations and labels merge; resourceVersion is the precondition, not a change.
        meta = {k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"}
        merged["metadata"] = _merge(node["metadata"], meta)
        self.nodes[name] = merged
        self._bump(merged)
        return copy.deepcopy(merged)


def stack_config_request(kubeconfig: str = "kubeconfig-text", context: str = "") -> Any:
    """What the engine hands a dynamic provider at start: the stack's config."""
    from pulumi.dynamic import Config, ConfigureRequest

    from components.kubeconfig import CONTEXT_KEY, KUBECONFIG_KEY
    from components.settings import PROJECT

    raw = {KUBECONFIG_KEY: kubeconfig, CONTEXT_KEY: context}
    return ConfigureRequest(Config(raw_config=raw, project_name=PROJECT))


def configured(provider: P) -> P:
    """`provider` configured as the engine configures it (inline kubeconfig content)."""
    provider.configure(stack_config_request("apiVersion: v1\nkind: Config\n"))
    return provider
