"""The floor of `bench.local_stack`: one plain client doing to the cluster what the stack did.

From the state the stack's `up` left (`pulumi stack export --show-secrets`), `floor_units`
gives each kubernetes resource as the objects to server-side-apply (a Helm release as what
it rendered and its chart's CRDs, `read_releases`), and `node_writes` the node layers' writes;
`Floor` applies them in the state's order, waiting for what the provider waits for, and tears
them down in reverse.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import dynamic
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from components.cluster_access import HELM_RELEASE
from tools.harness.charts import VALUES_KEY

SECRET_SIGNATURE = "4dabf18193072939515e22adb298388d"
"""The key that marks a secret in an exported state; `plaintext` holds its value as JSON."""
FIELD_MANAGER = "bench-floor"
WAIT_SECONDS = 300.0
POLL_SECONDS = 0.1


# ------------------------------------------------------------------ the floor, from the state


def reveal(value: Any) -> Any:
    """`value` with every secret wrapper of an exported state replaced by the value it holds."""
    if isinstance(value, dict):
        if SECRET_SIGNATURE in value:
            if "plaintext" not in value:
                raise ValueError("a secret without its plaintext: export with --show-secrets")
            return reveal(json.loads(value["plaintext"]))
        return {key: reveal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [reveal(item) for item in value]
    return value


def applied_object(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The object the provider applied for a resource: its inputs, secrets revealed, without
    the provider's own `__` keys."""
    body = {k: v for k, v in reveal(dict(inputs)).items() if not k.startswith("__")}
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        body["metadata"] = {k: v for k, v in metadata.items() if not k.startswith("__")}
    return body


@dataclass(frozen=True)
class Rendered:
    """What a Helm release put on the cluster: its chart's CRDs and its rendered objects."""

    crds: list[dict[str, Any]]
    objects: list[dict[str, Any]]


@dataclass(frozen=True)
class FloorUnit:
    """One kubernetes resource of the stack's state, as the objects the floor applies for it."""

    urn: str
    dependencies: frozenset[str]
    """The custom resources it depends on (a dependency on a component: its descendants)."""
    objects: list[dict[str, Any]]
    chart_crds: list[dict[str, Any]] = field(default_factory=list)
    """A Helm release's CRDs: applied first and waited for, never deleted (as Helm does)."""
    patch: bool = False
    """A `...Patch` resource: applied, then relinquished instead of deleted."""


def floor_units(
    resources: Sequence[Mapping[str, Any]], releases: Mapping[str, Rendered]
) -> list[FloorUnit]:
    """The state's kubernetes resources in its order (dependencies first), as floor units.

    Providers and components are skipped; a Helm release is what `releases` says it rendered.
    """
    children: dict[str, list[str]] = {}
    custom: set[str] = set()
    for resource in resources:
        if resource.get("parent"):
            children.setdefault(resource["parent"], []).append(resource["urn"])
        if resource.get("custom"):
            custom.add(resource["urn"])

    def expand(urn: str) -> set[str]:
        if urn in custom:
            return {urn}
        return {leaf for child in children.get(urn, []) for leaf in expand(child)}

    units = []
    for resource in resources:
        kind = resource["type"]
        if not resource.get("custom") or not kind.startswith("kubernetes:"):
            continue
        urn = resource["urn"]
        dependencies = frozenset(
            leaf for dependency in resource.get("dependencies") or [] for leaf in expand(dependency)
        )
        if kind == HELM_RELEASE:
            if urn not in releases:
                raise ValueError(f"what the Helm release {urn} rendered was not read")
            rendered = releases[urn]
            units.append(FloorUnit(urn, dependencies, rendered.objects, rendered.crds))
        else:
            body = applied_object(resource.get("inputs") or {})
            units.append(FloorUnit(urn, dependencies, [body], patch=kind.endswith("Patch")))
    return units


@dataclass(frozen=True)
class NodeWrite:
    """The writes a node needs: a merge patch of the Node and one of its status."""

    node: str
    metadata_spec: dict[str, Any] | None
    status: dict[str, Any] | None


def _map_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    change: dict[str, Any] = {k: v for k, v in after.items() if before.get(k) != v}
    change.update({k: None for k in before if k not in after})
    return change


def _taints(taints: Iterable[Sequence[str]]) -> list[dict[str, str]]:
    return [
        {"key": key, "effect": effect, **({"value": value} if value else {})}
        for key, value, effect in taints
    ]


def node_write(node: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> NodeWrite:
    """What takes `node` from `before` to `after` (tools/harness/stack.py: node_state's shape)."""
    metadata = {
        key: change
        for key in ("labels", "annotations")
        if (change := _map_change(before.get(key) or {}, after.get(key) or {}))
    }
    body: dict[str, Any] = {"metadata": metadata} if metadata else {}
    if list(before.get("taints") or []) != list(after.get("taints") or []):
        body["spec"] = {"taints": _taints(after.get("taints") or []) or None}
    status = {
        key: change
        for key in ("capacity", "allocatable")
        if (change := _map_change(before.get(key) or {}, after.get(key) or {}))
    }
    return NodeWrite(node, body or None, {"status": status} if status else None)


def node_writes(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> tuple[list[NodeWrite], list[NodeWrite]]:
    """The writes that take the nodes from `before` to `after`, and those that undo them."""
    names = [name for name in after if name in before]
    forward = [node_write(name, before[name], after[name]) for name in names]
    backward = [node_write(name, after[name], before[name]) for name in names]
    return (
        [w for w in forward if w.metadata_spec or w.status],
        [w for w in backward if w.metadata_spec or w.status],
    )


def deployment_available(deployment: Mapping[str, Any]) -> bool:
    """The provider's Deployment await: the current generation observed, every replica available."""
    status = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation", 0)
    replicas = (deployment.get("spec") or {}).get("replicas", 1)
    current = status.get("observedGeneration", -1) >= generation
    return bool(current and status.get("availableReplicas", 0) == replicas)


def crd_established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def waits_for_endpoints(service: Mapping[str, Any]) -> bool:
    """Whether the provider waits for the Service's endpoints: it selects pods."""
    spec = service.get("spec") or {}
    return bool(spec.get("selector")) and spec.get("type") != "ExternalName"


def has_ready_endpoint(slices: Iterable[Mapping[str, Any]]) -> bool:
    """Some endpoint of the slices is ready (an unset `ready` counts as ready, as the API says)."""
    return any(
        (endpoint.get("conditions") or {}).get("ready") is not False
        for endpoint_slice in slices
        for endpoint in endpoint_slice.get("endpoints") or []
    )


# --------------------------------------------------------------------- the floor, on the cluster


class Floor:
    """One plain client doing to the cluster what the stack's `up` and `destroy` did."""

    def __init__(self, api_client: Any, discovery_cache: Path) -> None:
        self.api_client = api_client
        self.discovery_cache = discovery_cache
        self.waited = 0.0
        """Seconds spent waiting for readiness or for objects to be gone."""

    def _client(self) -> Any:
        return dynamic.DynamicClient(self.api_client, cache_file=str(self.discovery_cache))

    def _wait(self, what: str, done: Callable[[], bool]) -> None:
        started = time.monotonic()
        deadline = started + WAIT_SECONDS
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} after {WAIT_SECONDS:.0f} s")
            time.sleep(POLL_SECONDS)
        self.waited += time.monotonic() - started

    def _resource(self, api: Any, body: Mapping[str, Any]) -> tuple[Any, str | None]:
        """The API resource of `body` (after a CRD, discovery may lag) and its namespace."""
        found: list[Any] = []

        def discovered() -> bool:
            try:
                found.append(api.resources.get(api_version=body["apiVersion"], kind=body["kind"]))
            except ResourceNotFoundError:
                return False
            return True

        waited = self.waited
        self._wait(f"no API resource for {body['apiVersion']} {body['kind']}", discovered)
        self.waited = waited
        resource = found[-1]
        namespace = body["metadata"].get("namespace") or "default"
        return resource, namespace if resource.namespaced else None

    def _get(self, api: Any, body: Mapping[str, Any]) -> dict[str, Any] | None:
        resource, namespace = self._resource(api, body)
        try:
            found = resource.get(name=body["metadata"]["name"], namespace=namespace)
        except NotFoundError:
            return None
        result: dict[str, Any] = found.to_dict()
        return result

    def _apply(self, api: Any, body: Mapping[str, Any]) -> None:
        resource, namespace = self._resource(api, body)
        resource.server_side_apply(
            body=dict(body),
            name=body["metadata"]["name"],
            namespace=namespace,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )

    def _wait_ready(self, api: Any, body: Mapping[str, Any]) -> None:
        kind, name = body["kind"], body["metadata"]["name"]
        if kind == "Deployment":
            self._wait(
                f"Deployment {name} not available",
                lambda: deployment_available(self._get(api, body) or {}),
            )
        elif kind == "CustomResourceDefinition":
            self._wait(
                f"CRD {name} not Established", lambda: crd_established(self._get(api, body) or {})
            )
        elif kind == "Service" and waits_for_endpoints(body):
            slices = api.resources.get(api_version="discovery.k8s.io/v1", kind="EndpointSlice")
            namespace = body["metadata"].get("namespace") or "default"

            def ready() -> bool:
                found = slices.get(
                    namespace=namespace, label_selector=f"kubernetes.io/service-name={name}"
                ).to_dict()
                return has_ready_endpoint(found.get("items") or [])

            self._wait(f"Service {name} without a ready endpoint", ready)

    def _delete(self, api: Any, body: Mapping[str, Any]) -> None:
        """Deleted as the provider deletes: foreground, so dependents go first."""
        resource, namespace = self._resource(api, body)
        try:
            resource.delete(
                name=body["metadata"]["name"],
                namespace=namespace,
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "propagationPolicy": "Foreground",
                },
            )
        except NotFoundError:
            return

    def _wait_gone(self, api: Any, body: Mapping[str, Any]) -> None:
        name = f"{body['kind']} {body['metadata']['name']}"
        self._wait(f"{name} not gone", lambda: self._get(api, body) is None)

    def _relinquish(self, api: Any, body: Mapping[str, Any]) -> None:
        """A patch's fields given up: the field manager applies the object with none of them."""
        metadata = {k: v for k, v in body["metadata"].items() if k in ("name", "namespace")}
        self._apply(
            api, {"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": metadata}
        )

    def _write_nodes(self, api: Any, writes: Sequence[NodeWrite]) -> None:
        nodes = api.resources.get(api_version="v1", kind="Node")
        merge = "application/merge-patch+json"
        for write in writes:
            if write.metadata_spec:
                nodes.patch(body=write.metadata_spec, name=write.node, content_type=merge)
            if write.status:
                nodes.status.patch(body=write.status, name=write.node, content_type=merge)

    def apply(self, units: Sequence[FloorUnit], writes: Sequence[NodeWrite]) -> None:
        """The node writes, then the objects in order; an object's readiness is waited for
        before anything that depends on it is applied, and every object's at the end."""
        api = self._client()
        self._write_nodes(api, writes)
        pending: dict[str, FloorUnit] = {}
        for unit in units:
            for urn in sorted(unit.dependencies & pending.keys()):
                for body in pending.pop(urn).objects:
                    self._wait_ready(api, body)
            for crd in unit.chart_crds:
                self._apply(api, crd)
            for crd in unit.chart_crds:
                self._wait_ready(api, crd)
            for body in unit.objects:
                self._apply(api, body)
            if not unit.patch:
                pending[unit.urn] = unit
        for unit in pending.values():
            for body in unit.objects:
                self._wait_ready(api, body)

    def teardown(self, units: Sequence[FloorUnit], undo: Sequence[NodeWrite]) -> None:
        """The objects in reverse order; an object is waited for until it is gone before
        anything it depends on is deleted, and every one at the end; then the node writes
        undone."""
        api = self._client()
        dependents: dict[str, set[str]] = {}
        for unit in units:
            for urn in unit.dependencies:
                dependents.setdefault(urn, set()).add(unit.urn)
        pending: dict[str, FloorUnit] = {}
        for unit in reversed(units):
            for urn in sorted(dependents.get(unit.urn, set()) & pending.keys()):
                for body in pending.pop(urn).objects:
                    self._wait_gone(api, body)
            for body in reversed(unit.objects):
                if unit.patch:
                    self._relinquish(api, body)
                else:
                    self._delete(api, body)
            if not unit.patch:
                pending[unit.urn] = unit
        for unit in pending.values():
            for body in unit.objects:
                self._wait_gone(api, body)
        self._write_nodes(api, undo)

    def delete_crds(self, crds: Sequence[Mapping[str, Any]]) -> None:
        """Charts' CRDs left by Helm, deleted so the floor starts where the stack started."""
        api = self._client()
        for crd in crds:
            self._delete(api, crd)
        for crd in crds:
            self._wait_gone(api, crd)


def read_releases(api_client: Any, resources: Sequence[Mapping[str, Any]]) -> dict[str, Rendered]:
    """What each Helm release of the state rendered (its `<release>-values` ConfigMap, as the
    local charts render it: tools/harness/charts.py) and its chart's CRDs (crds/ of a local chart)."""
    api = dynamic.DynamicClient(api_client)
    config_maps = api.resources.get(api_version="v1", kind="ConfigMap")
    releases = {}
    for resource in resources:
        if resource["type"] != HELM_RELEASE:
            continue
        status = (resource.get("outputs") or {}).get("status") or {}
        name, namespace = status["name"], status["namespace"]
        live = config_maps.get(name=f"{name}-values", namespace=namespace).to_dict()
        metadata = live["metadata"]
        rendered = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": metadata["name"],
                "namespace": namespace,
                **{k: metadata[k] for k in ("labels", "annotations") if metadata.get(k)},
            },
            "data": {VALUES_KEY: live["data"][VALUES_KEY]},
        }
        chart = Path(str(reveal((resource.get("inputs") or {}).get("chart") or "")))
        files = sorted((chart / "crds").glob("*.yaml")) if chart.is_dir() else []
        crds = [
            document
            for path in files
            for document in yaml.safe_load_all(path.read_text())
            if document and document.get("kind") == "CustomResourceDefinition"
        ]
        releases[resource["urn"]] = Rendered(crds=crds, objects=[rendered])
    return releases
