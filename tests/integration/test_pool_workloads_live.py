"""The preview's look for workloads the gate's pool rule would starve
(components/cluster_access.py check_pool_workloads) on a real kube-apiserver: the four lists
across namespaces, as the API server serves them, read and judged.

A control plane of this module's own (the session's holds other tests' workloads) with a
DaemonSet that tolerates every taint and a Deployment that tolerates the pool's key in one
namespace, beside workloads the check must leave alone: one asking for a GPU, one with no
toleration, one in an allowed namespace (a CronJob: the batch list) and one in kube-system.
The check refuses naming exactly the first two; the allowed lists let them through; a cluster
out of reach, or credentials RBAC refuses the lists, give a warning that carries no credential.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from components.cluster_access import check_pool_workloads
from components.gpu_resources import is_gpu_resource
from components.settings import ConfigError
from tests.integration.conftest import require_tools
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane

GPU = "nvidia.com/gpu"
TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
IMAGE = "registry.k8s.io/pause:3.10"
EVERY_TAINT = {"operator": "Exists"}
POOL_KEY = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
SKIPPED = ("kube-system", "gpu-admission")
# What each kind's controller reports while it runs pods (a CronJob: once it has run).
RUNNING: dict[str, dict[str, Any]] = {
    "DaemonSet": {
        "currentNumberScheduled": 2,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 2,
        "numberReady": 2,
    },
    "Deployment": {"replicas": 1},
    "CronJob": {"lastScheduleTime": "2026-11-28T03:00:00Z"},
}


def _template(
    app: str, tolerations: list[dict[str, Any]], limits: dict[str, str] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    if limits:
        container["resources"] = {"limits": limits}
    spec: dict[str, Any] = {"containers": [container], "tolerations": tolerations}
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def _workload(
    cp: LocalControlPlane,
    kind: str,
    namespace: str,
    name: str,
    template: Any,
    status: dict[str, Any] | None = None,
) -> None:
    """Create a DaemonSet, Deployment or CronJob `name` running `template`, its status then
    `status` (this control plane runs no controller: what one would report)."""
    selector = {"matchLabels": template["metadata"]["labels"]}
    if kind == "CronJob":
        job = {"template": {**template, "spec": {**template["spec"], "restartPolicy": "Never"}}}
        path = f"/apis/batch/v1/namespaces/{namespace}/cronjobs"
        spec: dict[str, Any] = {"schedule": "0 3 * * *", "jobTemplate": {"spec": job}}
    else:
        path = f"/apis/apps/v1/namespaces/{namespace}/{kind.lower()}s"
        spec = {"selector": selector, "template": template}
    cp.request("POST", path, {"metadata": {"name": name}, "spec": spec})
    if status is not None:
        cp.request("PATCH", f"{path}/{name}/status", {"status": status})


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalControlPlane, str, str, str]]:
    """(the control plane, the namespace of the two refused workloads, an allowed namespace,
    a tenant's namespace with a DaemonSet that runs no pod)."""
    require_tools(*CONTROL_PLANE_TOOLS)
    suffix = uuid.uuid4().hex[:6]
    infra, allowed, tenant = f"infra-{suffix}", f"allowed-{suffix}", f"tenant-{suffix}"
    with LocalControlPlane() as cp:
        for namespace in (infra, allowed, tenant):
            cp.create_namespace(namespace)
        agent = _template("agent", [EVERY_TAINT])
        _workload(cp, "DaemonSet", infra, "node-agent", agent, RUNNING["DaemonSet"])
        tool = _template("tool", [POOL_KEY])
        _workload(cp, "Deployment", infra, "pool-tool", tool, RUNNING["Deployment"])
        # Runs no pod: the gate refused them, or it was created so; it holds back no `up`.
        _workload(cp, "DaemonSet", tenant, "idle-agent", _template("idle", [EVERY_TAINT]))
        trainer = _template("trainer", [POOL_KEY], {GPU: "1"})
        _workload(cp, "Deployment", infra, "trainer", trainer)
        _workload(cp, "Deployment", infra, "web", _template("web", []))
        nightly = _template("nightly", [EVERY_TAINT])
        _workload(cp, "CronJob", allowed, "nightly", nightly, RUNNING["CronJob"])
        proxy = _template("proxy", [EVERY_TAINT])
        _workload(cp, "DaemonSet", "kube-system", "proxy", proxy, RUNNING["DaemonSet"])
        yield cp, infra, allowed, tenant


def _check(kubeconfig: str, **allowed: Any) -> str | None:
    return check_pool_workloads(
        kubeconfig,
        None,
        taint=TAINT,
        allowed_namespaces=allowed.get("namespaces", ()),
        allowed_daemonsets=allowed.get("daemonsets", ()),
        skipped_namespaces=SKIPPED,
        gpu_resource=is_gpu_resource,
    )


def test_pool_workloads_live_refuses_naming_exactly_the_two(
    cluster: tuple[LocalControlPlane, str, str, str],
) -> None:
    cp, infra, allowed, _tenant = cluster
    with pytest.raises(ConfigError) as refused:
        _check(cp.kubeconfig_yaml(), namespaces=(allowed,))
    (problem,) = refused.value.problems
    assert (problem.key, problem.value) == ("admission.poolNamespaces", [infra])
    assert (
        f"of DaemonSet {infra}/node-agent (toleration no key, operator Exists: every taint), "
        f"Deployment {infra}/pool-tool (toleration key nvidia.com/gpu): their pod template "
        "tolerates the GPU pool's taint nvidia.com/gpu=present:NoSchedule without asking for a "
        "GPU."
    ) in problem.allowed
    for left_alone in ("trainer", "web", "nightly", "proxy", "idle-agent"):
        assert left_alone not in problem.allowed


def test_pool_workloads_live_the_allowed_namespace_is_listed_too(
    cluster: tuple[LocalControlPlane, str, str, str],
) -> None:
    # Not allowed, the CronJob of the other namespace is found through the batch list.
    cp, infra, allowed, _tenant = cluster
    with pytest.raises(ConfigError) as refused:
        _check(cp.kubeconfig_yaml())
    (problem,) = refused.value.problems
    assert problem.value == sorted([allowed, infra])
    assert f"CronJob {allowed}/nightly" in problem.allowed


def test_pool_workloads_live_allowed_lists_let_them_through(
    cluster: tuple[LocalControlPlane, str, str, str],
) -> None:
    cp, infra, allowed, tenant = cluster
    assert _check(cp.kubeconfig_yaml(), namespaces=(allowed, infra, tenant)) is None
    # The DaemonSet by name, the Deployment only by its namespace.
    with pytest.raises(ConfigError, match=f"Deployment {infra}/pool-tool"):
        _check(
            cp.kubeconfig_yaml(), namespaces=(allowed, tenant), daemonsets=(f"{infra}/node-agent",)
        )


def test_pool_workloads_live_one_that_runs_no_pod_is_named_in_a_warning(
    cluster: tuple[LocalControlPlane, str, str, str],
) -> None:
    cp, infra, allowed, tenant = cluster
    warning = _check(cp.kubeconfig_yaml(), namespaces=(allowed, infra))
    assert warning is not None
    assert f"the gate refuses the pods of DaemonSet {tenant}/idle-agent" in warning


def test_pool_workloads_live_an_unreachable_cluster_is_a_warning(
    cluster: tuple[LocalControlPlane, str, str, str],
) -> None:
    cp, _, _, _ = cluster
    warning = _check(cp.kubeconfig_yaml().replace(cp.server, "https://127.0.0.1:1"))
    assert warning is not None
    assert warning.startswith(
        "gpu-cluster:admission.poolNamespaces was not checked against the cluster: listing "
        "DaemonSets, Deployments, StatefulSets and CronJobs in every namespace"
    )
    assert "Connection refused" in warning
    assert "kubectl get daemonsets,deployments,statefulsets,cronjobs -A -o json" in warning


def test_pool_workloads_live_lists_that_rbac_refuses_are_a_warning_without_the_token(
    cluster: tuple[LocalControlPlane, str, str, str],
) -> None:
    cp, infra, _, _ = cluster
    name = f"no-rights-{uuid.uuid4().hex[:6]}"
    cp.request("POST", f"/api/v1/namespaces/{infra}/serviceaccounts", {"metadata": {"name": name}})
    issued = cp.request(
        "POST", f"/api/v1/namespaces/{infra}/serviceaccounts/{name}/token", {"spec": {}}
    )
    token = issued["status"]["token"]
    warning = _check(cp.kubeconfig_yaml(user={"token": token}))
    assert warning is not None
    assert (
        "failed: GET /apis/apps/v1/daemonsets: HTTP 403: daemonsets.apps is forbidden: User "
        f'"system:serviceaccount:{infra}:{name}" cannot list resource "daemonsets"'
    ) in warning
    assert token not in warning
