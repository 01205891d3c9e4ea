"""An in-memory stand-in for the API server's GET endpoints the ownership check reads
(components/ownership.py `Get`): discovery of a group version, one object by path, and Helm's
release storage (Secrets or ConfigMaps) by label; and for the dry-run pod create of the
preview's toleration check (components/cluster_access.py `PodDryRun`), with
ExtendedResourceToleration on or off. It is a fake and says so: tests/e2e runs the same check
against a real kube-apiserver under the real engine,
tests/integration/test_pool_toleration_probe_live.py the dry run.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from components.cluster_access import (
    CLAIM_KEY,
    CLAIM_LABEL_KEY,
    CLAIM_NAMESPACE,
    CLAIM_OBJECTS_KEY,
)
from components.monitoring_stack.manifests import monitoring_namespace_needs
from components.object_meta import namespace_labels
from components.providers.node_api import IDENTITY_NAME
from components.settings import PROJECT

# (apiVersion, kind) -> (plural, namespaced) of the kinds the stack declares.
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Service"): ("services", True),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("scheduling.k8s.io/v1", "PriorityClass"): ("priorityclasses", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    **{
        ("admissionregistration.k8s.io/v1", kind): (f"{kind.lower()}s", False)
        for kind in (
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
        )
    },
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("prometheusrules", True),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("servicemonitors", True),
}


def _base(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def _path(obj: Mapping[str, Any]) -> str:
    plural, namespaced = KINDS[(obj["apiVersion"], obj["kind"])]
    meta = obj["metadata"]
    where = f"/namespaces/{meta.get('namespace') or 'default'}" if namespaced else ""
    return f"{_base(obj['apiVersion'])}{where}/{plural}/{meta['name']}"


class FakeCluster:
    """Objects by path; `get` answers as components.ownership.Get does (None for 404)."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        *,
        unreachable: bool = False,
        admission_plugins: Collection[str] = (),
        refuse_pods: str | None = None,
    ):
        self.objects = {_path(o): dict(o) for o in objects}
        self.unreachable = unreachable
        self.admission_plugins = set(admission_plugins)
        """The API server's admission plugins the fake plays (ExtendedResourceToleration)."""
        self.refuse_pods = refuse_pods
        """When set, every pod create is refused with this message (403, as RBAC or an
        admission webhook would)."""
        self.reads: list[str] = []
        self.dry_runs: list[tuple[str, dict[str, Any]]] = []

    def add(self, obj: Mapping[str, Any]) -> None:
        self.objects[_path(obj)] = dict(obj)

    def get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> Any:
        self.reads.append(path)
        if self.unreachable:
            raise ConnectionError("connection refused")
        for api_version in {a for a, _ in KINDS}:
            if path == _base(api_version):
                resources = [
                    {"name": plural, "kind": kind, "namespaced": namespaced}
                    for (a, kind), (plural, namespaced) in KINDS.items()
                    if a == api_version
                ]
                return {"resources": resources}
        listed = {"/secrets": "Secret", "/configmaps": "ConfigMap"}
        kind = next((k for suffix, k in listed.items() if path.endswith(suffix)), None)
        if kind is not None and query:
            # A LIST by label (Helm's storage), in the API server's order (by name), `limit`.
            params = dict(query)
            wanted = dict(part.split("=", 1) for part in params["labelSelector"].split(","))
            namespace = path.split("/")[4]
            items = sorted(
                (
                    o
                    for o in self.objects.values()
                    if o["kind"] == kind
                    and o["metadata"].get("namespace") == namespace
                    and wanted.items() <= (o["metadata"].get("labels") or {}).items()
                ),
                key=lambda o: str(o["metadata"]["name"]),
            )
            return {"items": items[: int(params.get("limit") or len(items) or 1)]}
        return self.objects.get(path)

    def dry_run_pod(self, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any]:
        """A pod create with dryRun=All: the pod as admitted, nothing stored. With
        ExtendedResourceToleration it gains a toleration per extended resource its containers
        and init containers request, as the plugin adds them (key the resource, Exists,
        NoSchedule).
        Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/plugin/pkg/admission/extendedresourcetoleration/admission.go
        """
        self.dry_runs.append((namespace, dict(pod)))
        if self.unreachable:
            raise ConnectionError("connection refused")
        if self.refuse_pods is not None:
            raise PermissionError(f"HTTP 403: {self.refuse_pods}")
        admitted = copy.deepcopy(dict(pod))
        spec = admitted.setdefault("spec", {})
        if "ExtendedResourceToleration" in self.admission_plugins:
            containers = [*spec.get("containers", []), *spec.get("initContainers", [])]
            requested = {
                name
                for c in containers
                for name in ((c.get("resources") or {}).get("requests") or {})
                if "/" in name and "kubernetes.io/" not in name
            }
            tolerations = spec.setdefault("tolerations", [])
            for name in sorted(requested):
                tolerations.append({"key": name, "operator": "Exists", "effect": "NoSchedule"})
        admitted.setdefault("metadata", {})["namespace"] = namespace
        return admitted


MOCK_STACK_ID = f"{IDENTITY_NAME}-id"
"""The stack id under tests/conftest.py's mocks (the StackIdentity resource's mocked id)."""


def claim_object(stack_id: str = MOCK_STACK_ID, objects: str | None = None) -> dict[str, Any]:
    """The claim ConfigMap of stack `stack_id`, listing `objects`."""
    data = {CLAIM_KEY: stack_id, CLAIM_LABEL_KEY: f"organization/{PROJECT}/dev"}
    if objects is not None:
        data[CLAIM_OBJECTS_KEY] = objects
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PROJECT, "namespace": CLAIM_NAMESPACE},
        "data": data,
    }


def namespace_object(
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    annotations: Mapping[str, str] | None = None,
    uid: str = "",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if uid:
        metadata["uid"] = uid
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def helm_release_objects(
    name: str,
    namespace: str,
    *,
    storage: str = "Secret",
    values: Mapping[str, Any] | None = None,
    first_deployed: str = "2026-01-02T03:04:05.123456789Z",
    revisions: int = 1,
) -> list[dict[str, Any]]:
    """Helm release `name` as Helm's storage driver keeps it (`storage` Secret, the default,
    or ConfigMap for HELM_DRIVER=configmap): an object per revision,
    sh.helm.release.v1.<name>.v<N> labelled owner=helm, its `release` data the release record
    (user-supplied `values`, first deployment time) gzipped and base64-encoded, and base64 once
    more in a Secret."""
    objects = []
    for version in range(1, revisions + 1):
        status = "deployed" if version == revisions else "superseded"
        record = {
            "name": name,
            "namespace": namespace,
            "version": version,
            "config": dict(values or {}),
            "info": {"first_deployed": first_deployed, "status": status},
        }
        encoded = base64.b64encode(gzip.compress(json.dumps(record).encode())).decode()
        if storage == "Secret":
            encoded = base64.b64encode(encoded.encode()).decode()
        labels = {"owner": "helm", "name": name, "version": str(version), "status": status}
        objects.append(
            {
                "apiVersion": "v1",
                "kind": storage,
                "metadata": {
                    "name": f"sh.helm.release.v1.{name}.v{version}",
                    "namespace": namespace,
                    "labels": labels,
                },
                "data": {"release": encoded},
            }
        )
    return objects


def claimed_cluster(*namespaces: str) -> FakeCluster:
    """A cluster this (mocked) stack claimed before, with `namespaces` made by someone else."""
    return FakeCluster([claim_object(), *(namespace_object(n) for n in namespaces)])


def monitoring_ready_cluster(namespace: str = "monitoring") -> FakeCluster:
    """A cluster this stack claimed before, with the monitoring namespace the dev and prod
    stacks use without creating it, made as the README asks (with the labels the layer's pods
    need: monitoring_namespace_needs)."""
    labels = namespace_labels(monitoring_namespace_needs())
    return FakeCluster([claim_object(), namespace_object(namespace, labels)])


def reply_json(handler: Any, status: int, answer: Any) -> None:
    """Answer a test HTTP server's request (a BaseHTTPRequestHandler) with `answer` as JSON."""
    body = json.dumps(answer).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
