"""What counts as a GPU: the one definition the binpack scheduler, the admission gate and the
monitoring share.

A GPU resource is one of the names a GPU device plugin gives its GPUs, whole or shared
(GPU_NAMES), a MIG profile (GPU_PREFIXES), or a name the stack config adds
(`scheduler.gpuResources`, validated by GPU_RESOURCE_NAME). Being in a GPU vendor's domain is
not enough: NVIDIA's Network Operator advertises NICs as nvidia.com resources too (the SR-IOV
network device plugin's nvidia.com/hostdev, the SR-IOV Network Operator's nvidia.com/<policy>,
the RDMA shared device plugin's resources when their prefix is set to nvidia.com), and a pod
that asks only for one of those is no GPU pod: the gate leaves it alone and the scheduler does
not weigh it as a GPU.

The GPU Operator's settings say what its device plugin advertises (GpuResources: names, MIG
prefixes, time-sliced replicas); BinpackSchedulerSettings.gpu_resources_with() adds the
configured names, and that one GpuResources is what the scheduler weighs, the gate routes and
the monitoring counts, each on top of the names below.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from components.kubernetes_names import extended_resource_problem
from components.settings import problem, text

# How GPUs reach pods: the device plugin's extended resources (the GPU Operator's ClusterPolicy),
# or the DRA Driver for NVIDIA GPUs publishing them in ResourceSlices (its GPUCluster). One model
# per cluster.
Allocation = Literal["device-plugin", "dra"]
# The DeviceClasses the GPU Operator's GPUCluster installs: whole GPUs and MIG devices the MIG layout already made
# (each profile a device of mig.nvidia.com, chosen in the claim, so no MIG strategy applies).
# vfio.gpu.nvidia.com needs the driver's alpha PassthroughSupport gate and is left out.
GPU_DEVICE_CLASS = "gpu.nvidia.com"
# The driver whose node-local ResourceSlices publish the GPUs (their spec.driver; the device
# attributes `type` gpu|mig and `profile` are in its attribute domain).
DRA_DRIVER = "gpu.nvidia.com"
MIG_DEVICE_CLASS = "mig.nvidia.com"
DRA_DEVICE_CLASSES = (GPU_DEVICE_CLASS, MIG_DEVICE_CLASS)
# With DRAExtendedResource (beta and on by default in v1.36, GA in v1.37) a container may ask
# for `deviceclass.resource.kubernetes.io/<class>`, the implicit extended resource name of a
# DeviceClass without spec.extendedResourceName (GPUCluster's set none: nvidia.com/gpu is not
# theirs). kube-scheduler's DynamicResources plugin allocates it from the ResourceSlices.
# Ref: k8s.io/api@v0.37.2 resource/v1/types.go (ResourceDeviceClassPrefix)
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"


def allocation_device_classes(allocation: Allocation) -> tuple[str, ...]:
    """The DeviceClasses whose claims are GPU requests with `allocation` (none with the device
    plugin)."""
    return DRA_DEVICE_CLASSES if allocation == "dra" else ()


# NICs NVIDIA's Network Operator advertises in the nvidia.com domain, none of them a GPU: the
# SR-IOV network device plugin's resources (NicClusterPolicy sriovDevicePlugin, resourcePrefix
# nvidia.com: nvidia.com/hostdev), the SR-IOV Network Operator's (its chart's resourcePrefix
# nvidia.com: nvidia.com/<policy resourceName>), the RDMA shared device plugin's
# (rdma/<resourceName>, or nvidia.com/rdma_shared_device_a with a configList resourcePrefix).
# Ref: https://github.com/Mellanox/network-operator/blob/master/example/crs/mellanox.com_v1alpha1_nicclusterpolicy_cr-full.yaml
# Ref: https://github.com/Mellanox/network-operator/blob/master/deployment/network-operator/values.yaml
# Ref: https://github.com/Mellanox/k8s-rdma-shared-dev-plugin/blob/master/pkg/resources/resources_manager.go

# Domains whose resources a device plugin advertises and keeps up to date on each node
# (NVIDIA's GPUs and NICs, AMD, Intel). Advertising one of them by hand would fight the device
# plugin and lie to the scheduler about devices; which of them are GPUs is below.
# Ref: https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/
DEVICE_PLUGIN_DOMAINS = ("nvidia.com", "amd.com", "gpu.intel.com")

# Whole NVIDIA GPUs (MIG devices too under mig.strategy single).
WHOLE_GPU = "nvidia.com/gpu"
# Time-sliced (or MPS) NVIDIA GPUs with renameByDefault: `<resource>.shared`.
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html
SHARED_GPU = "nvidia.com/gpu.shared"
# One resource per MIG profile under mig.strategy mixed (nvidia.com/mig-1g.5gb, and
# nvidia.com/mig-1g.5gb.shared when shared), so matched by prefix.
# Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html
MIG_PREFIX = "nvidia.com/mig-"
# AMD's device plugin: every GPU (or partition, resource_naming_strategy single) as amd.com/gpu.
# Under resource_naming_strategy mixed, partitions are amd.com/<compute>_<memory>
# (amd.com/cpx_nps4): add those names with scheduler.gpuResources.
# Ref: https://github.com/ROCm/k8s-device-plugin/blob/master/docs/user-guide/configuration.md
AMD_GPU = "amd.com/gpu"
# Intel's GPU plugin: a GPU of the i915 or the xe kernel driver. Its *_monitoring resources
# (every GPU of the node, for a metrics exporter) are not GPUs a pod is scheduled for.
# Ref: https://github.com/intel/intel-device-plugins-for-kubernetes/blob/main/cmd/gpu_plugin/README.md
INTEL_GPUS = ("gpu.intel.com/i915", "gpu.intel.com/xe")

GPU_NAMES: tuple[str, ...] = (WHOLE_GPU, SHARED_GPU, AMD_GPU, *INTEL_GPUS)
"""Every GPU resource known by name, whatever the stack config says."""
GPU_PREFIXES: tuple[str, ...] = (MIG_PREFIX,)
"""Prefixes of the GPU resources whose names cannot be listed in advance."""

GPU_RESOURCES_SHOWN = ", ".join([*GPU_NAMES, *(f"{p}<profile>" for p in GPU_PREFIXES)])
"""The built-in GPU resources as messages name them."""


@dataclass(frozen=True, kw_only=True)
class GpuResources:
    """The extended resources GPU pods ask for under the operator's settings (and the names
    the stack config adds)."""

    names: tuple[str, ...]
    """Exact resource names (gated, weighted by the binpack scheduler)."""
    prefixes: tuple[str, ...]
    """Name prefixes of resources that cannot be listed in advance (MIG profiles): gated."""
    shared: tuple[tuple[str, int], ...] = ()
    """(name, replicas) of each time-sliced resource: one of its units is 1/replicas of a GPU
    (the fragmentation-aware scheduler counts it so)."""

    def adding(self, names: Iterable[str]) -> GpuResources:
        """These resources and `names` (each name once, in order)."""
        return GpuResources(
            names=tuple(dict.fromkeys([*self.names, *names])),
            prefixes=self.prefixes,
            shared=self.shared,
        )


def is_gpu_resource(name: str, extra: GpuResources | None = None) -> bool:
    """A GPU resource: one of GPU_NAMES or GPU_PREFIXES, or one of `extra`'s names or prefixes."""
    if name in GPU_NAMES or name.startswith(GPU_PREFIXES):
        return True
    return extra is not None and (name in extra.names or name.startswith(extra.prefixes))


def gated_names(names: Iterable[str]) -> list[str]:
    """The exact names the gate matches: every GPU_NAMES entry and `names`, sorted, once each."""
    return sorted({*GPU_NAMES, *names})


def gated_prefixes(prefixes: Iterable[str]) -> list[str]:
    """The prefixes the gate matches: GPU_PREFIXES and `prefixes`, sorted, once each."""
    return sorted({*GPU_PREFIXES, *(p for p in prefixes if p)})


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes' rule for an extended resource name (kubernetes_names.extended_resource_problem)."""
    return extended_resource_problem(name) is None


def _added_gpu_resource(name: str) -> bool:
    if not is_extended_resource_name(name):
        return False
    if is_gpu_resource(name):
        raise problem(f"already a GPU resource ({GPU_RESOURCES_SHOWN}); leave it out")
    return True


GPU_RESOURCE_NAME = text(
    _added_gpu_resource,
    "expected an extended resource name, domain/name outside kubernetes.io (e.g. "
    f"amd.com/cpx_nps4), that is not already a GPU resource ({GPU_RESOURCES_SHOWN})",
)
"""A name the stack config adds to the GPU resources."""
