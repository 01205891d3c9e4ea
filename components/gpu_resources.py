"""What counts as a GPU: the one definition the binpack scheduler and the admission gate share.

A GPU resource is any extended resource in a GPU device plugin's domain (nvidia.com/gpu,
nvidia.com/gpu.shared, nvidia.com/mig-1g.5gb, amd.com/gpu, gpu.intel.com/i915, ...). The
scheduler weighs and counts these as GPUs (BinpackScheduler); the gate keeps every pod that
asks for one on that scheduler (OpaGate: the prefixes below are part of its data whatever the
GPU Operator advertises). The GPU Operator's settings add what its device plugin advertises
(GpuResources: names, MIG prefixes, time-sliced replicas), which the domains already cover.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Domains whose resources a device plugin advertises and keeps up to date on each node
# (NVIDIA: nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*; AMD; Intel). Advertising
# one of them by hand would fight the device plugin and lie to the scheduler about devices.
# Ref: https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/
DEVICE_PLUGIN_DOMAINS = ("nvidia.com", "amd.com", "gpu.intel.com")

# Every resource of these domains is a GPU (or a slice of one).
GPU_RESOURCE_PREFIXES: tuple[str, ...] = tuple(f"{domain}/" for domain in DEVICE_PLUGIN_DOMAINS)
# Whole NVIDIA GPUs: named as well, so a list of names is never empty.
WHOLE_GPU = "nvidia.com/gpu"


@dataclass(frozen=True, kw_only=True)
class GpuResources:
    """The extended resources GPU pods ask for under the operator's settings."""

    names: tuple[str, ...]
    """Exact resource names (gated, weighted by the binpack scheduler)."""
    prefixes: tuple[str, ...]
    """Name prefixes of resources that cannot be listed in advance (MIG profiles): gated."""
    shared: tuple[tuple[str, int], ...] = ()
    """(name, replicas) of each time-sliced resource: one of its units is 1/replicas of a GPU
    (the fragmentation-aware scheduler counts it so)."""


def is_gpu_resource(name: str, extra: GpuResources | None = None) -> bool:
    """A GPU resource: in a GPU device plugin's domain, or one of `extra`'s names or prefixes."""
    if name.startswith(GPU_RESOURCE_PREFIXES):
        return True
    return extra is not None and (name in extra.names or name.startswith(extra.prefixes))


def gated_names(names: Iterable[str]) -> list[str]:
    """The exact names the gate matches: `names` and whole NVIDIA GPUs, sorted, once each."""
    return sorted({WHOLE_GPU, *names})


def gated_prefixes(prefixes: Iterable[str]) -> list[str]:
    """The prefixes the gate matches: every GPU domain and `prefixes`, sorted, once each."""
    return sorted({*GPU_RESOURCE_PREFIXES, *(p for p in prefixes if p)})
