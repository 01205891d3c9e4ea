"""Stand-in for the kubernetes provider (server-side apply mode, as ClusterAccess configures it).

- `pulumi:providers:kubernetes`: a client for the kubeconfig and context the program gave the
  provider, so every object reaches exactly the cluster the stack names. An object without an
  explicit provider is refused: the stack must never fall back to the ambient default provider.
- Objects: created with a plain create, which fails if the object already exists (the
  provider does not adopt objects it did not create unless `upsertExistingObjects` is set),
  updated by server-side apply under the provider's field manager, and awaited as
  pulumi-kubernetes awaits them (tests/e2e/readiness.py); the outputs are the live object.
- `*Patch` resources apply only the fields they name under a field manager of their own, and
  on delete give those fields up (an apply of the bare object), leaving the rest as it was.
- Diff is a dry-run apply compared with the live object, so a second `up` of an unchanged
  program finds nothing to do. Delete waits until the object is gone.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import yaml
from kubernetes import config, dynamic
from kubernetes.client.exceptions import ApiException

from .engine import Resource, reveal
from .readiness import not_ready

FIELD_MANAGER = "pulumi-kubernetes"
PROVIDER_TYPE = "pulumi:providers:kubernetes"
# What the API server (not the program) writes: ignored when comparing desired and live.
_SERVER_OWNED = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp")


class KubernetesError(RuntimeError):
    """The API server refused an object, or it did not become ready in time."""


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "").get("message") or exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


def _json_numbers(value: Any) -> Any:
    """Numbers as Go's JSON encoder writes the engine's float64s: 8443.0 becomes 8443."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_numbers(v) for v in value]
    return value


def manifest(res: Resource) -> tuple[dict[str, Any], bool]:
    """The object the provider would send, and whether it is a *Patch resource."""
    body: dict[str, Any] = _json_numbers(reveal(json.loads(json.dumps(res.inputs, default=str))))
    patch = res.typ.endswith("Patch")
    body["kind"] = str(body["kind"]).removesuffix("Patch") if patch else body["kind"]
    metadata = body.setdefault("metadata", {})
    if not metadata.get("name"):
        # The provider auto-names from the resource name with a random suffix.
        metadata["name"] = f"{res.name}-{uuid.uuid4().hex[:8]}"
    return body, patch


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    result = json.loads(json.dumps(obj, default=str))
    metadata = result.get("metadata") or {}
    for key in _SERVER_OWNED:
        metadata.pop(key, None)
    result.pop("status", None)
    return result


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found: list[str] = []
        for key in sorted(set(a) | set(b)):
            found += _differences(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        return found
    return [] if a == b else [path]


class KubernetesObjects:
    """Every `kubernetes:*` resource and the kubernetes provider itself."""

    def __init__(self, ready_timeout: float = 180.0, delete_timeout: float = 180.0) -> None:
        self.ready_timeout = ready_timeout
        self.delete_timeout = delete_timeout
        self._clients: dict[str, dynamic.DynamicClient] = {}
        # The client's discovery is not thread-safe: a miss (a kind whose CRD was just
        # installed) resets its cache while other threads read it (KeyError 'resources').
        self._discovery = threading.Lock()
        self.servers: dict[str, str] = {}
        """Provider id -> the API server its kubeconfig points at."""

    # -------------------------------------------------------------- provider
    def _provider(self, res: Resource) -> tuple[str, dict[str, Any]]:
        inputs = reveal(res.inputs)
        kubeconfig = inputs.get("kubeconfig") or ""
        context = inputs.get("context") or None
        if not kubeconfig:
            raise KubernetesError(
                "the kubernetes provider has no kubeconfig: it would use the ambient one"
            )
        api = config.new_client_from_config_dict(yaml.safe_load(kubeconfig), context=context)
        provider_id = uuid.uuid4().hex
        self._clients[provider_id] = dynamic.DynamicClient(api)
        self.servers[provider_id] = str(api.configuration.host)
        return provider_id, dict(res.inputs)

    def _client(self, res: Resource) -> dynamic.DynamicClient:
        provider_id = res.provider.rpartition("::")[2]
        if not res.provider or provider_id not in self._clients:
            raise KubernetesError(
                f"{res.typ} {res.name} has no explicit kubernetes provider "
                f"(provider reference {res.provider!r})"
            )
        return self._clients[provider_id]

    @staticmethod
    def _field_manager(res: Resource, patch: bool) -> str:
        # A Patch resource owns its own fields, so two patches of one object never collide.
        return f"{FIELD_MANAGER}-patch-{res.name}"[:128] if patch else FIELD_MANAGER

    def _api(self, api: dynamic.DynamicClient, body: Mapping[str, Any]) -> tuple[Any, str | None]:
        with self._discovery:
            resource = api.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        namespace = None
        if resource.namespaced:
            namespace = (body.get("metadata") or {}).get("namespace") or "default"
        return resource, namespace

    def _apply(
        self, res: Resource, body: dict[str, Any], patch: bool, dry_run: bool = False
    ) -> dict[str, Any]:
        api = self._client(res)
        resource, namespace = self._api(api, body)
        try:
            applied = api.server_side_apply(
                resource,
                body=body,
                name=body["metadata"]["name"],
                namespace=namespace,
                field_manager=self._field_manager(res, patch),
                force_conflicts=True,
                dry_run="All" if dry_run else None,
            )
        except ApiException as exc:
            raise KubernetesError(f"HTTP {exc.status}: {_reason(exc)}") from exc
        return dict(applied.to_dict())

    def _get(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any] | None:
        api = self._client(res)
        resource, namespace = self._api(api, body)
        try:
            live = resource.get(name=body["metadata"]["name"], namespace=namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(live.to_dict())

    def _await_ready(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        api = self._client(res)
        deadline = time.monotonic() + self.ready_timeout
        while True:
            live = self._get(res, body)
            if live is None:
                raise KubernetesError("the object disappeared while awaited")
            reason = not_ready(live, api.client)
            if reason is None:
                return live
            if time.monotonic() > deadline:
                raise KubernetesError(f"not ready after {self.ready_timeout:.0f} s: {reason}")
            time.sleep(0.25)

    def _create(self, res: Resource, body: dict[str, Any]) -> None:
        api = self._client(res)
        resource, namespace = self._api(api, body)
        try:
            resource.create(body=body, namespace=namespace, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            raise KubernetesError(f"HTTP {exc.status}: {_reason(exc)}") from exc

    # --------------------------------------------------------------- objects
    def create(self, res: Resource) -> tuple[str, dict[str, Any]]:
        if res.typ == PROVIDER_TYPE:
            return self._provider(res)
        body, patch = manifest(res)
        if patch:
            self._apply(res, body, patch)
        else:
            self._create(res, body)
        live = body if patch else self._await_ready(res, body)
        return self._id(body), {**live, "apiVersion": body["apiVersion"], "kind": body["kind"]}

    @staticmethod
    def _id(body: Mapping[str, Any]) -> str:
        metadata = body.get("metadata") or {}
        namespace = metadata.get("namespace")
        return f"{namespace}/{metadata['name']}" if namespace else str(metadata["name"])

    def diff(self, old: Resource, new: Resource) -> list[str]:
        if new.typ == PROVIDER_TYPE:
            keys = set(old.inputs) | set(new.inputs)
            return sorted(k for k in keys if reveal(old.inputs[k]) != reveal(new.inputs.get(k)))
        body, patch = manifest(new)
        body["metadata"]["name"] = old.id.rpartition("/")[2]
        live = self._get(new, body)
        if live is None:
            return ["(deleted behind the stack's back)"]
        planned = self._apply(new, body, patch, dry_run=True)
        return _differences(_comparable(live), _comparable(planned))

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        if new.typ == PROVIDER_TYPE:
            return self._provider(new)[1]
        body, patch = manifest(new)
        body["metadata"]["name"] = old.id.rpartition("/")[2]
        self._apply(new, body, patch)
        live = body if patch else self._await_ready(new, body)
        return {**live, "apiVersion": body["apiVersion"], "kind": body["kind"]}

    def exists(self, res: Resource) -> bool:
        """Whether the object `res` created is still on the cluster (a Patch owns no object)."""
        if res.typ == PROVIDER_TYPE or res.typ.endswith("Patch"):
            return False
        body, _ = manifest(res)
        body["metadata"]["name"] = res.id.rpartition("/")[2]
        return self._get(res, body) is not None

    def delete(self, res: Resource) -> None:
        if res.typ == PROVIDER_TYPE:
            return
        body, patch = manifest(res)
        body["metadata"]["name"] = res.id.rpartition("/")[2]
        if patch:
            # Give up exactly the fields this patch applied.
            bare = {"apiVersion": body["apiVersion"], "kind": body["kind"]}
            bare["metadata"] = {
                k: v for k, v in body["metadata"].items() if k in ("name", "namespace")
            }
            self._apply(res, bare, patch)
            return
        api = self._client(res)
        resource, namespace = self._api(api, body)
        try:
            resource.delete(name=body["metadata"]["name"], namespace=namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise KubernetesError(f"HTTP {exc.status}: {_reason(exc)}") from exc
        deadline = time.monotonic() + self.delete_timeout
        while self._get(res, body) is not None:
            if time.monotonic() > deadline:
                raise KubernetesError(f"still present {self.delete_timeout:.0f} s after delete")
            time.sleep(0.25)
