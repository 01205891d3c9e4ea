"""BinpackScheduler's rendered KubeSchedulerConfiguration in the real kube-scheduler.

The config comes from `render_config` with the stack's default profile (stack_config's
SchedulerConfig), pointed at the harness API server. Fake GPU Nodes carry nvidia.com/gpu,
cpu, memory and pods in capacity and allocatable, a Ready condition and TaintedGpuPool's
default taint (nvidia.com/gpu=present:NoSchedule), which the pods tolerate; there is no
kubelet, so binding is the end of the story.
Each test uses its own namespace and nodes (selected by a per-test label) and deletes them.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import BinpackScheduler, BinpackSchedulerArgs
from components.binpack_scheduler.manifests import FRAGMENTATION_PLUGIN, render_config
from components.binpack_scheduler.settings import FRAGMENTATION, SchedulerProfile
from components.tainted_gpu_pool.settings import Taint
from stack_config import SchedulerConfig
from tests.integration.conftest import require_tools
from tools.harness import ControlPlaneError, LocalControlPlane, SchedulerHandle

GPU = "nvidia.com/gpu"
POOL_LABEL = "gpu-cluster.io/test-pool"
POOL_TAINT = Taint()
DECISION_TIMEOUT = 30.0
PROFILE = SchedulerConfig().profile
BINPACK = PROFILE.scheduler_name
DEFAULT = "default-scheduler"


def _binpack_config(control_plane: LocalControlPlane) -> dict[str, Any]:
    return render_config(PROFILE, kubeconfig=str(control_plane.kubeconfig_path))


@pytest.fixture(scope="module")
def schedulers(control_plane: LocalControlPlane) -> Iterator[dict[str, SchedulerHandle]]:
    """The rendered binpack scheduler (leader-elected, as rendered) and a default one."""
    require_tools("kube-scheduler")
    binpack = control_plane.start_scheduler(yaml.safe_dump(_binpack_config(control_plane)))
    try:
        default = control_plane.start_scheduler("")
        try:
            yield {BINPACK: binpack, DEFAULT: default}
        finally:
            default.stop()
    finally:
        binpack.stop()


class GpuPool:
    """Nodes and pods of one test, isolated by a namespace and a node label."""

    def __init__(self, cp: LocalControlPlane) -> None:
        self.cp = cp
        self.id = uuid.uuid4().hex[:8]
        self.namespace = f"binpack-{self.id}"
        self.nodes: list[str] = []
        self.unschedulable: dict[str, str] = {}
        cp.create_namespace(self.namespace)

    def add_nodes(self, count: int, gpus: int) -> list[str]:
        names = [f"gpu-{self.id}-{len(self.nodes) + i}" for i in range(count)]
        for name in names:
            self.cp.create_node(
                name,
                capacity={GPU: str(gpus), "cpu": "32", "memory": "128Gi", "pods": "110"},
                labels={POOL_LABEL: self.id},
                taints=[POOL_TAINT.as_dict()],
            )
        self.nodes.extend(names)
        return names

    def create_pod(self, name: str, scheduler: str, gpus: int) -> None:
        resources = {
            "requests": {GPU: str(gpus), "cpu": "1", "memory": "1Gi"},
            "limits": {GPU: str(gpus)},
        }
        pod = {
            "metadata": {"name": name},
            "spec": {
                "schedulerName": scheduler,
                "automountServiceAccountToken": False,
                "nodeSelector": {POOL_LABEL: self.id},
                "tolerations": [POOL_TAINT.toleration()],
                "containers": [
                    {"name": "main", "image": "registry.invalid/cuda:1", "resources": resources}
                ],
            },
        }
        self.cp.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", pod)

    def decision(self, name: str, scheduler: SchedulerHandle) -> str | None:
        """Node the pod is bound to, or None once the scheduler marks it Unschedulable.

        The Unschedulable condition's message is kept in `self.unschedulable[name]`.
        """
        deadline = time.monotonic() + DECISION_TIMEOUT
        while True:
            pod = self.cp.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
            if pod["spec"].get("nodeName"):
                return str(pod["spec"]["nodeName"])
            for cond in pod.get("status", {}).get("conditions", []):
                if (cond["type"], cond["status"], cond.get("reason")) == (
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                ):
                    self.unschedulable[name] = str(cond.get("message", ""))
                    return None
            if time.monotonic() > deadline:
                pytest.fail(f"pod {name} undecided after {DECISION_TIMEOUT} s\n{scheduler.tail()}")
            time.sleep(0.05)

    def schedule(
        self, name: str, scheduler: SchedulerHandle, scheduler_name: str, gpus: int
    ) -> str | None:
        """Create one pod and wait for the scheduler's decision (pods go one at a time)."""
        self.create_pod(name, scheduler_name, gpus)
        return self.decision(name, scheduler)

    def delete(self) -> None:
        for node in self.nodes:
            self.cp.request("DELETE", f"/api/v1/nodes/{node}")
        self.cp.request("DELETE", f"/api/v1/namespaces/{self.namespace}")


@pytest.fixture
def pool(control_plane: LocalControlPlane) -> Iterator[GpuPool]:
    created = GpuPool(control_plane)
    try:
        yield created
    finally:
        created.delete()


def _place(
    pool: GpuPool, schedulers: dict[str, SchedulerHandle], profile: str, prefix: str, count: int
) -> list[str]:
    """Bind `count` 1-GPU pods under `profile`, one after the other; the nodes they land on."""
    placed = []
    for i in range(count):
        node = pool.schedule(f"{prefix}-{i}", schedulers[profile], profile, 1)
        assert node is not None, f"{prefix}-{i} unschedulable\n{schedulers[profile].tail()}"
        placed.append(node)
    return placed


def _per_node(placed: list[str], nodes: list[str]) -> list[int]:
    return sorted((placed.count(n) for n in nodes), reverse=True)


def test_binpack_scheduler_live_fills_one_node_before_the_next(
    pool: GpuPool, schedulers: dict[str, SchedulerHandle]
) -> None:
    nodes = pool.add_nodes(3, gpus=4)
    placed = _place(pool, schedulers, BINPACK, "packed", 6)
    # The first four share a node; only when it is full does the fifth open a second one.
    assert len(set(placed[:4])) == 1
    assert len(set(placed[4:])) == 1 and placed[4] != placed[0]
    assert _per_node(placed, nodes) == [4, 2, 0]


def test_binpack_scheduler_live_default_profile_spreads_the_same_pods(
    pool: GpuPool, schedulers: dict[str, SchedulerHandle]
) -> None:
    nodes = pool.add_nodes(3, gpus=4)
    placed = _place(pool, schedulers, DEFAULT, "spread", 6)
    assert len(set(placed[:3])) == 3
    assert _per_node(placed, nodes) == [2, 2, 2]


@pytest.mark.parametrize(
    ("profile", "bound"), [(BINPACK, True), (DEFAULT, False)], ids=["binpack", "default"]
)
def test_binpack_scheduler_live_two_gpu_pod_after_six_one_gpu_pods(
    pool: GpuPool, schedulers: dict[str, SchedulerHandle], profile: str, bound: bool
) -> None:
    """The seed's fragmentation example, made concrete: two 4-GPU nodes, six 1-GPU pods.

    Spread 3+3, each node has one GPU left: two free GPUs in total, yet a 2-GPU pod fits
    nowhere. Packed 4+2, the second node still has two free GPUs together.
    """
    nodes = pool.add_nodes(2, gpus=4)
    placed = _place(pool, schedulers, profile, "small", 6)
    assert _per_node(placed, nodes) == ([4, 2] if bound else [3, 3])
    node = pool.schedule("two-gpus", schedulers[profile], profile, 2)
    if bound:
        assert node is not None and placed.count(node) == 2
    else:
        assert node is None
        assert f"2 Insufficient {GPU}" in pool.unschedulable["two-gpus"]


def _lease_holder(cp: LocalControlPlane, namespace: str, name: str) -> str:
    """The Lease's holder once there is one (leader election runs after /readyz)."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
    deadline = time.monotonic() + DECISION_TIMEOUT
    while True:
        try:
            holder = cp.get(path)["spec"].get("holderIdentity")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            holder = None
        if holder:
            return str(holder)
        if time.monotonic() > deadline:
            pytest.fail(f"no holder of Lease {namespace}/{name} after {DECISION_TIMEOUT} s")
        time.sleep(0.1)


def test_binpack_scheduler_live_takes_its_own_lease(
    control_plane: LocalControlPlane, schedulers: dict[str, SchedulerHandle]
) -> None:
    assert _lease_holder(control_plane, PROFILE.lease_namespace, BINPACK)


def _broken(mutate: Callable[[dict[str, Any]], None]) -> Callable[[LocalControlPlane], str]:
    def build(cp: LocalControlPlane) -> str:
        config = copy.deepcopy(_binpack_config(cp))
        mutate(config)
        return yaml.safe_dump(config)

    return build


def _fit_args(config: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = config["profiles"][0]["pluginConfig"][0]["args"]
    return args


def _enable_unknown_plugin(config: dict[str, Any]) -> None:
    config["profiles"][0]["plugins"] = {"score": {"enabled": [{"name": "NodeResourcesFitt"}]}}


def _rename_field(config: dict[str, Any]) -> None:
    strategy = _fit_args(config)["scoringStrategy"]
    strategy["requestedToCapacity"] = strategy.pop("requestedToCapacityRatio")


def _unknown_strategy(config: dict[str, Any]) -> None:
    _fit_args(config)["scoringStrategy"]["type"] = "RequestedToCapacity"


def _old_api_version(config: dict[str, Any]) -> None:
    config["apiVersion"] = "kubescheduler.config.k8s.io/v1beta3"


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (_enable_unknown_plugin, ("ScorePlugin", "NodeResourcesFitt", "does not exist")),
        (_rename_field, ("unknown field", "scoringStrategy.requestedToCapacity")),
        (_unknown_strategy, ("scoringStrategy.type: Unsupported value", "RequestedToCapacity")),
        (_old_api_version, ("no kind", "kubescheduler.config.k8s.io/v1beta3")),
    ],
    ids=["plugin-name", "field-name", "strategy-type", "api-version"],
)
def test_binpack_scheduler_live_rejects_a_bad_render(
    control_plane: LocalControlPlane,
    mutate: Callable[[dict[str, Any]], None],
    complaint: tuple[str, ...],
) -> None:
    """The same render with one mistake: kube-scheduler exits and says what is wrong."""
    require_tools("kube-scheduler")
    config = _broken(mutate)(control_plane)
    with pytest.raises(ControlPlaneError, match="exited with code") as excinfo:
        control_plane.start_scheduler(config, timeout=30).stop()
    failed = [line for line in str(excinfo.value).splitlines() if "command failed" in line]
    assert failed, str(excinfo.value)
    assert all(part in failed[-1] for part in complaint), failed[-1]


def test_binpack_scheduler_live_misnamed_plugin_config_is_caught_by_behaviour(
    control_plane: LocalControlPlane, pool: GpuPool
) -> None:
    """kube-scheduler silently ignores pluginConfig for a plugin name it does not know.

    Such a render starts fine, so the startup check cannot catch it; the scheduler then
    runs the default LeastAllocated scoring and spreads, which the fill test catches.
    """
    require_tools("kube-scheduler")
    name = f"typo-{pool.id}"
    config = render_config(
        replace(PROFILE, scheduler_name=name, leader_elect=False),
        kubeconfig=str(control_plane.kubeconfig_path),
    )
    config["profiles"][0]["pluginConfig"][0]["name"] = "NodeResourcesFitt"
    nodes = pool.add_nodes(3, gpus=4)
    with control_plane.start_scheduler(yaml.safe_dump(config)) as typo:
        placed = _place(pool, {name: typo}, name, "typo", 3)
    assert _per_node(placed, nodes) == [1, 1, 1]


RBAC_TYPES = {
    "kubernetes:core/v1:ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "kubernetes:coordination.k8s.io/v1:Lease": (
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    ),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole": (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles"
    ),
    "kubernetes:rbac.authorization.k8s.io/v1:Role": (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"
    ),
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"
    ),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": (
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    ),
}


def _component_rbac(profile: SchedulerProfile) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for the ServiceAccount, RBAC and Lease the component declares.

    The component is built under the Pulumi mocks of tests/conftest.py, so the objects are
    exactly its inputs, not a copy typed here.
    """
    from tests.conftest import component_access, register

    def build() -> None:
        access = component_access()
        BinpackScheduler(
            "binpack",
            BinpackSchedulerArgs(
                access=access, kubernetes_version="v1.34.4", name=profile.scheduler_name
            ),
        )

    objects = []
    for registration in register(build).resources:
        if registration.typ in RBAC_TYPES:
            body = dict(registration.inputs)
            path = RBAC_TYPES[registration.typ].format(ns=body["metadata"].get("namespace"))
            objects.append((path, body))
    return objects


def _token_kubeconfig(cp: LocalControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig holding a bound token of `account`, as the pod's projected token would."""
    token = cp.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", {"spec": {}}
    )["status"]["token"]
    config = yaml.safe_load(cp.kubeconfig_yaml())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def _component_objects(cp: LocalControlPlane, profile: SchedulerProfile) -> Iterator[None]:
    """The component's ServiceAccount, RBAC and Lease on the API server, removed afterwards."""
    created = []
    try:
        for path, body in _component_rbac(profile):
            cp.request("POST", path, body)
            created.append(f"{path}/{body['metadata']['name']}")
        yield
    finally:
        for path in reversed(created):
            cp.request("DELETE", path)


def test_binpack_scheduler_live_runs_with_only_its_own_rbac(
    control_plane: LocalControlPlane, pool: GpuPool, tmp_path: Path
) -> None:
    """The component's ServiceAccount, bindings and Lease are enough for the scheduler: it
    syncs every informer, serves delegated authn/authz, takes its Lease and binds a GPU pod."""
    require_tools("kube-scheduler")
    profile = replace(PROFILE, scheduler_name=f"binpack-rbac-{pool.id}")
    with _component_objects(control_plane, profile):
        kubeconfig = _token_kubeconfig(
            control_plane, "kube-system", profile.scheduler_name, tmp_path / "sa.kubeconfig"
        )
        config = render_config(profile, kubeconfig=str(kubeconfig))
        node = pool.add_nodes(1, gpus=4)[0]
        with control_plane.start_scheduler(
            yaml.safe_dump(config),
            extra_flags=[
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
            ],
        ) as scheduler:
            assert pool.schedule("rbac", scheduler, profile.scheduler_name, 1) == node
            assert _lease_holder(control_plane, "kube-system", profile.scheduler_name)
            assert "forbidden" not in scheduler.log().lower(), scheduler.tail()


# The cluster's own kube-scheduler elects its leader on this Lease.
CLUSTER_SCHEDULER_LEASE = ("kube-system", "kube-scheduler")


def _service_account(name: str, namespace: str = "kube-system") -> tuple[str, list[str]]:
    """The user name and groups the API server gives ServiceAccount `namespace/name`."""
    return (
        f"system:serviceaccount:{namespace}:{name}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
    )


def _allowed(cp: LocalControlPlane, who: tuple[str, list[str]], **attributes: str) -> bool:
    """The API server's answer to a SubjectAccessReview of `who` for `attributes`."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": who[0], "groups": who[1], "resourceAttributes": attributes},
    }
    answer = cp.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def _as(
    cp: LocalControlPlane, who: tuple[str, list[str]], method: str, path: str, body: Any
) -> int:
    """The HTTP status of `method path` sent as `who` (impersonated by the admin)."""
    request = urllib.request.Request(
        f"{cp.server}{path}", data=json.dumps(body).encode(), method=method
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Impersonate-User", who[0])
    for group in who[1]:
        request.add_header("Impersonate-Group", group)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=cp.ssl_context())
    )
    try:
        with opener.open(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _lease_path(namespace: str, name: str = "") -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{path}/{name}" if name else path


@pytest.fixture
def cluster_scheduler_lease(control_plane: LocalControlPlane) -> Iterator[dict[str, Any]]:
    """kube-system/kube-scheduler's Lease, as the cluster's own scheduler holds it (created
    here when no scheduler of this control plane made it, and then removed)."""
    namespace, name = CLUSTER_SCHEDULER_LEASE
    try:
        existing = control_plane.get(_lease_path(namespace, name))
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        existing = None
    if existing is not None:
        yield existing
        return
    body = {"metadata": {"name": name}, "spec": {"holderIdentity": "cp-1_kube-scheduler"}}
    lease = control_plane.request("POST", _lease_path(namespace), body)
    try:
        yield lease
    finally:
        control_plane.request("DELETE", _lease_path(namespace, name))


def test_binpack_scheduler_live_may_renew_its_own_lease_only(
    control_plane: LocalControlPlane, cluster_scheduler_lease: dict[str, Any]
) -> None:
    """As the scheduler's ServiceAccount, with the component's RBAC and nothing else: its own
    Lease may be read and updated; the cluster scheduler's may not, nor may any Lease be
    created (the stack creates the scheduler's)."""
    name = f"binpack-lease-{uuid.uuid4().hex[:8]}"
    profile = replace(PROFILE, scheduler_name=name)
    account = _service_account(name)
    namespace = profile.lease_namespace
    with _component_objects(control_plane, profile):
        own = control_plane.get(_lease_path(namespace, name))
        assert _as(control_plane, account, "PUT", _lease_path(namespace, name), own) == 200
        theirs = _lease_path(*CLUSTER_SCHEDULER_LEASE)
        taken = {**cluster_scheduler_lease, "spec": {"holderIdentity": name}}
        assert _as(control_plane, account, "PUT", theirs, taken) == 403
        assert control_plane.get(theirs)["spec"] == cluster_scheduler_lease["spec"]
        another = {"metadata": {"name": f"{name}-2"}, "spec": {"holderIdentity": name}}
        assert _as(control_plane, account, "POST", _lease_path(namespace), another) == 403


# (verb, resource attributes, allowed) for the scheduler's ServiceAccount.
LEASE_ACCESS = [
    ("get", {"name": "{own}"}, True),
    ("update", {"name": "{own}"}, True),
    ("update", {"name": "kube-scheduler"}, False),
    ("get", {"name": "kube-scheduler"}, False),
    ("update", {"name": "kube-controller-manager"}, False),
    ("create", {}, False),
    ("delete", {"name": "{own}"}, False),
    ("list", {}, False),
]
SCHEDULING_ACCESS = [
    ("create", {"resource": "pods", "subresource": "binding", "namespace": "team-a"}, True),
    ("patch", {"resource": "pods", "subresource": "status", "namespace": "team-a"}, True),
    ("delete", {"resource": "pods", "namespace": "team-a"}, True),
    ("watch", {"resource": "nodes"}, True),
    ("create", {"resource": "events", "group": "events.k8s.io", "namespace": "team-a"}, True),
    ("update", {"resource": "persistentvolumeclaims", "namespace": "team-a"}, True),
    ("list", {"resource": "resourceslices", "group": "resource.k8s.io"}, True),
    ("update", {"resource": "nodes"}, False),
    ("create", {"resource": "pods", "namespace": "team-a"}, False),
    ("get", {"resource": "secrets", "namespace": "kube-system"}, False),
]


def test_binpack_scheduler_live_subject_access_reviews_of_its_service_account(
    control_plane: LocalControlPlane,
) -> None:
    """What the API server's authorizer answers for the scheduler's ServiceAccount with the
    component's RBAC: its own Lease and what scheduling needs, nothing of the cluster
    scheduler's leadership."""
    name = f"binpack-sar-{uuid.uuid4().hex[:8]}"
    profile = replace(PROFILE, scheduler_name=name)
    account = _service_account(name)
    with _component_objects(control_plane, profile):
        answers = {}
        for verb, where, _ in LEASE_ACCESS:
            attributes = {k: v.format(own=name) for k, v in where.items()}
            attributes.update(
                verb=verb, group="coordination.k8s.io", resource="leases", namespace="kube-system"
            )
            answers[(verb, str(where))] = _allowed(control_plane, account, **attributes)
        for verb, attributes, _ in SCHEDULING_ACCESS:
            answers[(verb, str(attributes))] = _allowed(
                control_plane, account, verb=verb, **attributes
            )
        expected = {
            (verb, str(where)): allowed
            for verb, where, allowed in [*LEASE_ACCESS, *SCHEDULING_ACCESS]
        }
        assert answers == expected


# ----------------------------------------------------------- scoring: fragmentation
# The profile of `scheduler.scoring: fragmentation`, run by gpu-binpack-scheduler (scheduler/,
# kube-scheduler with the GpuFragmentation plugin; what an image built from it runs).
FRAGMENTATION_PROFILE = SchedulerConfig(
    scoring=FRAGMENTATION, image="registry.example.com/gpu-binpack-scheduler:v1.37.2"
).profile


def _fragmentation_config(cp: LocalControlPlane, name: str) -> dict[str, Any]:
    profile = replace(FRAGMENTATION_PROFILE, scheduler_name=name, leader_elect=False)
    return render_config(profile, kubeconfig=str(cp.kubeconfig_path))


def test_fragmentation_scheduler_live_keeps_whole_nodes_for_whole_node_pods(
    control_plane: LocalControlPlane, pool: GpuPool
) -> None:
    """Three 4-GPU nodes: the second 2-GPU pod joins the first one's node, so both 4-GPU pods
    find a whole node (spreading, as default does, would leave one of them unschedulable)."""
    require_tools("gpu-binpack-scheduler")
    name = f"fragmentation-{pool.id}"
    config = yaml.safe_dump(_fragmentation_config(control_plane, name))
    nodes = pool.add_nodes(3, gpus=4)
    with control_plane.start_scheduler(config, binary="gpu-binpack-scheduler") as scheduler:
        placed = [
            pool.schedule(pod, scheduler, name, gpus)
            for pod, gpus in (("two-a", 2), ("two-b", 2), ("four-a", 4), ("four-b", 4))
        ]
        bound = [node for node in placed if node is not None]
        assert len(bound) == 4, f"{pool.unschedulable}\n{scheduler.tail()}"
        assert bound[0] == bound[1]
        assert sorted(bound) == sorted([bound[0], bound[0], *set(nodes) - {bound[0]}])


def test_fragmentation_profile_needs_the_plugin_upstream_kube_scheduler_lacks(
    control_plane: LocalControlPlane,
) -> None:
    """Why `scoring: fragmentation` needs `scheduler.image`: the upstream kube-scheduler does
    not know the plugin and exits."""
    require_tools("kube-scheduler")
    config = yaml.safe_dump(_fragmentation_config(control_plane, "fragmentation-upstream"))
    with pytest.raises(ControlPlaneError, match="exited with code") as excinfo:
        control_plane.start_scheduler(config, timeout=30).stop()
    # The first extension point it is named at (preFilter) is already unknown.
    assert f'PreFilterPlugin \\"{FRAGMENTATION_PLUGIN}\\" does not exist' in str(excinfo.value)


def test_fragmentation_scheduler_live_refuses_bad_plugin_args(
    control_plane: LocalControlPlane,
) -> None:
    """GpuFragmentation's arguments are checked at start: the scheduler exits naming the field,
    the value and what is allowed."""
    require_tools("gpu-binpack-scheduler")
    config = _fragmentation_config(control_plane, "fragmentation-bad-args")
    config["profiles"][0]["pluginConfig"][0]["args"]["priorWeight"] = 2
    with pytest.raises(ControlPlaneError, match="exited with code") as excinfo:
        control_plane.start_scheduler(
            yaml.safe_dump(config), timeout=30, binary="gpu-binpack-scheduler"
        ).stop()
    assert "GpuFragmentation args: priorWeight is 2; expected 0 (no priors) to 1" in str(
        excinfo.value
    )
