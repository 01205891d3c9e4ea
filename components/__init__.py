"""The layers of gpu-cluster, one folder each (components/<layer>/), and what they share."""

from components.binpack_scheduler.component import BinpackScheduler, BinpackSchedulerArgs
from components.binpack_scheduler.settings import ResourceWeight, SchedulerProfile, ShapePoint
from components.cluster_access import ClusterAccess
from components.control_plane_features.component import (
    ControlPlaneFeatures,
    ControlPlaneFeaturesArgs,
    RemoteHost,
    SshAccess,
)
from components.extended_resource_nodes.component import (
    ExtendedResourceNodes,
    ExtendedResourceNodesArgs,
)
from components.gpu_operator.component import GpuOperator, GpuOperatorArgs
from components.gpu_operator.settings import TimeSlicing
from components.gpu_priority_classes.component import GpuPriorityClasses, GpuPriorityClassesArgs
from components.handoffs import DcgmTarget
from components.monitoring_stack.component import MonitoringStack, MonitoringStackArgs
from components.opa_gate.component import OpaGate, OpaGateArgs
from components.tainted_gpu_pool.component import TaintedGpuPool, TaintedGpuPoolArgs
from components.tainted_gpu_pool.settings import Taint

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
__all__ += ["GpuPriorityClasses", "GpuPriorityClassesArgs"]
