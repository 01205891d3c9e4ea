"""What layers hand each other: each value is made by one layer and read by another, and they
meet only in __main__.py. A layer folder imports the shared modules (components/*.py) and
itself, never another layer (tests/test_layers.py), so whatever crosses from one to another is
typed here.

- OperatorPods: GpuOperator's own pods, which OpaGate lets through.
- DcgmTarget: where GpuOperator's dcgm-exporter serves, which MonitoringStack scrapes.
- ControlPlaneNeeds: what BinpackScheduler (gangs) needs of the API servers, which
  ControlPlaneFeatures enables.

The rest that crosses is plain values: scheduler and namespace names, the pool's nodes, taint
and toleration (TaintedGpuPool's outputs), and the GPU vocabulary of components/gpu_resources.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from components.kubernetes_names import DAEMONSET_CONTROLLERS

if TYPE_CHECKING:
    import pulumi


@dataclass(frozen=True, kw_only=True)
class OperatorPods:
    """The pods the GPU Operator itself makes, as admission sees them: created in its own
    namespace by its validator's ServiceAccount, or by the DaemonSet controller for one of
    the namespace's DaemonSets (the operands). Nobody else's pods in that namespace."""

    namespace: str
    """The operator's namespace."""
    creators: tuple[str, ...]
    """User names whose pod creations in `namespace` are the operator's (its validator)."""
    daemonset_controllers: tuple[str, ...] = DAEMONSET_CONTROLLERS
    """User names that create DaemonSet pods; such a pod of `namespace` is an operand."""


@dataclass(frozen=True, kw_only=True)
class DcgmTarget:
    """Where the operator's dcgm-exporter can be scraped (for exactly one ServiceMonitor)."""

    namespace: pulumi.Input[str]
    """Namespace of the dcgm-exporter Service (resolves once the release is deployed)."""
    selector: Mapping[str, str]
    """Labels of the dcgm-exporter Service."""
    port: str
    """Name of the Service port serving /metrics."""


@dataclass(frozen=True, kw_only=True)
class ControlPlaneNeeds:
    """What another layer needs of the control plane: feature gates (API server, controller
    manager, scheduler) and API versions (--runtime-config), with the key that needs them."""

    key: str
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    runtime_config: Mapping[str, bool] = field(default_factory=dict)


NO_NEEDS = ControlPlaneNeeds(key="")
