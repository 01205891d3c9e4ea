"""The layers of gpu-cluster, one ComponentResource per module."""

from components.binpack_scheduler import (
    BinpackScheduler,
    BinpackSchedulerArgs,
    ResourceWeight,
    SchedulerProfile,
    ShapePoint,
)
from components.cluster_access import ClusterAccess
from components.extended_resource_node import ExtendedResourceNode, ExtendedResourceNodeArgs
from components.opa_gate import OpaGate, OpaGateArgs
from components.tainted_gpu_pool import Taint, TaintedGpuPool, TaintedGpuPoolArgs

__all__ = [
    "BinpackScheduler",
    "BinpackSchedulerArgs",
    "ClusterAccess",
    "ExtendedResourceNode",
    "ExtendedResourceNodeArgs",
    "OpaGate",
    "OpaGateArgs",
    "ResourceWeight",
    "SchedulerProfile",
    "ShapePoint",
    "Taint",
    "TaintedGpuPool",
    "TaintedGpuPoolArgs",
]
