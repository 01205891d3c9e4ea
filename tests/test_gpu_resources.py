"""What counts as a GPU (components/gpu_resources.py), as tables: resource names in, verdicts
out; and the config key that adds names (scheduler.gpuResources) with its messages."""

from __future__ import annotations

from typing import Any

import pytest

from components.gpu_resources import (
    GpuResources,
    gated_names,
    gated_prefixes,
    is_extended_resource_name,
    is_gpu_resource,
)
from stack_config import ConfigError, parse_stack_config

# name -> a GPU whatever the config says. The NICs are what NVIDIA's Network Operator
# advertises: the SR-IOV network device plugin's nvidia.com/hostdev (NicClusterPolicy's
# sriovDevicePlugin, resourcePrefix nvidia.com), the SR-IOV Network Operator's policies
# (resourcePrefix nvidia.com), the RDMA shared device plugin's (prefix rdma, or nvidia.com when
# its resourcePrefix says so).
BUILT_IN = {
    "nvidia.com/gpu": True,
    "nvidia.com/gpu.shared": True,
    "nvidia.com/mig-1g.5gb": True,
    "nvidia.com/mig-1c.2g.20gb": True,
    "nvidia.com/mig-3g.40gb.shared": True,
    "amd.com/gpu": True,
    "gpu.intel.com/i915": True,
    "gpu.intel.com/xe": True,
    "nvidia.com/hostdev": False,
    "nvidia.com/rdma_shared_device_a": False,
    "rdma/rdma_shared_device_a": False,
    "nvidia.com/sriovlegacy": False,
    "nvidia.com/sriov_rdma_vf": False,
    "nvidia.com/mlnxnics": False,
    "nvidia.com/gpu-nic": False,
    "nvidia.com/gpus": False,
    "gpu.intel.com/i915_monitoring": False,
    "gpu.intel.com/xe_monitoring": False,
    "gpu.intel.com/millicores": False,
    "amd.com/cpx_nps4": False,
    "amd.com/nic": False,
    "example.com/dongle": False,
    "cpu": False,
    "memory": False,
}


@pytest.mark.parametrize(("name", "gpu"), list(BUILT_IN.items()), ids=list(BUILT_IN))
def test_gpu_resources_counts_exactly_the_gpus(name: str, gpu: bool) -> None:
    assert is_gpu_resource(name) is gpu


@pytest.mark.parametrize(("name", "gpu"), list(BUILT_IN.items()), ids=list(BUILT_IN))
def test_gpu_resources_gate_matches_exactly_the_gpus(name: str, gpu: bool) -> None:
    names, prefixes = gated_names([]), gated_prefixes([])
    assert (name in names or name.startswith(tuple(prefixes))) is gpu


# (names, prefixes) added -> (name, a GPU).
ADDED = [
    ((("amd.com/cpx_nps4",), ()), ("amd.com/cpx_nps4", True)),
    ((("amd.com/cpx_nps4",), ()), ("amd.com/spx_nps1", False)),
    (((), ("example.com/vgpu-",)), ("example.com/vgpu-2q", True)),
    ((("example.com/vgpu",), ()), ("nvidia.com/hostdev", False)),
]


@pytest.mark.parametrize(("added", "verdict"), ADDED)
def test_gpu_resources_adds_what_the_settings_name(
    added: tuple[tuple[str, ...], tuple[str, ...]], verdict: tuple[str, bool]
) -> None:
    names, prefixes = added
    name, gpu = verdict
    assert is_gpu_resource(name, GpuResources(names=names, prefixes=prefixes)) is gpu


def test_gpu_resources_gate_lists_are_sorted_and_once_each() -> None:
    assert gated_names(["example.com/dongle", "nvidia.com/gpu"]) == [
        "amd.com/gpu",
        "example.com/dongle",
        "gpu.intel.com/i915",
        "gpu.intel.com/xe",
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
    ]
    assert gated_prefixes(["nvidia.com/mig-", "", "example.com/vgpu-"]) == [
        "example.com/vgpu-",
        "nvidia.com/mig-",
    ]


def test_gpu_resources_adding_keeps_the_order_and_each_name_once() -> None:
    advertised = GpuResources(
        names=("nvidia.com/gpu", "nvidia.com/gpu.shared"),
        prefixes=("nvidia.com/mig-",),
        shared=(("nvidia.com/gpu.shared", 4),),
    )
    assert advertised.adding(["amd.com/cpx_nps4", "nvidia.com/gpu"]) == GpuResources(
        names=("nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/cpx_nps4"),
        prefixes=("nvidia.com/mig-",),
        shared=(("nvidia.com/gpu.shared", 4),),
    )


EXTENDED = {
    "example.com/vgpu": True,
    "amd.com/cpx_nps4": True,
    "nvidia.com/a100-shared": True,
    "vgpu": False,
    "kubernetes.io/vgpu": False,
    "node.kubernetes.io/vgpu": False,
    "requests.example.com/vgpu": False,
    "example.com/": False,
    "Example.com/vgpu": False,
    "example.com/" + "v" * 64: False,
    # requests.<domain> must still be a DNS subdomain (253 characters at most).
    "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 52 + "/x": True,
    "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 53 + "/x": False,
}


@pytest.mark.parametrize(("name", "ok"), list(EXTENDED.items()), ids=range(len(EXTENDED)))
def test_gpu_resources_extended_resource_name_is_kubernetes_rule(name: str, ok: bool) -> None:
    assert is_extended_resource_name(name) is ok


# ------------------------------------------------------------------ scheduler.gpuResources


def _problems(**scheduler: Any) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"scheduler": scheduler})
    return [str(p) for p in excinfo.value.problems]


KNOWN = (
    "nvidia.com/gpu, nvidia.com/gpu.shared, amd.com/gpu, gpu.intel.com/i915, gpu.intel.com/xe, "
    "nvidia.com/mig-<profile>"
)


def test_gpu_resources_setting_adds_names_to_the_profile() -> None:
    config = parse_stack_config({"scheduler": {"gpuResources": ["amd.com/cpx_nps4"]}})
    assert config.scheduler.gpu_resources == ("amd.com/cpx_nps4",)
    profile = config.scheduler.profile
    assert [(w.name, w.weight) for w in profile.resources][-1] == ("amd.com/cpx_nps4", 100)


@pytest.mark.parametrize("name", ["vgpu", "kubernetes.io/vgpu", "requests.example.com/vgpu"])
def test_gpu_resources_setting_refuses_what_is_no_extended_resource(name: str) -> None:
    assert _problems(gpuResources=[name]) == [
        f"gpu-cluster:scheduler.gpuResources[0]: got {name!r}; expected an extended resource "
        "name, domain/name outside kubernetes.io (e.g. amd.com/cpx_nps4), that is not already "
        f"a GPU resource ({KNOWN})"
    ]


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "gpu.intel.com/xe"])
def test_gpu_resources_setting_refuses_a_built_in_gpu(name: str) -> None:
    assert _problems(gpuResources=["example.com/vgpu", name]) == [
        f"gpu-cluster:scheduler.gpuResources[1]: got {name!r}; already a GPU resource "
        f"({KNOWN}); leave it out"
    ]


def test_gpu_resources_setting_refuses_a_name_twice() -> None:
    assert _problems(gpuResources=["example.com/vgpu", "example.com/vgpu"]) == [
        "gpu-cluster:scheduler.gpuResources[1]: got 'example.com/vgpu'; each resource at most once"
    ]


def test_gpu_resources_setting_refuses_more_than_the_plugin_models() -> None:
    names = [f"example.com/vgpu-{i}" for i in range(9)]
    assert _problems(gpuResources=names) == [
        f"gpu-cluster:scheduler.gpuResources: got {names!r}; expected at most 8 names (the "
        "fragmentation scheduler models 16 GPU resources, the GPU Operator's and MIG profiles "
        "included)"
    ]


def test_gpu_resources_weights_without_a_gpu_are_refused_a_nic_included() -> None:
    weights = {"nvidia.com/hostdev": 100, "cpu": 1}
    assert _problems(resourceWeights=weights) == [
        f"gpu-cluster:scheduler.resourceWeights: got {weights!r}; expected at least one GPU "
        f"resource ({KNOWN}, or one of scheduler.gpuResources); without one the profile does "
        "not bin-pack GPU pods"
    ]


def test_gpu_resources_weights_on_an_added_gpu_are_accepted() -> None:
    config = parse_stack_config(
        {
            "scheduler": {
                "gpuResources": ["example.com/vgpu"],
                "resourceWeights": {"example.com/vgpu": 50, "cpu": 1},
            }
        }
    )
    assert config.scheduler.profile.gpu_resource_names == ("example.com/vgpu",)
