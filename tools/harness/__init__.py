"""Local control-plane harness for integration tests (etcd, kube-apiserver, kube-scheduler).

The binaries are built by ``tools/build-tools.sh`` into ``.tools/bin`` (or
``$GPU_CLUSTER_TOOLS_BIN``). This package has no pytest dependency; the pytest
fixtures live in ``tests/integration/conftest.py``.
"""

from .controlplane import (
    CONTROL_PLANE_TOOLS,
    ControlPlaneError,
    LocalControlPlane,
    ManagedProcess,
    SchedulerHandle,
    ToolNotFoundError,
    find_tool,
    free_port,
    missing_tools,
    require_tool,
    tools_bin,
)

__all__ = [
    "CONTROL_PLANE_TOOLS",
    "ControlPlaneError",
    "LocalControlPlane",
    "ManagedProcess",
    "SchedulerHandle",
    "ToolNotFoundError",
    "find_tool",
    "free_port",
    "missing_tools",
    "require_tool",
    "tools_bin",
]
