"""An in-memory stand-in for the API server's GET endpoints the ownership check reads
(components/ownership.py `Get`): discovery of a group version, one object by path, and Helm's
release Secrets by label. It is a fake and says so: tests/e2e runs the same check against a
real kube-apiserver under the real engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from components.cluster_access import (
    CLAIM_KEY,
    CLAIM_LABEL_KEY,
    CLAIM_NAMESPACE,
    CLAIM_OBJECTS_KEY,
)
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

    def __init__(self, objects: Iterable[Mapping[str, Any]] = (), *, unreachable: bool = False):
        self.objects = {_path(o): dict(o) for o in objects}
        self.unreachable = unreachable
        self.reads: list[str] = []

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
        if path.endswith("/secrets") and query:
            selector = dict(query)["labelSelector"]
            wanted = dict(part.split("=", 1) for part in selector.split(","))
            namespace = path.split("/")[4]
            items = [
                o
                for o in self.objects.values()
                if o["kind"] == "Secret"
                and o["metadata"].get("namespace") == namespace
                and wanted.items() <= (o["metadata"].get("labels") or {}).items()
            ]
            return {"items": items}
        return self.objects.get(path)


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


def namespace_object(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict(labels or {})},
    }


def claimed_cluster(*namespaces: str) -> FakeCluster:
    """A cluster this (mocked) stack claimed before, with `namespaces` made by someone else."""
    return FakeCluster([claim_object(), *(namespace_object(n) for n in namespaces)])
