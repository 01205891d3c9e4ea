"""BinpackScheduler's builders as tables: profile in, scheduler configuration out; names in,
Kubernetes objects out. Plain dicts, no Pulumi."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import yaml

from components.binpack_scheduler.manifests import (
    CONFIG_DIR,
    CONFIG_HASH_ANNOTATION,
    CONFIG_KEY,
    SCHEDULER_RULES,
    config_map,
    deployment,
    labels,
    lease,
    lease_role,
    object_meta,
    render_config,
    render_config_yaml,
    role_bindings,
    scheduler_role,
    service_account,
)
from components.binpack_scheduler.settings import (
    FRAGMENTATION,
    ResourceWeight,
    SchedulerProfile,
)

BALANCED = "NodeResourcesBalancedAllocation"
FIT = "NodeResourcesFit"
FRAG = "GpuFragmentation"
SHARED = "nvidia.com/gpu.shared"


def _entry(profile: SchedulerProfile) -> dict[str, Any]:
    (entry,) = render_config(profile)["profiles"]
    return entry


def _make_deployment(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "scheduler_name": "gpu-binpack-scheduler",
        "namespace": "kube-system",
        "replicas": 2,
        "image": "registry.k8s.io/kube-scheduler:v1.37.2",
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "config_yaml": "kind: KubeSchedulerConfiguration\n",
        "service_account": "gpu-binpack-scheduler",
        "config_map": "gpu-binpack-scheduler",
        **overrides,
    }
    return deployment(kwargs.pop("scheduler_name"), kwargs.pop("namespace"), **kwargs)


# ------------------------------------------------------------------ KubeSchedulerConfiguration
@pytest.mark.parametrize(
    ("profile", "plugins", "configured"),
    [
        (
            SchedulerProfile(),
            {"score": {"enabled": [{"name": BALANCED, "weight": 3}]}},
            [FIT, BALANCED],
        ),
        (
            SchedulerProfile(balanced_weight=7),
            {"score": {"enabled": [{"name": BALANCED, "weight": 7}]}},
            [FIT, BALANCED],
        ),
        (
            SchedulerProfile(balanced_weight=0),
            {"score": {"disabled": [{"name": BALANCED}]}},
            [FIT],
        ),
        (
            SchedulerProfile(scoring=FRAGMENTATION),
            {
                "preFilter": {"enabled": [{"name": FRAG}]},
                "preScore": {"enabled": [{"name": FRAG}]},
                "reserve": {"enabled": [{"name": FRAG}]},
                "score": {
                    "enabled": [{"name": FRAG, "weight": 10}],
                    "disabled": [{"name": FIT}, {"name": BALANCED}],
                },
            },
            [FRAG],
        ),
    ],
    ids=["binpack", "balanced-weight-7", "balanced-off", "fragmentation"],
)
def test_binpack_scheduler_manifests_profile_sets_the_score_plugins(
    profile: SchedulerProfile, plugins: dict[str, Any], configured: list[str]
) -> None:
    entry = _entry(profile)
    assert entry["plugins"] == plugins
    assert [c["name"] for c in entry["pluginConfig"]] == configured


@pytest.mark.parametrize(
    ("resources", "balanced", "strategy", "balanced_args"),
    [
        (
            (ResourceWeight(name="nvidia.com/gpu", weight=100),),
            ("cpu", "memory"),
            [{"name": "nvidia.com/gpu", "weight": 100}],
            [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}],
        ),
        (
            (ResourceWeight(name="amd.com/gpu", weight=50), ResourceWeight(name="cpu", weight=2)),
            ("cpu", "amd.com/gpu"),
            [{"name": "amd.com/gpu", "weight": 50}, {"name": "cpu", "weight": 2}],
            [{"name": "cpu", "weight": 1}, {"name": "amd.com/gpu", "weight": 1}],
        ),
    ],
    ids=["nvidia", "amd-and-cpu"],
)
def test_binpack_scheduler_manifests_binpack_weighs_and_balances_the_profiles_resources(
    resources: tuple[ResourceWeight, ...],
    balanced: tuple[str, ...],
    strategy: list[dict[str, Any]],
    balanced_args: list[dict[str, Any]],
) -> None:
    entry = _entry(SchedulerProfile(resources=resources, balanced_resources=balanced))
    args = {c["name"]: c["args"] for c in entry["pluginConfig"]}
    assert args[FIT]["scoringStrategy"]["resources"] == strategy
    # BalancedAllocation balances shares: every resource weighs 1.
    assert args[BALANCED] == {"resources": balanced_args}


@pytest.mark.parametrize(
    ("profile", "args"),
    [
        (
            SchedulerProfile(scoring=FRAGMENTATION),
            {"gpuResources": ["nvidia.com/gpu"], "migResourcePrefix": ""},
        ),
        (
            SchedulerProfile(
                scoring=FRAGMENTATION,
                resources=(
                    ResourceWeight(name="nvidia.com/gpu", weight=100),
                    ResourceWeight(name="cpu", weight=1),
                    ResourceWeight(name=SHARED, weight=100),
                ),
                shared_gpus=((SHARED, 4),),
                mig_prefix="nvidia.com/mig-",
            ),
            {
                "gpuResources": ["nvidia.com/gpu", SHARED],
                "migResourcePrefix": "nvidia.com/mig-",
                "sharedResources": [{"name": SHARED, "replicas": 4}],
            },
        ),
    ],
    ids=["whole-gpus", "shared-and-mig"],
)
def test_binpack_scheduler_manifests_fragmentation_args_name_the_gpu_resources(
    profile: SchedulerProfile, args: dict[str, Any]
) -> None:
    assert _entry(profile)["pluginConfig"] == [{"name": FRAG, "args": args}]


@pytest.mark.parametrize(
    ("percentage", "entry"),
    [(None, {}), (0, {"percentageOfNodesToScore": 0}), (100, {"percentageOfNodesToScore": 100})],
    ids=["adaptive", "zero", "all"],
)
def test_binpack_scheduler_manifests_percentage_of_nodes_only_when_set(
    percentage: int | None, entry: dict[str, Any]
) -> None:
    rendered = _entry(SchedulerProfile(percentage_of_nodes_to_score=percentage))
    assert {k: v for k, v in rendered.items() if k == "percentageOfNodesToScore"} == entry


@pytest.mark.parametrize(
    ("profile", "election"),
    [
        (
            SchedulerProfile(),
            {
                "leaderElect": True,
                "resourceName": "gpu-binpack-scheduler",
                "resourceNamespace": "kube-system",
            },
        ),
        (
            SchedulerProfile(
                scheduler_name="gpu-pack", lease_namespace="sched", leader_elect=False
            ),
            {"leaderElect": False, "resourceName": "gpu-pack", "resourceNamespace": "sched"},
        ),
    ],
    ids=["default", "own-namespace-no-election"],
)
def test_binpack_scheduler_manifests_leader_election_is_on_the_schedulers_own_lease(
    profile: SchedulerProfile, election: dict[str, Any]
) -> None:
    assert render_config(profile)["leaderElection"] == election


# ------------------------------------------------------------------ Kubernetes objects
@pytest.mark.parametrize(
    ("name", "namespace", "meta"),
    [
        (
            "gpu-pack",
            "sched",
            {
                "name": "gpu-pack",
                "namespace": "sched",
                "labels": {
                    "app.kubernetes.io/name": "gpu-pack",
                    "app.kubernetes.io/part-of": "gpu-cluster",
                },
            },
        ),
        (
            "gpu-pack:scheduler",
            None,
            {
                "name": "gpu-pack:scheduler",
                "labels": {
                    "app.kubernetes.io/name": "gpu-pack",
                    "app.kubernetes.io/part-of": "gpu-cluster",
                },
            },
        ),
    ],
    ids=["namespaced", "cluster-scoped"],
)
def test_binpack_scheduler_manifests_metadata_is_labelled_with_the_scheduler(
    name: str, namespace: str | None, meta: dict[str, Any]
) -> None:
    assert object_meta(name, "gpu-pack", namespace) == meta


@pytest.mark.parametrize(
    ("scheduler_name", "namespace"),
    [("gpu-binpack-scheduler", "kube-system"), ("gpu-pack", "sched")],
)
def test_binpack_scheduler_manifests_deployment_selects_its_own_pods(
    scheduler_name: str, namespace: str
) -> None:
    manifest = _make_deployment(scheduler_name=scheduler_name, namespace=namespace)
    spec = manifest["spec"]
    selected = labels(scheduler_name)
    assert manifest["metadata"] == object_meta(scheduler_name, scheduler_name, namespace)
    assert spec["selector"] == {"matchLabels": selected}
    assert spec["template"]["metadata"]["labels"] == selected
    (term,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    # Replicas prefer different nodes: the anti-affinity selects the same pods.
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": selected}


@pytest.mark.parametrize(
    ("service_account_name", "config_map_name"),
    [("gpu-binpack-scheduler", "gpu-binpack-scheduler"), ("sa-1", "cm-1")],
)
def test_binpack_scheduler_manifests_pod_mounts_its_config_map_and_runs_as_its_account(
    service_account_name: str, config_map_name: str
) -> None:
    pod = _make_deployment(service_account=service_account_name, config_map=config_map_name)[
        "spec"
    ]["template"]["spec"]
    assert pod["serviceAccountName"] == service_account_name
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": config_map_name}}]
    (container,) = pod["containers"]
    assert {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True} in container[
        "volumeMounts"
    ]
    assert f"--config={CONFIG_DIR}/{CONFIG_KEY}" in container["command"]


@pytest.mark.parametrize(
    ("image", "requests", "replicas"),
    [
        ("registry.k8s.io/kube-scheduler:v1.37.2", {"cpu": "100m", "memory": "128Mi"}, 2),
        ("registry.example.com/gpu-binpack-scheduler@sha256:" + "0" * 64, {"cpu": "1"}, 5),
    ],
    ids=["upstream", "built"],
)
def test_binpack_scheduler_manifests_deployment_carries_image_requests_and_replicas(
    image: str, requests: dict[str, str], replicas: int
) -> None:
    spec = _make_deployment(image=image, requests=requests, replicas=replicas)["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    assert spec["replicas"] == replicas
    assert container["image"] == image
    assert container["resources"] == {"requests": requests}
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"scheme": "HTTPS", "port": 10259, "path": path}


@pytest.mark.parametrize(
    ("first", "second", "rolls"),
    [
        (SchedulerProfile(), SchedulerProfile(), False),
        (SchedulerProfile(), SchedulerProfile(percentage_of_nodes_to_score=50), True),
        (SchedulerProfile(), SchedulerProfile(balanced_weight=0), True),
    ],
    ids=["same-config", "percentage", "balanced-off"],
)
def test_binpack_scheduler_manifests_a_config_change_rolls_the_pods(
    first: SchedulerProfile, second: SchedulerProfile, rolls: bool
) -> None:
    hashes = [
        _make_deployment(config_yaml=render_config_yaml(p))["spec"]["template"]["metadata"][
            "annotations"
        ][CONFIG_HASH_ANNOTATION]
        for p in (first, second)
    ]
    assert (hashes[0] != hashes[1]) is rolls
    assert hashes[0] == hashlib.sha256(render_config_yaml(first).encode()).hexdigest()


@pytest.mark.parametrize("profile", [SchedulerProfile(), SchedulerProfile(scoring=FRAGMENTATION)])
def test_binpack_scheduler_manifests_config_map_holds_the_rendered_config(
    profile: SchedulerProfile,
) -> None:
    manifest = config_map("gpu-pack", "sched", render_config_yaml(profile))
    assert manifest["metadata"] == object_meta("gpu-pack", "gpu-pack", "sched")
    assert list(manifest["data"]) == [CONFIG_KEY]
    assert yaml.safe_load(manifest["data"][CONFIG_KEY]) == render_config(profile)


def test_binpack_scheduler_manifests_service_account_is_named_after_the_scheduler() -> None:
    assert service_account("gpu-pack", "sched") == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta("gpu-pack", "gpu-pack", "sched"),
    }


# ------------------------------------------------------------------ RBAC
# suffix -> (binding kind, role kind, role, binding namespace) for scheduler gpu-pack, its
# ServiceAccount in sched, its Lease in leases.
RBAC = {
    "scheduler": ("ClusterRoleBinding", "ClusterRole", "gpu-pack:scheduler", None),
    "auth-reader": (
        "RoleBinding",
        "Role",
        "extension-apiserver-authentication-reader",
        "kube-system",
    ),
    "lease": ("RoleBinding", "Role", "gpu-pack:lease", "leases"),
}


def test_binpack_scheduler_manifests_binds_exactly_the_schedulers_own_roles() -> None:
    assert list(role_bindings("gpu-pack", "sched", "leases")) == list(RBAC)


@pytest.mark.parametrize(("suffix", "expected"), list(RBAC.items()), ids=list(RBAC))
def test_binpack_scheduler_manifests_binding_gives_the_service_account_its_role(
    suffix: str, expected: tuple[str, str, str, str | None]
) -> None:
    kind, role_kind, role, namespace = expected
    binding = role_bindings("gpu-pack", "sched", "leases")[suffix]
    assert binding["kind"] == kind
    assert binding["metadata"] == object_meta(f"gpu-pack:{suffix}", "gpu-pack", namespace)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": role_kind,
        "name": role,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-pack", "namespace": "sched"}
    ]


def _granted(role: dict[str, Any], group: str, resource: str) -> set[str]:
    """The verbs `role` grants on `resource` of API group `group` (any name)."""
    return {
        verb
        for rule in role["rules"]
        if group in rule["apiGroups"] and resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_binpack_scheduler_manifests_scheduler_role_is_cluster_scoped_and_named_for_it() -> None:
    role = scheduler_role("gpu-pack")
    assert (role["kind"], role["metadata"]) == (
        "ClusterRole",
        object_meta("gpu-pack:scheduler", "gpu-pack", None),
    )
    assert role["rules"] == list(SCHEDULER_RULES)


# (API group, resource) -> verbs: what kube-scheduler v1.37 is granted by system:kube-scheduler
# and system:volume-scheduler (bootstrappolicy/policy.go, default feature gates).
SCHEDULER_GRANTS = {
    ("", "events"): {"create", "update", "patch"},
    ("events.k8s.io", "events"): {"create", "update", "patch"},
    ("", "nodes"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list", "watch", "delete"},
    ("", "pods/binding"): {"create"},
    ("", "bindings"): {"create"},
    ("", "pods/status"): {"patch", "update"},
    ("", "pods/finalizers"): {"update"},
    ("", "services"): {"get", "list", "watch"},
    ("", "replicationcontrollers"): {"get", "list", "watch"},
    ("apps", "replicasets"): {"get", "list", "watch"},
    ("extensions", "replicasets"): {"get", "list", "watch"},
    ("apps", "statefulsets"): {"get", "list", "watch"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch"},
    ("", "persistentvolumes"): {"get", "list", "watch", "update", "patch"},
    ("", "persistentvolumeclaims"): {"get", "list", "watch", "update", "patch"},
    ("storage.k8s.io", "storageclasses"): {"get", "list", "watch"},
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    ("storage.k8s.io", "csinodes"): {"get", "list", "watch"},
    ("storage.k8s.io", "volumeattachments"): {"get", "list", "watch"},
    ("", "namespaces"): {"get", "list", "watch"},
    ("storage.k8s.io", "csidrivers"): {"get", "list", "watch"},
    ("storage.k8s.io", "csistoragecapacities"): {"get", "list", "watch"},
    ("resource.k8s.io", "deviceclasses"): {"get", "list", "watch"},
    ("resource.k8s.io", "resourceclaims"): {
        "get",
        "list",
        "watch",
        "update",
        "patch",
        "create",
        "delete",
    },
    ("resource.k8s.io", "resourceclaims/status"): {"get", "list", "watch", "update", "patch"},
    ("resource.k8s.io", "resourceclaims/binding"): {"update", "patch"},
    ("resource.k8s.io", "resourceslices"): {"get", "list", "watch"},
    ("resource.k8s.io", "devicetaintrules"): {"get", "list", "watch"},
}


@pytest.mark.parametrize(
    ("where", "verbs"), list(SCHEDULER_GRANTS.items()), ids=["/".join(k) for k in SCHEDULER_GRANTS]
)
def test_binpack_scheduler_manifests_scheduler_role_grants_what_kube_scheduler_uses(
    where: tuple[str, str], verbs: set[str]
) -> None:
    assert _granted(scheduler_role("gpu-pack"), *where) == verbs


def test_binpack_scheduler_manifests_scheduler_role_grants_nothing_else() -> None:
    role = scheduler_role("gpu-pack")
    granted = {
        (group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == set(SCHEDULER_GRANTS)
    # Cluster-wide, on any name: never a resourceNames rule, a wildcard or a Lease.
    assert all("resourceNames" not in rule for rule in role["rules"])
    assert not any("*" in rule["verbs"] + rule["resources"] for rule in role["rules"])
    assert _granted(role, "coordination.k8s.io", "leases") == set()
    assert _granted(role, "coordination.k8s.io", "leasecandidates") == set()


@pytest.mark.parametrize(
    ("scheduler_name", "lease_namespace"),
    [("gpu-binpack-scheduler", "kube-system"), ("gpu-pack", "leases")],
)
def test_binpack_scheduler_manifests_lease_is_the_elected_one_and_holderless(
    scheduler_name: str, lease_namespace: str
) -> None:
    assert lease(scheduler_name, lease_namespace) == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": object_meta(scheduler_name, scheduler_name, lease_namespace),
    }
    election = render_config(
        SchedulerProfile(scheduler_name=scheduler_name, lease_namespace=lease_namespace)
    )["leaderElection"]
    assert (election["resourceName"], election["resourceNamespace"]) == (
        scheduler_name,
        lease_namespace,
    )


@pytest.mark.parametrize(
    ("scheduler_name", "lease_namespace"),
    [("gpu-binpack-scheduler", "kube-system"), ("gpu-pack", "leases")],
)
def test_binpack_scheduler_manifests_lease_role_covers_only_its_own_lease(
    scheduler_name: str, lease_namespace: str
) -> None:
    role = lease_role(scheduler_name, lease_namespace)
    assert role["metadata"]["namespace"] == lease_namespace
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [scheduler_name],
            "verbs": ["get", "update"],
        }
    ]
    # The Lease binding refers to this Role, in the same namespace.
    binding = role_bindings(scheduler_name, "kube-system", lease_namespace)["lease"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["metadata"]["namespace"] == lease_namespace
    # The Lease is the one the configuration elects its leader on.
    election = render_config(
        SchedulerProfile(scheduler_name=scheduler_name, lease_namespace=lease_namespace)
    )["leaderElection"]
    assert (election["resourceName"], election["resourceNamespace"]) == (
        scheduler_name,
        lease_namespace,
    )
