"""The layers of gpu-cluster, one ComponentResource per module."""

from components.cluster_access import ClusterAccess
from components.extended_resource_node import ExtendedResourceNode, ExtendedResourceNodeArgs
from components.tainted_gpu_pool import Taint, TaintedGpuPool, TaintedGpuPoolArgs

__all__ = [
    "ClusterAccess",
    "ExtendedResourceNode",
    "ExtendedResourceNodeArgs",
    "Taint",
    "TaintedGpuPool",
    "TaintedGpuPoolArgs",
]
