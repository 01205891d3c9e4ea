"""Local cluster harness for integration tests, one module per part, envtest-style.

- :mod:`.tools`: where the binaries are (``$GPU_CLUSTER_TOOLS_BIN`` or ``.tools/bin``) and the
  check that the pinned ones are the release ``tools/build-tools.sh`` pins;
- :mod:`.child_process`: a child process in its own process group, the readiness wait;
- :mod:`.certs`, :mod:`.kubeconfig`: the throw-away PKI and the admin kubeconfig;
- :mod:`.etcd`, :mod:`.apiserver`, :mod:`.scheduler`, :mod:`.controller_manager`,
  :mod:`.kwok`: one process each;
- :mod:`.controlplane` (:class:`LocalControlPlane`: etcd + kube-apiserver) and
  :mod:`.cluster` (``LocalCluster``: + controller manager, scheduler, kwok) start them in
  order and roll a partial start back.

This package has no pytest dependency; the pytest fixtures live in
``tests/integration/conftest.py``.
"""

from .child_process import ControlPlaneError, ManagedProcess, free_port
from .controlplane import LocalControlPlane
from .scheduler import SchedulerHandle
from .tools import (
    CONTROL_PLANE_TOOLS,
    TOOLS_BIN_ENV,
    ToolNotFoundError,
    ToolVersionError,
    find_tool,
    missing_tools,
    require_tool,
    tools_bin,
)

__all__ = [
    "CONTROL_PLANE_TOOLS",
    "TOOLS_BIN_ENV",
    "ControlPlaneError",
    "LocalControlPlane",
    "ManagedProcess",
    "SchedulerHandle",
    "ToolNotFoundError",
    "ToolVersionError",
    "find_tool",
    "free_port",
    "missing_tools",
    "require_tool",
    "tools_bin",
]
