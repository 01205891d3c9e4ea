"""BinpackScheduler: the rendered KubeSchedulerConfiguration and the objects under mocks.

tests/integration/test_binpack_scheduler_live.py runs the rendered config in the real
kube-scheduler.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from components import (
    BinpackScheduler,
    BinpackSchedulerArgs,
    ResourceWeight,
    SchedulerProfile,
    ShapePoint,
)
from components.binpack_scheduler.manifests import SCHEDULER_RULES, render_config
from components.gpu_resources import GpuResources
from stack_config import ConfigError, parse_stack_config
from tests.conftest import Recording, component_access, register

captured: dict[str, Any] = {}


def _make_scheduler(**overrides: Any) -> Recording:
    def build() -> None:
        access = component_access()
        args: dict[str, Any] = {"access": access, "kubernetes_version": "v1.34.4", **overrides}
        scheduler = BinpackScheduler("binpack", BinpackSchedulerArgs(**args))
        scheduler.scheduler_name.apply(lambda n: captured.update(name=n))
        scheduler.config_yaml.apply(lambda c: captured.update(config=c))
        captured["gpus"] = scheduler.gpu_resources

    captured.clear()
    return register(build)


def _advertised(*names: str, prefixes: tuple[str, ...] = ()) -> GpuResources:
    return GpuResources(names=names, prefixes=prefixes)


def _deployment(recording: Recording) -> dict[str, Any]:
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    return deployment.inputs


def test_binpack_scheduler_config_uses_v1_and_requested_to_capacity_ratio() -> None:
    config = render_config(SchedulerProfile())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "gpu-binpack-scheduler"
    plugin = profile["pluginConfig"][0]
    assert plugin["name"] == "NodeResourcesFit"
    strategy = plugin["args"]["scoringStrategy"]
    assert strategy["type"] == "RequestedToCapacityRatio"
    assert strategy["resources"] == [
        {"name": "nvidia.com/gpu", "weight": 100},
        {"name": "cpu", "weight": 1},
        {"name": "memory", "weight": 1},
    ]
    assert strategy["requestedToCapacityRatio"]["shape"] == [
        {"utilization": 0, "score": 0},
        {"utilization": 100, "score": 10},
    ]


def test_binpack_scheduler_config_balances_the_gpu_share_against_cpu_and_memory() -> None:
    (profile,) = render_config(SchedulerProfile())["profiles"]
    assert profile["plugins"] == {
        "score": {"enabled": [{"name": "NodeResourcesBalancedAllocation", "weight": 3}]}
    }
    balanced = {c["name"]: c["args"] for c in profile["pluginConfig"]}[
        "NodeResourcesBalancedAllocation"
    ]
    # kube-scheduler accepts only weight 1 for each of this plugin's resources.
    assert balanced == {
        "resources": [
            {"name": "cpu", "weight": 1},
            {"name": "memory", "weight": 1},
            {"name": "nvidia.com/gpu", "weight": 1},
        ]
    }


def test_binpack_scheduler_config_weight_zero_disables_balanced_allocation() -> None:
    (profile,) = render_config(SchedulerProfile(balanced_weight=0))["profiles"]
    assert profile["plugins"] == {
        "score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}
    }
    assert [c["name"] for c in profile["pluginConfig"]] == ["NodeResourcesFit"]


def test_binpack_scheduler_config_has_its_own_lease() -> None:
    config = render_config(SchedulerProfile(scheduler_name="gpu-pack"))
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceName": "gpu-pack",
        "resourceNamespace": "kube-system",
    }


# The cluster's own components hold these Leases in kube-system; kube-scheduler's is the one its
# leaderElection.resourceName defaults to (pkg/scheduler/apis/config/v1/defaults.go).
@pytest.mark.parametrize(
    "name",
    [
        "kube-scheduler",
        "kube-controller-manager",
        "cloud-controller-manager",
        "apiserver-m6nbkymgpb6oy7kwfxzhnsbkwu",
    ],
)
def test_binpack_scheduler_refuses_a_name_whose_lease_the_control_plane_holds(name: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"scheduler": {"name": name}})
    (problem,) = [str(p) for p in excinfo.value.problems]
    assert problem.startswith(f"gpu-cluster:scheduler.name: got {name!r}; ")
    assert "Lease" in problem and "kube-system" in problem


def test_binpack_scheduler_profile_refuses_the_cluster_schedulers_lease() -> None:
    # The profile is also built without the settings (bench, live tests).
    with pytest.raises(ValueError, match="scheduler_name: got 'kube-scheduler'"):
        SchedulerProfile(scheduler_name="kube-scheduler")


def test_binpack_scheduler_config_carries_custom_shape_weights_and_percentage() -> None:
    profile = SchedulerProfile(
        shape=(ShapePoint(utilization=0, score=1), ShapePoint(utilization=80, score=9)),
        resources=(ResourceWeight(name="nvidia.com/gpu", weight=7),),
        percentage_of_nodes_to_score=100,
    )
    entry = render_config(profile)["profiles"][0]
    strategy = entry["pluginConfig"][0]["args"]["scoringStrategy"]
    assert strategy["resources"] == [{"name": "nvidia.com/gpu", "weight": 7}]
    assert strategy["requestedToCapacityRatio"]["shape"][1] == {"utilization": 80, "score": 9}
    assert entry["percentageOfNodesToScore"] == 100


def test_binpack_scheduler_config_in_cluster_has_no_kubeconfig() -> None:
    assert "clientConnection" not in render_config(SchedulerProfile())
    local = render_config(SchedulerProfile(), kubeconfig="/tmp/admin.conf")
    assert local["clientConnection"] == {"kubeconfig": "/tmp/admin.conf"}


def test_binpack_scheduler_config_map_holds_the_rendered_config() -> None:
    recording = _make_scheduler()
    (config_map,) = recording.of_type("kubernetes:core/v1:ConfigMap")
    assert yaml.safe_load(config_map.inputs["data"]["config.yaml"]) == render_config(
        SchedulerProfile()
    )
    assert yaml.safe_load(captured["config"]) == render_config(SchedulerProfile())


def test_binpack_scheduler_runs_the_cluster_version_image_with_https_probes() -> None:
    recording = _make_scheduler(kubernetes_version="v1.33.13")
    pod = _deployment(recording)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.k8s.io/kube-scheduler:v1.33.13"
    assert not any(arg.startswith("--port") for arg in container["command"])
    assert not any("scheduler.conf" in arg for arg in container["command"])
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"scheme": "HTTPS", "port": 10259, "path": path}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}


def test_binpack_scheduler_pod_is_critical_and_tolerates_control_plane() -> None:
    pod = _deployment(_make_scheduler())["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert {
        "key": "node-role.kubernetes.io/control-plane",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    assert pod["serviceAccountName"] == "gpu-binpack-scheduler"
    assert "hostPath" not in str(pod["volumes"])


def test_binpack_scheduler_rbac_is_its_own_not_the_cluster_schedulers() -> None:
    recording = _make_scheduler()
    (cluster_role,) = recording.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    assert cluster_role.inputs["metadata"]["name"] == "gpu-binpack-scheduler:scheduler"
    assert cluster_role.inputs["rules"] == list(SCHEDULER_RULES)
    cluster_roles = [
        b.inputs["roleRef"]["name"]
        for b in recording.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    ]
    # Neither system:kube-scheduler nor system:volume-scheduler.
    assert cluster_roles == ["gpu-binpack-scheduler:scheduler"]
    roles = sorted(
        b.inputs["roleRef"]["name"]
        for b in recording.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    )
    assert roles == ["extension-apiserver-authentication-reader", "gpu-binpack-scheduler:lease"]
    (lease_role,) = recording.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert lease_role.inputs["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gpu-binpack-scheduler"],
            "verbs": ["get", "update"],
        }
    ]


def test_binpack_scheduler_creates_its_lease_without_a_holder() -> None:
    recording = _make_scheduler(name="gpu-pack")
    (lease,) = recording.of_type("kubernetes:coordination.k8s.io/v1:Lease")
    assert lease.inputs["metadata"]["name"] == "gpu-pack"
    assert lease.inputs["metadata"]["namespace"] == "kube-system"
    # Leader election writes the holder; the stack writes no spec to fight it over.
    assert "spec" not in lease.inputs


def test_binpack_scheduler_deployment_waits_for_its_rbac_and_lease() -> None:
    recording = _make_scheduler()
    (deployment,) = recording.of_type("kubernetes:apps/v1:Deployment")
    bindings = [r.urn for r in recording.resources if r.typ.endswith("Binding")]
    (lease,) = recording.of_type("kubernetes:coordination.k8s.io/v1:Lease")
    assert len(bindings) == 3
    assert {*bindings, lease.urn} <= set(deployment.dependencies)


def test_binpack_scheduler_config_change_rolls_the_pods() -> None:
    first = _deployment(_make_scheduler())["spec"]["template"]["metadata"]["annotations"]
    second = _deployment(_make_scheduler(percentage_of_nodes_to_score=50))["spec"]["template"][
        "metadata"
    ]["annotations"]
    assert first["gpu-cluster.io/config-sha256"] != second["gpu-cluster.io/config-sha256"]


def test_binpack_scheduler_outputs_its_name() -> None:
    _make_scheduler(name="gpu-pack")
    assert captured["name"] == "gpu-pack"


def _weights(**overrides: Any) -> dict[str, int]:
    _make_scheduler(**overrides)
    (profile,) = yaml.safe_load(captured["config"])["profiles"]
    resources = profile["pluginConfig"][0]["args"]["scoringStrategy"]["resources"]
    return {r["name"]: r["weight"] for r in resources}


def test_binpack_scheduler_weights_advertised_gpu_resources_like_its_heaviest_gpu() -> None:
    weights = _weights(
        resource_weights={"nvidia.com/gpu": 80, "cpu": 1},
        advertised=_advertised("nvidia.com/gpu", "nvidia.com/gpu.shared"),
    )
    assert weights == {"nvidia.com/gpu": 80, "cpu": 1, "nvidia.com/gpu.shared": 80}


def test_binpack_scheduler_configured_weight_of_an_advertised_resource_wins() -> None:
    weights = _weights(
        resource_weights={"nvidia.com/gpu": 100, "nvidia.com/gpu.shared": 10},
        advertised=_advertised("nvidia.com/gpu.shared"),
    )
    assert weights == {"nvidia.com/gpu": 100, "nvidia.com/gpu.shared": 10}


def test_binpack_scheduler_a_nic_weight_is_not_a_gpu_weight() -> None:
    """NVIDIA's NICs are nvidia.com resources too; the heaviest GPU weight is nvidia.com/gpu's."""
    weights = _weights(
        resource_weights={"nvidia.com/gpu": 10, "nvidia.com/hostdev": 100, "cpu": 1},
        advertised=_advertised("nvidia.com/gpu", "nvidia.com/gpu.shared"),
    )
    assert weights["nvidia.com/gpu.shared"] == 10


def test_binpack_scheduler_weights_the_added_gpu_resources() -> None:
    recording = _make_scheduler(
        resource_weights={"nvidia.com/gpu": 60, "cpu": 1},
        gpu_resources=["amd.com/cpx_nps4"],
        advertised=_advertised("nvidia.com/gpu"),
    )
    (profile,) = yaml.safe_load(captured["config"])["profiles"]
    resources = profile["pluginConfig"][0]["args"]["scoringStrategy"]["resources"]
    assert {r["name"]: r["weight"] for r in resources} == {
        "nvidia.com/gpu": 60,
        "cpu": 1,
        "amd.com/cpx_nps4": 60,
    }
    assert recording.of_type("gpu-cluster:index:BinpackScheduler")
    # What the gate routes and the monitoring counts: the same resources.
    assert captured["gpus"] == GpuResources(
        names=("nvidia.com/gpu", "amd.com/cpx_nps4"), prefixes=()
    )


# ------------------------------------------------------------------ scoring: fragmentation
IMAGE = "registry.example.com/platform/gpu-binpack-scheduler:v1.37.2"


def test_fragmentation_scoring_runs_the_configured_image_with_the_upstream_command() -> None:
    recording = _make_scheduler(scoring="fragmentation", image=IMAGE)
    (container,) = _deployment(recording)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    # The image built from scheduler/ keeps kube-scheduler's command name (on PATH).
    assert container["command"][0] == "kube-scheduler"


def test_fragmentation_scoring_scores_with_the_plugin_only_and_keeps_the_fit_filter() -> None:
    recording = _make_scheduler(
        scoring="fragmentation",
        image=IMAGE,
        advertised=GpuResources(
            names=("nvidia.com/gpu", "nvidia.com/gpu.shared"),
            prefixes=(),
            shared=(("nvidia.com/gpu.shared", 4),),
        ),
    )
    assert recording is not None
    (profile,) = yaml.safe_load(captured["config"])["profiles"]
    plugin = [{"name": "GpuFragmentation"}]
    # Every arriving pod counted (preFilter), its own placements followed (reserve).
    assert profile["plugins"] == {
        "preFilter": {"enabled": plugin},
        "preScore": {"enabled": plugin},
        "reserve": {"enabled": plugin},
        "score": {
            "enabled": [{"name": "GpuFragmentation", "weight": 10}],
            "disabled": [
                {"name": "NodeResourcesFit"},
                {"name": "NodeResourcesBalancedAllocation"},
            ],
        },
    }
    # The GPU resources the GPU Operator advertises are what the plugin counts as GPUs; a
    # time-sliced unit as a quarter of one; no MIG profiles without mig.strategy mixed.
    assert profile["pluginConfig"] == [
        {
            "name": "GpuFragmentation",
            "args": {
                "gpuResources": ["nvidia.com/gpu", "nvidia.com/gpu.shared"],
                "migResourcePrefix": "",
                "sharedResources": [{"name": "nvidia.com/gpu.shared", "replicas": 4}],
            },
        }
    ]


def test_fragmentation_scoring_counts_mig_profiles_under_mig_mixed() -> None:
    _make_scheduler(
        scoring="fragmentation",
        image=IMAGE,
        advertised=_advertised("nvidia.com/gpu", prefixes=("nvidia.com/mig-",)),
    )
    (profile,) = yaml.safe_load(captured["config"])["profiles"]
    (entry,) = profile["pluginConfig"]
    assert entry["args"]["migResourcePrefix"] == "nvidia.com/mig-"
    assert "sharedResources" not in entry["args"]


def test_fragmentation_scoring_counts_the_added_gpu_resources_as_gpus() -> None:
    _make_scheduler(
        scoring="fragmentation",
        image=IMAGE,
        gpu_resources=["example.com/vgpu"],
        advertised=_advertised("nvidia.com/gpu"),
    )
    (profile,) = yaml.safe_load(captured["config"])["profiles"]
    (entry,) = profile["pluginConfig"]
    assert entry["args"]["gpuResources"] == ["nvidia.com/gpu", "example.com/vgpu"]


def test_binpack_scoring_keeps_the_upstream_image_unless_one_is_configured() -> None:
    (container,) = _deployment(_make_scheduler(image="mirror.example.com/kube-scheduler:v1.34.4"))[
        "spec"
    ]["template"]["spec"]["containers"]
    assert container["image"] == "mirror.example.com/kube-scheduler:v1.34.4"
