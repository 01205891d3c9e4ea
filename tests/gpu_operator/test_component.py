"""GpuOperator under Pulumi mocks: the values handed to the chart, the pinned chart, ordering."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from components import (
    GpuOperator,
    GpuOperatorArgs,
    Taint,
    TaintedGpuPool,
    TaintedGpuPoolArgs,
    TimeSlicing,
)
from components.charts import deep_merge
from components.gpu_operator.settings import (
    DEFAULT_REPOSITORY,
    DEFAULT_VERSION,
    GpuOperatorSettings,
    Switch,
)
from components.handoffs import OperatorPods
from stack_config import ConfigError, parse_stack_config
from tests.conftest import Recording, Registration, component_access, register

RELEASE = "kubernetes:helm.sh/v3:Release"
POOL_NODES = "pulumi-python:dynamic/gpu-cluster:GpuPoolNodes"


def _make_gpu_operator(taint: Taint | None = None, **overrides: Any) -> Recording:
    """A two-node pool and a GpuOperator taking the pool's taint output."""

    def build() -> None:
        access = component_access()
        pool = TaintedGpuPool(
            "pool",
            TaintedGpuPoolArgs(access=access, nodes=("gpu-1", "gpu-2"), taint=taint or Taint()),
        )
        GpuOperator(
            "op", GpuOperatorArgs(access=access, pool_toleration=pool.toleration, **overrides)
        )

    return register(build)


def _release(recording: Recording) -> Registration:
    (release,) = recording.of_type(RELEASE)
    return release


def _values(recording: Recording) -> dict[str, Any]:
    return dict(_release(recording).inputs["values"])


def test_gpu_operator_tolerations_equal_the_pool_taint() -> None:
    taint = Taint(key="example.com/accelerator", value="a100", effect="PreferNoSchedule")
    values = _values(_make_gpu_operator(taint))
    expected = [
        {
            "key": "example.com/accelerator",
            "operator": "Equal",
            "value": "a100",
            "effect": "PreferNoSchedule",
        }
    ]
    assert values["daemonsets"]["tolerations"] == expected
    assert values["node-feature-discovery"]["worker"]["tolerations"] == expected


def test_gpu_operator_release_waits_for_every_node_taint() -> None:
    recording = _make_gpu_operator()
    (pool,) = recording.of_type(POOL_NODES)  # every node's taint, done before its outputs
    assert len(pool.inputs["nodes"]) == 2
    assert pool.urn in _release(recording).dependencies


def test_gpu_operator_chart_is_pinned_by_default() -> None:
    release = _release(_make_gpu_operator())
    assert release.inputs["chart"] == "gpu-operator"
    assert release.inputs["version"] == DEFAULT_VERSION == "v26.3.3"
    assert release.inputs["repositoryOpts"] == {"repo": DEFAULT_REPOSITORY}
    assert release.inputs["name"] == "gpu-operator"


def test_gpu_operator_version_and_repository_follow_args() -> None:
    release = _release(
        _make_gpu_operator(version="v25.10.1", repository="https://charts.example.com/nvidia")
    )
    assert release.inputs["version"] == "v25.10.1"
    assert release.inputs["repositoryOpts"] == {"repo": "https://charts.example.com/nvidia"}


def test_gpu_operator_driver_and_toolkit_switches_reach_the_chart() -> None:
    values = _values(_make_gpu_operator(driver={"enabled": False}, toolkit={"enabled": False}))
    assert values["driver"] == {"enabled": False}
    assert values["toolkit"]["enabled"] is False
    values = _values(_make_gpu_operator())
    assert values["driver"] == {"enabled": True}
    assert values["toolkit"]["enabled"] is True


def test_gpu_operator_toolkit_env_is_a_list_of_string_values() -> None:
    values = _values(
        _make_gpu_operator(
            toolkit={
                "env": {
                    "CONTAINERD_CONFIG": "/etc/containerd/config.toml",
                    "CONTAINERD_SET_AS_DEFAULT": "true",
                }
            }
        )
    )
    # After the stack's own toolkit setting (the next tests), in the order written.
    assert values["toolkit"]["env"][-2:] == [
        {"name": "CONTAINERD_CONFIG", "value": "/etc/containerd/config.toml"},
        {"name": "CONTAINERD_SET_AS_DEFAULT", "value": "true"},
    ]


# NVIDIA_VISIBLE_DEVICES: with the toolkit's default, an unprivileged container that sets it
# reaches every GPU of its node without requesting one.

ENVVAR_WHEN_UNPRIVILEGED = "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"


def test_gpu_operator_toolkit_ignores_visible_devices_in_unprivileged_containers() -> None:
    values = _values(_make_gpu_operator())
    assert {"name": ENVVAR_WHEN_UNPRIVILEGED, "value": "false"} in values["toolkit"]["env"]


def test_gpu_operator_device_plugin_hands_out_gpus_through_cdi_not_the_variable() -> None:
    # The toolkit then ignoring the variable must not cost requested GPUs their devices: the
    # operator's CDI mode gives the device plugin a CDI device list strategy.
    values = _values(_make_gpu_operator())
    assert values["cdi"] == {"enabled": True}
    assert "env" not in values["devicePlugin"]


def test_gpu_operator_refuses_a_chart_whose_cdi_mode_uses_the_variable() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"gpuOperator": {"version": "v25.3.4"}})
    (problem,) = [str(p) for p in excinfo.value.problems]
    assert problem.startswith("gpu-cluster:gpuOperator.version: got 'v25.3.4'; chart versions")
    assert f"toolkit.env.{ENVVAR_WHEN_UNPRIVILEGED}" in problem
    told = {"version": "v25.3.4", "toolkit": {"env": {ENVVAR_WHEN_UNPRIVILEGED: "true"}}}
    assert GpuOperatorSettings.model_validate(told).version == "v25.3.4"


def test_gpu_operator_explicit_toolkit_env_overrides_the_isolation() -> None:
    values = _values(_make_gpu_operator(toolkit={"env": {ENVVAR_WHEN_UNPRIVILEGED: "true"}}))
    assert [e for e in values["toolkit"]["env"] if e["name"] == ENVVAR_WHEN_UNPRIVILEGED] == [
        {"name": ENVVAR_WHEN_UNPRIVILEGED, "value": "true"}
    ]


def test_gpu_operator_lives_in_its_own_privileged_namespace() -> None:
    recording = _make_gpu_operator(namespace="nvidia-gpu")
    (namespace,) = recording.of_type("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["name"] == "nvidia-gpu"
    assert (
        namespace.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    )
    release = _release(recording)
    assert release.inputs["namespace"] == "nvidia-gpu"
    assert namespace.urn in release.dependencies


def test_gpu_operator_without_time_slicing_has_no_device_plugin_config() -> None:
    recording = _make_gpu_operator()
    assert recording.of_type("kubernetes:core/v1:ConfigMap") == []
    assert "config" not in _values(recording)["devicePlugin"]


def test_gpu_operator_time_slicing_config_map_is_named_in_the_values() -> None:
    recording = _make_gpu_operator(
        device_plugin={"time_slicing": TimeSlicing(replicas=4)}, mig={"strategy": "none"}
    )
    (config_map,) = recording.of_type("kubernetes:core/v1:ConfigMap")
    document = yaml.safe_load(config_map.inputs["data"]["any"])
    assert document["flags"] == {"migStrategy": "none"}
    assert document["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]
    release = _release(recording)
    assert release.inputs["values"]["devicePlugin"]["config"] == {
        "create": False,
        "name": config_map.inputs["metadata"]["name"],
        "default": "any",
    }
    assert config_map.urn in release.dependencies


def test_gpu_operator_mig_dcgm_nfd_and_crd_upgrade_values() -> None:
    values = _values(
        _make_gpu_operator(
            mig={"strategy": "mixed"},
            mig_manager={"enabled": False},
            dcgm_exporter={"enabled": False},
            nfd={"enabled": False},
            operator={"upgradeCRD": False},
        )
    )
    assert values["mig"] == {"strategy": "mixed"}
    assert values["migManager"] == {"enabled": False}
    assert values["dcgmExporter"]["enabled"] is False
    assert values["nfd"] == {"enabled": False}
    assert values["operator"] == {"upgradeCRD": False}


def test_gpu_operator_never_enables_the_charts_dcgm_service_monitor() -> None:
    values = _values(_make_gpu_operator())
    assert values["dcgmExporter"] == {"enabled": True, "serviceMonitor": {"enabled": False}}


def test_gpu_operator_free_form_values_are_merged_last() -> None:
    values = _values(
        _make_gpu_operator(
            driver={"enabled": True},
            values={
                "driver": {"version": "580.95.05"},
                "toolkit": {"enabled": False},
                "cdi": {"enabled": True},
            },
        )
    )
    assert values["driver"] == {"enabled": True, "version": "580.95.05"}
    assert values["toolkit"]["enabled"] is False
    assert values["cdi"] == {"enabled": True}


def test_gpu_operator_dcgm_target_follows_the_switch() -> None:
    targets: list[Any] = []

    def build(enabled: bool) -> None:
        access = component_access()
        op = GpuOperator(
            "op",
            GpuOperatorArgs(
                access=access,
                pool_toleration=Taint().toleration(),
                dcgm_exporter=Switch(enabled=enabled),
            ),
        )
        targets.append(op.dcgm_target)

    register(lambda: build(True))
    register(lambda: build(False))
    assert targets[0] is not None
    assert (dict(targets[0].selector), targets[0].port) == (
        {"app": "nvidia-dcgm-exporter"},
        "gpu-metrics",
    )
    assert targets[1] is None


@pytest.mark.parametrize(
    ("base", "override", "merged"),
    [
        ({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}, {"a": {"b": 1, "c": 3}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": {"b": 1}}, {"a": None}, {"a": None}),
    ],
)
def test_gpu_operator_deep_merge_merges_objects_and_replaces_the_rest(
    base: dict[str, Any], override: dict[str, Any], merged: dict[str, Any]
) -> None:
    assert deep_merge(base, override) == merged
    assert base != merged  # the inputs are not modified


def test_gpu_operator_upgrades_its_crds_the_way_nvidia_documents() -> None:
    """The chart's pre-upgrade hook applies the new CRDs; the release's manifests are not
    validated against the old ones first (`helm upgrade --disable-openapi-validation`)."""
    release = _release(_make_gpu_operator())
    assert release.inputs["values"]["operator"]["upgradeCRD"] is True
    assert release.inputs["disableOpenapiValidation"] is True


def test_gpu_operator_without_crd_upgrades_keeps_openapi_validation() -> None:
    release = _release(_make_gpu_operator(operator={"upgradeCRD": False}))
    assert release.inputs["values"]["operator"]["upgradeCRD"] is False
    assert release.inputs["disableOpenapiValidation"] is False


# The GPU resources pods ask for, told by the settings (the gate and scheduler take them).


def _gpu_resources(**settings: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    told = GpuOperatorSettings.model_validate({"enabled": True, **settings}).gpu_resources()
    return told.names, told.prefixes


def test_gpu_operator_whole_gpus_by_default() -> None:
    assert _gpu_resources() == (("nvidia.com/gpu",), ())


def test_gpu_operator_time_slicing_renamed_advertises_gpu_shared() -> None:
    sharing = {"timeSlicing": {"replicas": 4, "renameByDefault": True}}
    assert _gpu_resources(devicePlugin=sharing, mig={"strategy": "none"}) == (
        ("nvidia.com/gpu", "nvidia.com/gpu.shared"),
        (),
    )


def test_gpu_operator_time_slicing_without_rename_keeps_the_name() -> None:
    sharing = {"timeSlicing": {"replicas": 4}}
    assert _gpu_resources(devicePlugin=sharing) == (("nvidia.com/gpu",), ())


def test_gpu_operator_mig_mixed_advertises_one_resource_per_profile() -> None:
    assert _gpu_resources(mig={"strategy": "mixed"}) == (("nvidia.com/gpu",), ("nvidia.com/mig-",))


def test_gpu_operator_disabled_advertises_only_the_plain_name() -> None:
    sharing = {"timeSlicing": {"replicas": 4, "renameByDefault": True}}
    told = GpuOperatorSettings.model_validate({"devicePlugin": sharing}).gpu_resources()
    assert (told.names, told.prefixes) == (("nvidia.com/gpu",), ())


@pytest.mark.parametrize(
    ("rename", "shared"),
    [(True, (("nvidia.com/gpu.shared", 4),)), (False, (("nvidia.com/gpu", 4),))],
)
def test_gpu_operator_time_slicing_tells_how_many_units_make_a_gpu(
    rename: bool, shared: tuple[tuple[str, int], ...]
) -> None:
    """The time-sliced resource (renamed or not) and its replicas: the fragmentation-aware
    scheduler counts one unit as 1/replicas of a GPU."""
    sharing = {"timeSlicing": {"replicas": 4, "renameByDefault": rename}}
    told = GpuOperatorSettings.model_validate({"enabled": True, "devicePlugin": sharing})
    assert told.gpu_resources().shared == shared
    assert GpuOperatorSettings.model_validate({"enabled": True}).gpu_resources().shared == ()


# The operator's own pods, which the admission gate lets through.


def test_gpu_operator_own_pods_are_its_validators_and_its_daemonsets_in_its_namespace() -> None:
    settings = GpuOperatorSettings.model_validate({"enabled": True, "namespace": "nvidia-gpu"})
    assert settings.operator_pods() == OperatorPods(
        namespace="nvidia-gpu",
        creators=("system:serviceaccount:nvidia-gpu:nvidia-operator-validator",),
        daemonset_controllers=(
            "system:kube-controller-manager",
            "system:serviceaccount:kube-system:daemon-set-controller",
        ),
    )


def test_gpu_operator_disabled_has_no_pods_of_its_own() -> None:
    assert GpuOperatorSettings.model_validate({"namespace": "nvidia-gpu"}).operator_pods() is None


DRA: dict[str, Any] = {"allocation": "dra", "version": "v26.7.1"}


def _device_classes(**overrides: Any) -> list[str]:
    """The device_classes output of a GpuOperator built with `overrides`."""
    seen: list[str] = []

    def build() -> None:
        access = component_access()
        op = GpuOperator(
            "op", GpuOperatorArgs(access=access, pool_toleration=Taint().toleration(), **overrides)
        )
        op.device_classes.apply(seen.extend)

    register(build)
    return seen


def test_gpu_operator_device_classes_are_gpuclusters_in_dra_mode() -> None:
    assert _device_classes(**DRA) == ["gpu.nvidia.com", "mig.nvidia.com"]


def test_gpu_operator_device_classes_are_none_with_the_device_plugin() -> None:
    assert _device_classes() == []


def test_gpu_operator_dra_release_gets_gpucluster_values() -> None:
    values = _values(_make_gpu_operator(**DRA))
    assert (values["gpuCluster"], values["clusterPolicy"]) == (
        {"deployCR": True},
        {"deployCR": False},
    )
    assert values["devicePlugin"] == {"enabled": False}
    assert values["daemonsets"]["tolerations"] == [Taint().toleration()]


def test_gpu_operator_dra_creates_no_time_slicing_config_map() -> None:
    recording = _make_gpu_operator(**DRA)
    assert recording.of_type("kubernetes:core/v1:ConfigMap") == []


def test_gpu_operator_dra_refused_beside_time_slicing_before_any_resource() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(
            {
                "gpuOperator": {
                    **DRA,
                    "enabled": True,
                    "devicePlugin": {"timeSlicing": {"replicas": 2}},
                }
            }
        )
    (problem,) = [str(p) for p in excinfo.value.problems]
    assert problem.startswith("gpu-cluster:gpuOperator.devicePlugin.timeSlicing: got ")
