"""The binpack profile with DRA GPUs (`gpuOperator.allocation: dra`): the DeviceClasses'
extended resource names weighed and balanced like GPUs, GpuClaimBinpack for claim pods, and
nothing new with the device plugin. Settings in, configuration out; no Pulumi."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from components.binpack_scheduler.manifests import (
    CLAIM_BINPACK_PLUGIN,
    claim_binpack_weight,
    render_config,
    render_config_yaml,
)
from components.binpack_scheduler.settings import BinpackSchedulerSettings, SchedulerProfile
from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_resources import DEVICE_CLASS_RESOURCE_PREFIX

BUILT_IMAGE = "registry.example.com/platform/gpu-binpack-scheduler:v1.37.2"
DRA_OPERATOR = GpuOperatorSettings.model_validate(
    {"enabled": True, "allocation": "dra", "version": "v26.7.0"}
)
# What a container may ask for in DRA mode: the classes' names, from the operator's settings.
DRA_NAMES = [DEVICE_CLASS_RESOURCE_PREFIX + c for c in DRA_OPERATOR.device_classes()]
DEVICE_PLUGIN_OPERATORS = [
    GpuOperatorSettings(),
    GpuOperatorSettings.model_validate({"enabled": True}),
    GpuOperatorSettings.model_validate({"enabled": True, "mig": {"strategy": "mixed"}}),
    GpuOperatorSettings.model_validate(
        {"enabled": True, "devicePlugin": {"timeSlicing": {"replicas": 4, "renameByDefault": True}}}
    ),
]


def _make_profile(
    operator: GpuOperatorSettings = DRA_OPERATOR, **scheduler: Any
) -> SchedulerProfile:
    settings = BinpackSchedulerSettings.model_validate({"image": BUILT_IMAGE, **scheduler})
    return settings.profile_with(operator.gpu_resources())


def _entry(profile: SchedulerProfile) -> dict[str, Any]:
    (entry,) = render_config(profile)["profiles"]
    return entry


def _args(entry: dict[str, Any], plugin: str) -> dict[str, Any]:
    (args,) = [c["args"] for c in entry["pluginConfig"] if c["name"] == plugin]
    return args


def _named(entry: dict[str, Any], point: str) -> list[str]:
    return [p["name"] for p in entry["plugins"].get(point, {}).get("enabled", [])]


def test_binpack_scheduler_dra_names_come_from_the_operators_device_classes() -> None:
    assert DRA_NAMES == [
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
        "deviceclass.resource.kubernetes.io/mig.nvidia.com",
    ]


@pytest.mark.parametrize("gpu_weight", [100, 40])
def test_binpack_scheduler_dra_weighs_the_device_class_names_like_gpus(gpu_weight: int) -> None:
    weights = {"nvidia.com/gpu": gpu_weight, "cpu": 1, "memory": 1}
    args = _args(_entry(_make_profile(resourceWeights=weights)), "NodeResourcesFit")
    resources = {r["name"]: r["weight"] for r in args["scoringStrategy"]["resources"]}
    assert {n: resources[n] for n in DRA_NAMES} == dict.fromkeys(DRA_NAMES, gpu_weight)


def test_binpack_scheduler_dra_balances_the_device_class_names_with_the_gpus() -> None:
    args = _args(_entry(_make_profile()), "NodeResourcesBalancedAllocation")
    assert [r["name"] for r in args["resources"]] == ["cpu", "memory", "nvidia.com/gpu", *DRA_NAMES]


def test_binpack_scheduler_dra_leaves_a_balance_without_gpus_as_configured() -> None:
    profile = _make_profile(balancedAllocation={"resources": ["cpu", "memory"]})
    args = _args(_entry(profile), "NodeResourcesBalancedAllocation")
    assert [r["name"] for r in args["resources"]] == ["cpu", "memory"]


def test_binpack_scheduler_dra_scores_claim_pods_with_gpu_claim_binpack() -> None:
    entry = _entry(_make_profile())
    assert CLAIM_BINPACK_PLUGIN in _named(entry, "preScore")
    assert CLAIM_BINPACK_PLUGIN in _named(entry, "score")
    assert _named(entry, "reserve") == [CLAIM_BINPACK_PLUGIN]
    # BalancedAllocation keeps its weight beside it.
    assert {"name": "NodeResourcesBalancedAllocation", "weight": 3} in entry["plugins"]["score"][
        "enabled"
    ]


def test_binpack_scheduler_dra_claim_binpack_follows_the_profiles_shape() -> None:
    shape = [
        {"utilization": 0, "score": 0},
        {"utilization": 60, "score": 4},
        {"utilization": 100, "score": 10},
    ]
    entry = _entry(_make_profile(shape=shape))
    assert _args(entry, CLAIM_BINPACK_PLUGIN) == {"shape": shape}
    assert _args(entry, "NodeResourcesFit")["scoringStrategy"]["requestedToCapacityRatio"] == {
        "shape": shape
    }


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        # For a claim pod NodeResourcesFit scores cpu and memory alone (their weighted mean): the
        # GPU score weighs what the GPU weight is to theirs.
        ({"nvidia.com/gpu": 100, "cpu": 1, "memory": 1}, 50),
        ({"nvidia.com/gpu": 100, "cpu": 10, "memory": 10}, 5),
        ({"nvidia.com/gpu": 30, "cpu": 40, "memory": 40}, 1),
        ({"nvidia.com/gpu": 100}, 1),
    ],
)
def test_binpack_scheduler_dra_claim_binpack_weight_is_the_gpu_weights_share(
    weights: dict[str, int], expected: int
) -> None:
    entry = _entry(_make_profile(resourceWeights=weights))
    (weight,) = [
        p["weight"]
        for p in entry["plugins"]["score"]["enabled"]
        if p["name"] == CLAIM_BINPACK_PLUGIN
    ]
    assert weight == expected == claim_binpack_weight(_make_profile(resourceWeights=weights))


def test_binpack_scheduler_dra_claim_binpack_beside_a_disabled_balanced_allocation() -> None:
    entry = _entry(_make_profile(balancedAllocation={"weight": 0}))
    assert entry["plugins"]["score"]["disabled"] == [{"name": "NodeResourcesBalancedAllocation"}]
    assert _named(entry, "score") == [CLAIM_BINPACK_PLUGIN]


@pytest.mark.parametrize(
    "scheduler",
    [
        {},
        {"image": "registry.k8s.io/kube-scheduler:v1.37.2"},
        {"image": "registry.k8s.io/kube-scheduler@sha256:" + "0" * 64},
        {"scoring": "fragmentation", "image": BUILT_IMAGE},
    ],
    ids=["upstream-default", "upstream-tag", "upstream-digest", "fragmentation"],
)
def test_binpack_scheduler_dra_no_claim_binpack_without_the_projects_binpack_image(
    scheduler: dict[str, Any],
) -> None:
    """The upstream image lacks the plugin (naming it would make kube-scheduler exit);
    fragmentation places claim pods itself."""
    profile = BinpackSchedulerSettings.model_validate(scheduler).profile_with(
        DRA_OPERATOR.gpu_resources()
    )
    assert not profile.claim_binpack
    assert CLAIM_BINPACK_PLUGIN not in render_config_yaml(profile)


@pytest.mark.parametrize("operator", DEVICE_PLUGIN_OPERATORS, ids=["off", "on", "mig", "shared"])
@pytest.mark.parametrize("image", [None, BUILT_IMAGE], ids=["upstream", "built"])
def test_binpack_scheduler_dra_nothing_new_with_the_device_plugin(
    operator: GpuOperatorSettings, image: str | None
) -> None:
    """With the device plugin the profile is the one the settings describe, DRA additions off:
    its rendered configuration is unchanged."""
    settings = BinpackSchedulerSettings.model_validate({"image": image} if image else {})
    profile = settings.profile_with(operator.gpu_resources())
    unchanged = replace(
        profile, claim_binpack=False, balanced_resources=settings.balanced_allocation.resources
    )
    assert profile == unchanged
    rendered = render_config_yaml(profile)
    assert DEVICE_CLASS_RESOURCE_PREFIX not in rendered
    assert CLAIM_BINPACK_PLUGIN not in rendered
