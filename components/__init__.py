"""The layers of gpu-cluster, one ComponentResource per module."""

from components.binpack_scheduler import BinpackScheduler, BinpackSchedulerArgs
from components.binpack_scheduler_settings import ResourceWeight, SchedulerProfile, ShapePoint
from components.cluster_access import ClusterAccess
from components.control_plane_features import (
    ControlPlaneFeatures,
    ControlPlaneFeaturesArgs,
    RemoteHost,
    SshAccess,
)
from components.extended_resource_nodes import ExtendedResourceNodes, ExtendedResourceNodesArgs
from components.gpu_operator import GpuOperator, GpuOperatorArgs
from components.gpu_operator_settings import DcgmTarget, TimeSlicing
from components.monitoring_stack import MonitoringStack, MonitoringStackArgs
from components.opa_gate import OpaGate, OpaGateArgs
from components.tainted_gpu_pool import Taint, TaintedGpuPool, TaintedGpuPoolArgs

__all__ = [
    "BinpackScheduler",
    "BinpackSchedulerArgs",
    "ClusterAccess",
    "ExtendedResourceNodes",
    "ExtendedResourceNodesArgs",
    "OpaGate",
    "OpaGateArgs",
    "ResourceWeight",
    "SchedulerProfile",
    "ShapePoint",
    "Taint",
    "TaintedGpuPool",
    "TaintedGpuPoolArgs",
]
__all__ += ["ControlPlaneFeatures", "ControlPlaneFeaturesArgs", "RemoteHost", "SshAccess"]
__all__ += ["DcgmTarget", "GpuOperator", "GpuOperatorArgs", "TimeSlicing"]
__all__ += ["MonitoringStack", "MonitoringStackArgs"]
